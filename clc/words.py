# SPDX-License-Identifier: Apache-2.0
"""Words every message and report clc writes shares: counts ("1 context", "2 contexts") and
kinds of file ("a FIFO (named pipe)")."""

import stat

__all__ = ["count", "file_kind", "FILE_KINDS"]


def count(n, word, plural=None):
    """n and word, in the plural unless n is 1 (plural: the plural where it is not word + s)."""
    return f"{n} {word if n == 1 else plural or word + 's'}"


_KIND_TESTS = (("directory", stat.S_ISDIR), ("fifo", stat.S_ISFIFO),
               ("character device", stat.S_ISCHR), ("block device", stat.S_ISBLK),
               ("socket", stat.S_ISSOCK), ("symbolic link", stat.S_ISLNK),
               ("regular file", stat.S_ISREG))

# A message may say a kind its own way (a folder, where it speaks of folders): it passes
# these with the words it changes.
FILE_KINDS = {"directory": "a directory", "fifo": "a FIFO (named pipe)",
              "character device": "a character device", "block device": "a block device",
              "socket": "a socket", "symbolic link": "a symbolic link",
              "regular file": "a regular file"}


def file_kind(mode, words=FILE_KINDS, unknown="an unknown file"):
    """What an st_mode is, in words: 'a directory', 'a FIFO (named pipe)'..."""
    return next((words[kind] for kind, test in _KIND_TESTS if test(mode)), unknown)
