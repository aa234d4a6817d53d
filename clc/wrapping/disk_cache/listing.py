# SPDX-License-Identifier: Apache-2.0
"""What `clc cache ls|stats|clear` asks of a DiskCache: its entries and why the cache would
not use one, its numbers, and its removal. Here a refused tree is an error (ClcError) to say
to the user, where a traced program's cache only turns itself off."""

import contextlib
import dataclasses
import os

from clc.errors import ClcError
from clc.wrapping.disk_cache.layout import check, peek
from clc.wrapping.disk_cache.trust import (Owners, Refused, Untrusted, open_dir, open_entry,
                                           read_all)
from clc.wrapping.disk_cache.tree import open_root, scan, unlink_in

__all__ = ["CacheEntry", "CacheListing"]


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One file of a DiskCache. metadata is None when its header cannot be read; problem
    says why the cache would not use it (None when nothing was found against it)."""
    key: str
    size: int
    mtime: float
    metadata: dict | None
    problem: str | None = None


class CacheListing:
    """DiskCache's entries, stats and clear (for its root, max_bytes, key and counters)."""

    def entries(self, verify=False):
        """The entries of this user's cache, as CacheEntry, in no particular order. Their
        problem comes from their file type, owner, mode, size and header; with verify, from
        their HMAC too, which reads them whole. ClcError when the cache itself is refused."""
        out = []
        with self._scanned() as (root_fd, owners, found, _):
            secret = None
            if verify and root_fd is not None:
                try:
                    secret = self._key.get(root_fd, owners, create=False)
                except Refused as e:
                    raise ClcError(_refusal(e)) from None
            for key, sub, st in found:
                metadata, problem = self._describe(root_fd, owners, sub, key, verify, secret)
                out.append(CacheEntry(key, st.st_size, st.st_mtime, metadata, problem))
        return out

    def stats(self):
        with self._scanned() as (_, _, found, _):
            pass
        return {"root": self.root, "entries": len(found),
                "bytes": sum(st.st_size for _, _, st in found), "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "corrupt": self.corrupt,
                "refused": self.refused, "stores": self.stores, "evictions": self.evictions,
                "shared": self.shared, "shared_hits": self.shared_hits}

    def clear(self):
        """Remove every entry and temporary file; the number of entries removed. ClcError
        when the cache itself is refused."""
        with self._scanned() as (root_fd, owners, found, temps):
            for sub, name, _ in temps:
                unlink_in(self.root, root_fd, owners, sub, name)
            return sum(unlink_in(self.root, root_fd, owners, sub, key + ".cubin")
                       for key, sub, _ in found)

    @contextlib.contextmanager
    def _scanned(self):
        """(root descriptor or None, owners, entries, temporary files) of this user's cache,
        for entries, stats and clear."""
        owners = Owners.this_user()
        try:
            root_fd = open_root(self.root, owners, create=False)
            if root_fd is None:
                yield None, owners, [], []
                return
            try:
                found, temps = scan(self.root, root_fd, owners)
                yield root_fd, owners, found, temps
            finally:
                os.close(root_fd)
        except Refused as e:
            raise ClcError(_refusal(e)) from None

    def _describe(self, root_fd, owners, sub, key, verify, secret):
        """(metadata, problem) of one entry, for entries()."""
        try:
            sub_fd = open_dir(sub, owners, os.path.join(self.root, sub), root_fd)
        except OSError as e:
            return None, f"unreadable ({e.strerror or e})"
        try:
            fd, st = open_entry(sub_fd, key + ".cubin", owners, self.max_bytes)
        except Untrusted as e:
            return None, e.why
        except OSError as e:
            return None, f"unreadable ({e.strerror or e})"
        finally:
            os.close(sub_fd)
        try:
            metadata, problem = peek(fd, st)
            if verify and problem is None:
                os.lseek(fd, 0, os.SEEK_SET)
                if secret is None or check(read_all(fd, st.st_size), key, secret) is None:
                    problem = "failed authentication (rebuilt at its next use)"
            return metadata, problem
        except OSError as e:
            return None, f"unreadable ({e.strerror or e})"
        finally:
            os.close(fd)


def _refusal(refused):
    return f"{refused}: the cache is not used ({refused.hint})"
