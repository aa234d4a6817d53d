# SPDX-License-Identifier: Apache-2.0
"""DiskCache: get and put of linked cubins, in the user's own cache, then the shared one.

Many processes may build the same kernel at once, so a file is written under a temporary
name (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) in its final directory and renamed into place
by descriptor: readers see a whole file or none, and the last writer of the same key wins
with the same bytes. A cache problem must never break the traced program, so disk errors in
get and put are a miss or an unstored entry, with the last message kept in `last_error`; a
refused tree turns the user's cache (or the shared one) off for the process, said once with
the path and the reason, and kernels are then built and not kept.
"""

import json
import os
import re
import sys
import threading

from clc.wrapping.disk_cache.layout import (HEADER_SIZE, MAX_METADATA, check, check_key, encode,
                                            temp_name)
from clc.wrapping.disk_cache.listing import CacheListing
from clc.wrapping.disk_cache.secret import SecretKey
from clc.wrapping.disk_cache.settings import CACHE_SETTINGS, absolute, env_max_bytes
from clc.wrapping.disk_cache.shared import SharedCache
from clc.wrapping.disk_cache.tree import evicted, open_root
from clc.wrapping.disk_cache.trust import (CREATE_FLAGS, Owners, Refused, Untrusted, open_dir,
                                           open_entry, read_all, remove_same, unlink_at)

__all__ = ["DiskCache"]


