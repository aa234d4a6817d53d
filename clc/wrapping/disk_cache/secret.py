# SPDX-License-Identifier: Apache-2.0
"""The HMAC key of the user's own cache: 32 random bytes in <root>/key.

Each entry of the user's cache carries an HMAC-SHA256 keyed by it (clc.wrapping.disk_cache.
layout). The key file is mode 0600, this user's alone, checked like an entry and refused when
others can read it. An entry that does not verify (rewritten, moved to another key, or
damaged) is a miss and is removed, said once for that entry: the caller builds it again and
the build is stored in its place. The HMAC is what holds where ownership says little: a file
system that shows every file as the user's, or a tree that others could write into before it
was the user's alone.
"""

import errno
import os
import secrets
import stat

from clc.wrapping.disk_cache.trust import (CREATE_FLAGS, Refused, Untrusted, open_entry,
                                           read_all, unlink_at)

__all__ = ["SecretKey"]

_KEY_FILE = "key"
_SECRET_BYTES = 32


class SecretKey:
    """The key in one cache root, read once for as long as the root is the same directory."""

    def __init__(self, root):
        self.shown = os.path.join(root, _KEY_FILE)
        self._known = None  # ((st_dev, st_ino) of the root, the key in it)

    def get(self, root_fd, owners, create):
        """The HMAC key in the root, made when missing and create; None when missing."""
        root = os.fstat(root_fd)
        if self._known is not None and self._known[0] == (root.st_dev, root.st_ino):
            return self._known[1]
        shown = self.shown
        hint = "remove it: a new key is made, and every entry is rebuilt"
        try:
            fd, st = open_entry(root_fd, _KEY_FILE, owners, 1 << 12)
        except FileNotFoundError:
            if not create:
                return None
            _make_secret(root_fd)
            secret = self.get(root_fd, owners, create=False)
            if secret is None:
                raise FileNotFoundError(errno.ENOENT, "removed as it was made", shown) from None
            return secret
        except Untrusted as e:
            raise Refused(shown, e.why, hint) from None
        try:
            secret = read_all(fd, _SECRET_BYTES)
        finally:
            os.close(fd)
        if st.st_mode & 0o077:
            raise Refused(shown, f"open to others (mode {stat.S_IMODE(st.st_mode):04o}), "
                                 f"and the key must be yours alone", hint)
        if len(secret) != _SECRET_BYTES:
            raise Refused(shown, f"{len(secret)} bytes long, not {_SECRET_BYTES}", hint)
        self._known = ((root.st_dev, root.st_ino), secret)
        return secret


def _make_secret(root_fd):
    """Make <root>/key unless another process made it first."""
    temp = f".{_KEY_FILE}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, CREATE_FLAGS, 0o600, dir_fd=root_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(_SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        # A link, not a rename: of processes making a key at once the first one's stays, and
        # no reader sees the key file before its bytes are in it.
        try:
            os.link(temp, _KEY_FILE, src_dir_fd=root_fd, dst_dir_fd=root_fd,
                    follow_symlinks=False)
        except FileExistsError:
            pass
    finally:
        unlink_at(temp, root_fd)
