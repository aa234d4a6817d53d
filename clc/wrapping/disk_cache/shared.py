# SPDX-License-Identifier: Apache-2.0
"""The shared cache ($CLC_CACHE_SHARED_DIR): entries that an administrator built, read after a
miss in the user's own cache and never written.

The administrator fills it as its owner (CLC_CACHE_DIR=DIR while running the programs), then
opens it for reading with `chmod -R go+rX DIR && chmod 600 DIR/key`. Its trust is by
ownership alone: its root, its directories and its entries must be owned by root or by the
owner of its root and not be writable by group or others, and so must every ancestor of its
root (symbolic links resolved), since whoever can write an ancestor could have made the root
and would then be "its owner" (a directory under /tmp is therefore refused). The
administrator's key is not published: anyone who could read it could forge entries, and a
file that only the owner can write needs no key to show who wrote it. Damage is caught by the
sha256 that each entry carries next to its HMAC, over the same bytes. A shared cache that
fails these checks is not used, said once; the user's own cache goes on.
"""

import errno
import os

from clc.wrapping.disk_cache.layout import check
from clc.wrapping.disk_cache.trust import (DIR_FLAGS, Owners, Refused, open_dir, open_entry,
                                           read_all, untrusted)

__all__ = ["SharedCache", "HINT"]

HINT = "ask the administrator who set CLC_CACHE_SHARED_DIR"


class SharedCache:
    """The shared cache at path (absolute), its ancestors checked once per root directory."""

    def __init__(self, path):
        self.path = path
        self._checked = None  # (st_dev, st_ino) of the shared root whose ancestors passed

    def read(self, key, max_bytes):
        """What layout.check makes of the entry for key ((payload, metadata), "stale" or
        None); FileNotFoundError when it or the cache is missing; Untrusted for an entry not
        read, Refused for a cache not used, OSError when it cannot be read."""
        sub, name = key[:2], key + ".cubin"
        root_fd, owners = self._open()
        if root_fd is None:
            raise FileNotFoundError(errno.ENOENT, "no shared cache", self.path)
        try:
            sub_fd = open_dir(sub, owners, os.path.join(self.path, sub), root_fd, hint=HINT)
            try:
                fd, st = open_entry(sub_fd, name, owners, max_bytes)
                try:
                    return check(read_all(fd, st.st_size), key, None)
                finally:
                    os.close(fd)
            finally:
                os.close(sub_fd)
        finally:
            os.close(root_fd)

    def _open(self):
        """(descriptor, owners) of the shared root, or (None, None) when it is missing."""
        real = os.path.realpath(self.path)
        try:
            fd = os.open(real, DIR_FLAGS)
        except FileNotFoundError:
            return None, None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise Refused(self.path, "not a directory", HINT) from None
            raise
        try:
            st = os.fstat(fd)
            owners = Owners(frozenset({0, st.st_uid}),
                            f"root or uid {st.st_uid} (the owner of {real})")
            problem = untrusted(st, owners, directory=True)
            if problem is not None:
                raise Refused(self.path, problem[1], HINT)
            if self._checked != (st.st_dev, st.st_ino):
                for ancestor in _ancestors(real):
                    problem = untrusted(os.stat(ancestor, follow_symlinks=False), owners, True)
                    if problem is not None:
                        raise Refused(ancestor, problem[1],
                                      f"whoever can write it could have made {real}; {HINT}")
                self._checked = (st.st_dev, st.st_ino)
        except BaseException:
            os.close(fd)
            raise
        return fd, owners


def _ancestors(path):
    """"/", "/a", "/a/b" for "/a/b/c"."""
    out = []
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return out[::-1]
        out.append(parent)
        path = parent
