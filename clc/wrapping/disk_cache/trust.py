# SPDX-License-Identifier: Apache-2.0
"""Which directories and files of a cache tree are taken, opened so that none can be swapped.

A cubin taken from the cache runs inside the user's program, with the user's rights, so on a
machine shared with others the cache takes only what its owners wrote (the user, in the
user's own cache; root or the owner of its root, in the shared cache):

- A directory is used only when it is a directory of its owners, not writable by group or
  others. Anything else there (a symbolic link, another user's directory, a root of mode 1777
  that everyone shares) is refused (Refused), and the tree is not used. A tree is walked from
  its root down by descriptor (O_DIRECTORY|O_NOFOLLOW, then calls relative to it), so a path
  component swapped midway cannot redirect a read or a write.
- An entry is opened O_NOFOLLOW|O_NONBLOCK (a symbolic link is not followed, a FIFO does not
  block) and read only when fstat says it is a regular file of its owners, not writable by
  group or others, and no larger than the cap; else it is not read (Untrusted): a miss,
  said once for each kind of reason.
"""

import dataclasses
import errno
import os
import stat

from clc.words import FILE_KINDS, file_kind

__all__ = ["Owners", "Refused", "Untrusted", "OWN_DIR_HINT", "DIR_FLAGS", "CREATE_FLAGS",
           "untrusted", "open_dir", "open_entry", "read_all", "unlink_at", "remove_same"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
OWN_DIR_HINT = "set CLC_CACHE_DIR to a directory that only you can write"


@dataclasses.dataclass(frozen=True)
class Owners:
    """Whose files a cache tree takes, and how a message names them."""
    uids: frozenset
    label: str

    @classmethod
    def this_user(cls):
        uid = os.geteuid()
        return cls(frozenset({uid}), f"you (uid {uid})")


class Refused(Exception):
    """A directory or key file that others could have made or changed: the tree is not used."""

    def __init__(self, path, why, hint):
        super().__init__(f"{path} is {why}")
        self.path, self.why, self.hint = path, why, hint


class Untrusted(Exception):
    """An entry that is not read; kind groups the reasons that are said once."""

    def __init__(self, kind, why):
        super().__init__(why)
        self.kind, self.why = kind, why


_FILE_KINDS = {**FILE_KINDS, "fifo": "a FIFO"}


def _file_kind(st):
    return file_kind(st.st_mode, _FILE_KINDS)


def untrusted(st, owners, directory):
    """(kind, why) when st is not a directory (or regular file) of owners that only they can
    write; None when it is."""
    want, test = ("a directory", stat.S_ISDIR) if directory else ("a regular file", stat.S_ISREG)
    if not test(st.st_mode):
        return "type", f"{_file_kind(st)}, not {want}"
    if st.st_uid not in owners.uids:
        return "owner", f"owned by uid {st.st_uid}, not by {owners.label}"
    if st.st_mode & 0o022:
        who = {0o020: "group", 0o002: "others", 0o022: "group and others"}[st.st_mode & 0o022]
        return "mode", f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_dir(name, owners, shown, dir_fd=None, create=False, hint=OWN_DIR_HINT):
    """A descriptor of directory name (relative to dir_fd), made 0700 when missing and
    create; FileNotFoundError when missing; Refused when it is not one of owners'."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
        return open_dir(name, owners, shown, dir_fd, hint=hint)
    except OSError as e:
        # O_DIRECTORY|O_NOFOLLOW on a symbolic link or a file: say which it is.
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise e from None
        if stat.S_ISLNK(st.st_mode):
            raise Refused(shown, "a symbolic link (not followed)",
                          "set CLC_CACHE_DIR to the directory it points to, if that is yours"
                          if dir_fd is None else hint) from None
        raise Refused(shown, f"{_file_kind(st)}, not a directory", hint) from None
    try:
        problem = untrusted(os.fstat(fd), owners, directory=True)
        if problem is not None:
            kind, why = problem
            raise Refused(shown, why, f"chmod go-w {shown}, or {hint}"
                          if kind == "mode" and hint == OWN_DIR_HINT else hint)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_entry(dir_fd, name, owners, max_bytes):
    """(descriptor, stat) of an entry that may be read; FileNotFoundError when missing,
    Untrusted when it is not a regular file of owners, only theirs to write, within the cap."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Untrusted("type", "a symbolic link (not followed)") from None
        if e.errno == errno.ENXIO:
            raise Untrusted("type", "a socket, not a regular file") from None
        raise
    try:
        # The descriptor's own stat decides: the name may point elsewhere by now.
        st = os.fstat(fd)
        problem = untrusted(st, owners, directory=False)
        if problem is None and st.st_size > max_bytes:
            problem = "size", f"{st.st_size} bytes, more than the cache's cap of {max_bytes}"
        if problem is not None:
            raise Untrusted(*problem)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_all(fd, size):
    """Up to size + 1 bytes: one more than fstat said shows a file that grew while read."""
    chunks, left = [], size + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def unlink_at(name, dir_fd):
    """True when this call removed name; False when it was gone or could not be removed."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def remove_same(dir_fd, name, st):
    # Only the file that was read: a writer may have renamed a good one into place since.
    try:
        if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino == st.st_ino:
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
