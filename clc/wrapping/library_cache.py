# SPDX-License-Identifier: Apache-2.0
"""The in-process cache of wrapped kernels: loaded libraries (clc.wrapping.cache).

LibraryCache: the loaded libraries (cuLibraryLoadData handles) by key, reference-counted by the
launches that use them; unreferenced ones stay loaded, least recently used first
out, while their sizes sum to more than the cap. Threads asking for the same key while it
loads wait for that one load, and share its handle or its exception.
"""

import collections
import dataclasses
import threading

__all__ = ["LibraryCache"]


@dataclasses.dataclass
class _Library:
    handle: object
    size: int
    refs: int


class _Loading:
    """A load in flight: the threads asking for the same key wait on it."""

    def __init__(self):
        self.done = threading.Event()
        self.waiters = 0
        self.handle = None
        self.error = None


class LibraryCache:
    """Loaded libraries by key: load(key, data) -> handle once per key, unload(handle) when
    evicted or closed. Recency is the last acquire or release."""

    def __init__(self, load, unload, max_bytes):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._load = load
        self._unload = unload
        self.max_bytes = max_bytes
        self.last_error = None
        self._lock = threading.Lock()
        self._libraries = collections.OrderedDict()
        self._loading = {}
        self._bytes = 0
        self._loads = self._hits = self._unloads = 0

    def acquire(self, key, data_fn):
        """The handle loaded for key, with one more reference; data_fn() gives the bytes to
        load when it is not loaded. A load's exception reaches every thread that waited for
        it, and nothing is cached."""
        with self._lock:
            library = self._libraries.get(key)
            if library is not None:
                library.refs += 1
                self._libraries.move_to_end(key)
                self._hits += 1
                return library.handle
            loading = self._loading.get(key)
            owner = loading is None
            if owner:
                loading = self._loading[key] = _Loading()
            else:
                loading.waiters += 1
        if not owner:
            loading.done.wait()
            if loading.error is not None:
                raise loading.error
            return loading.handle
        try:
            data = data_fn()
            handle = self._load(key, data)
        except BaseException as e:
            with self._lock:
                del self._loading[key]
                loading.error = e
            loading.done.set()
            raise
        with self._lock:
            del self._loading[key]
            loading.handle = handle
            # The waiters' references are taken here, so that the library cannot be evicted
            # before they wake up.
            self._libraries[key] = _Library(handle, len(data), 1 + loading.waiters)
            self._bytes += len(data)
            self._loads += 1
            self._hits += loading.waiters
            victims = self._take_victims()
        loading.done.set()
        self._unload_all(victims)
        return handle

    def release(self, key):
        """Drop one reference to key; unreferenced libraries are unloaded only over the cap."""
        with self._lock:
            library = self._libraries.get(key)
            if library is None or library.refs == 0:
                raise ValueError(f"release of {key!r} without a matching acquire")
            library.refs -= 1
            self._libraries.move_to_end(key)
            victims = self._take_victims()
        self._unload_all(victims)

    def close(self):
        """Unload every library, referenced or not; the cache stays usable afterwards."""
        with self._lock:
            victims = [library.handle for library in self._libraries.values()]
            self._libraries.clear()
            self._bytes = 0
        self._unload_all(victims)

    def refcount(self, key):
        """key's reference count, or None when it is not loaded."""
        with self._lock:
            library = self._libraries.get(key)
            return None if library is None else library.refs

    def __contains__(self, key):
        with self._lock:
            return key in self._libraries

    def stats(self):
        with self._lock:
            return {"loads": self._loads, "hits": self._hits, "unloads": self._unloads,
                    "bytes": self._bytes, "entries": len(self._libraries),
                    "max_bytes": self.max_bytes}

    def _take_victims(self):
        """Remove unreferenced libraries, least recently used first, until under the cap;
        their handles (the caller unloads them outside the lock). Holds the lock."""
        victims = []
        if self._bytes <= self.max_bytes:
            return victims
        for key, library in list(self._libraries.items()):
            if self._bytes <= self.max_bytes:
                break
            if library.refs == 0:
                del self._libraries[key]
                self._bytes -= library.size
                victims.append(library.handle)
        return victims

    def _unload_all(self, handles):
        # An unload failure (say, at exit after the context is gone) must not break the program.
        for handle in handles:
            try:
                self._unload(handle)
            except Exception as e:
                self.last_error = f"clc library cache: unload failed: {e}"
                continue
            with self._lock:
                self._unloads += 1