class DiskCache(CacheListing):
    """Linked cubins by key, as files <root>/<key[:2]>/<key>.cubin, and after them a
    read-only shared cache (clc.wrapping.disk_cache). shared: its directory, by default
    $CLC_CACHE_SHARED_DIR ("" for none). warn(text) hears each message that is said once
    (a refused directory, an ignored or unauthenticated entry); without it they go to
    stderr. They are also kept in `messages`. Without root, max_bytes or shared, they come
    from the environment ($CLC_CACHE_DIR, $CLC_CACHE_MAX_BYTES, $CLC_CACHE_SHARED_DIR);
    inside a program that clc-run started, from_settings makes the cache instead."""

    @classmethod
    def from_settings(cls, settings, fsync=False, warn=None):
        """The cache that clc-run fixed for the program (cache_settings, read back from its
        sealed settings): nothing is taken from the process's environment. ValueError when
        the settings lack a value or hold one that cache_settings would not have made."""
        missing = [name for name in CACHE_SETTINGS if name not in settings]
        if missing:
            raise ValueError(f"clc-run's settings lack {', '.join(missing)}")
        root, shared = settings["CLC_CACHE_DIR"], settings["CLC_CACHE_SHARED_DIR"]
        for name, path in (("CLC_CACHE_DIR", root), ("CLC_CACHE_SHARED_DIR", shared)):
            if (path or name == "CLC_CACHE_DIR") and not os.path.isabs(path):
                raise ValueError(f"clc-run's setting {name}={path!r} is not an absolute path")
        text = settings["CLC_CACHE_MAX_BYTES"]
        if not re.fullmatch(r"[0-9]+", text):
            raise ValueError(f"clc-run's setting CLC_CACHE_MAX_BYTES={text!r} is not a number "
                             f"of bytes")
        # shared "" is none, not "ask the environment".
        return cls(root, int(text), fsync, shared, warn)

    def __init__(self, root=None, max_bytes=None, fsync=False, shared=None, warn=None):
        if root is None:
            root = os.environ.get("CLC_CACHE_DIR") or "~/.cache/clc"
        self.root = absolute(root)
        if shared is None:
            shared = os.environ.get("CLC_CACHE_SHARED_DIR", "")
        self.shared = absolute(shared) if shared else None
        if self.shared == self.root:
            self.shared = None
        if max_bytes is None:
            max_bytes = env_max_bytes(os.environ)
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.last_error = None
        self.disabled = None          # the message that turned this user's cache off
        self.shared_disabled = None   # the message that turned the shared cache off
        self.messages = []
        self._warn = warn
        self._said = set()
        self._said_lock = threading.Lock()
        self._key = SecretKey(self.root)
        self._shared = SharedCache(self.shared) if self.shared is not None else None
        self.hits = self.misses = self.corrupt = self.refused = self.stores = 0
        self.evictions = self.shared_hits = 0

    def path(self, key):
        check_key(key)
        return os.path.join(self.root, key[:2], key + ".cubin")

    def get(self, key):
        """The payload stored under key, or None (missing, refused, unauthenticated)."""
        entry = self.get_entry(key)
        return None if entry is None else entry[0]

    def get_entry(self, key):
        """(payload, metadata dict) stored under key in this user's cache, else in the
        shared cache, or None."""
        check_key(key)
        entry, failed = (None, False) if self.disabled else self._get_own(key)
        if entry is None and self.shared is not None and self.shared_disabled is None:
            entry = self._get_shared(key)
            self.shared_hits += entry is not None
        if failed:
            done = "rebuilt" if entry is None else f"taken from the shared cache {self.shared}"
            self._say(("authentication", key),
                      f"wrapped-kernel cache entry {self.path(key)} failed authentication: {done}")
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def put(self, key, data, metadata=None):
        """Store data under key; True when stored. Never raises for a disk error or a refused
        directory."""
        path = self.path(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"cache data is bytes, not {type(data).__name__}")
        data = bytes(data)
        meta = json.dumps(metadata, sort_keys=True).encode() if metadata else b""
        if len(meta) > MAX_METADATA:
            raise ValueError(f"cache metadata is {len(meta)} bytes, more than {MAX_METADATA}")
        if HEADER_SIZE + len(meta) + len(data) > self.max_bytes or self.disabled:
            return False
        owners = Owners.this_user()
        try:
            root_fd = open_root(self.root, owners, create=True)
            try:
                secret = self._key.get(root_fd, owners, create=True)
                sub_fd = open_dir(key[:2], owners, os.path.dirname(path), root_fd, create=True)
                try:
                    self._write(sub_fd, key, encode(key, meta, data, secret))
                finally:
                    os.close(sub_fd)
                self.stores += 1
                try:
                    for _ in evicted(self.root, root_fd, owners, self.max_bytes, keep=key):
                        self.evictions += 1
                except Refused as e:
                    self._disable(e)
                except OSError as e:
                    self._error("evict in", self.root, e)
            finally:
                os.close(root_fd)
        except Refused as e:
            self._disable(e)
            return False
        except OSError as e:
            self._error("write", path, e)
            return False
        return True

    # ---- this user's cache ------------------------------------------------------------------

    def _get_own(self, key):
        """(entry or None, whether a file there failed authentication)."""
        owners = Owners.this_user()
        sub, name = key[:2], key + ".cubin"
        try:
            root_fd = open_root(self.root, owners, create=False)
            if root_fd is None:
                return None, False
            try:
                secret = self._key.get(root_fd, owners, create=False)
                if secret is None:
                    return None, False
                sub_fd = open_dir(sub, owners, os.path.join(self.root, sub), root_fd)
                try:
                    return self._read_own(sub_fd, name, key, secret, owners)
                finally:
                    os.close(sub_fd)
            finally:
                os.close(root_fd)
        except FileNotFoundError:
            return None, False
        except Refused as e:
            self._disable(e)
        except OSError as e:
            self._error("read", self.path(key), e)
        return None, False

    def _read_own(self, sub_fd, name, key, secret, owners):
        try:
            fd, st = open_entry(sub_fd, name, owners, self.max_bytes)
        except Untrusted as e:
            self.refused += 1
            self._say(("entry", e.kind), f"wrapped-kernel disk cache: ignored {self.path(key)}, "
                                         f"{e.why}: taken as missing (said once for entries "
                                         f"like it)")
            return None, False
        try:
            result = check(read_all(fd, st.st_size), key, secret)
            if isinstance(result, tuple):
                try:
                    os.utime(fd)
                except OSError:
                    pass
                return result, False
        finally:
            os.close(fd)
        self.corrupt += 1
        remove_same(sub_fd, name, st)
        return None, result is None

    def _write(self, sub_fd, key, parts):
        temp = temp_name(key)
        fd = os.open(temp, CREATE_FLAGS, 0o600, dir_fd=sub_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                for part in parts:
                    f.write(part)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(temp, key + ".cubin", src_dir_fd=sub_fd, dst_dir_fd=sub_fd)
        except BaseException:
            unlink_at(temp, sub_fd)
            raise

    # ---- the shared cache -------------------------------------------------------------------

    def _get_shared(self, key):
        shown = os.path.join(self.shared, key[:2], key + ".cubin")
        try:
            result = self._shared.read(key, self.max_bytes)
        except FileNotFoundError:
            return None
        except Untrusted as e:
            self.refused += 1
            self._say(("shared entry", e.kind), f"shared wrapped-kernel cache: ignored {shown}, "
                                                f"{e.why}: taken as missing (said once for "
                                                f"entries like it)")
            return None
        except Refused as e:
            self.shared_disabled = (f"the shared wrapped-kernel cache {self.shared} is not used: "
                                    f"{e} ({e.hint})")
            self._say(("shared off",), self.shared_disabled)
            return None
        except OSError as e:
            self._say(("shared error", e.errno), f"the shared wrapped-kernel cache cannot be "
                                                 f"read: {shown}: {e.strerror or e}")
            return None
        if isinstance(result, tuple):
            return result
        if result == "stale":
            self._say(("shared stale",), f"the shared wrapped-kernel cache {self.shared} holds "
                                         f"entries in an older format: they are not used")
        else:
            self._say(("shared damaged", key),
                      f"shared wrapped-kernel cache entry {shown} is damaged: not used")
        return None

    # ---- messages ---------------------------------------------------------------------------

    def _disable(self, refused):
        self.disabled = (f"the wrapped-kernel disk cache is off: {refused}; kernels are built "
                         f"and not kept ({refused.hint})")
        self._say(("off",), self.disabled)

    def _say(self, kind, text):
        with self._said_lock:
            if kind in self._said:
                return
            self._said.add(kind)
            self.messages.append(text)
        if self._warn is not None:
            self._warn(text)
        else:
            sys.stderr.write(f"clc: {text}\n")

    def _error(self, what, path, e):
        self.last_error = f"clc cache: cannot {what} {path}: {e.strerror or e}"
