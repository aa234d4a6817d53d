# SPDX-License-Identifier: Apache-2.0
"""The caches of wrapped kernels: linked cubins on disk, loaded libraries in the process.

Building a wrapped kernel (its PTX plus wrapper code, compiled and linked) takes a JIT run of
tens to hundreds of milliseconds, so the linked cubin is kept in two places:

- DiskCache: one file per cubin under $CLC_CACHE_DIR (~/.cache/clc), named by cache_key()
  of everything the build depends on, shared by every process of every run. Many processes
  may build the same kernel at once, so a file is written under a temporary name in its
  final directory and renamed into place: readers see a whole file or none, and the last
  writer of the same key wins with the same bytes. Each file carries the sha256 of its
  payload, checked on every read: a torn or damaged file is a miss and is removed, never
  loaded. The size cap is kept by evicting the least recently used files (a hit touches its
  file's mtime) after each store; a full scan is cheap next to the build that preceded it.
  A cache problem must never break the traced program, so disk errors in get and put are a
  miss or an unstored entry, with the last message kept in `last_error`.
- LibraryCache: the loaded libraries (cuLibraryLoadData handles) by key, reference-counted
  by the launches that use them; unreferenced ones stay loaded, least recently used first
  out, while their sizes sum to more than the cap. Threads asking for the same key while it
  loads wait for that one load, and share its handle or its exception.
"""

import collections
import dataclasses
import hashlib
import json
import os
import re
import secrets
import struct
import threading
import time

from clc.errors import ClcError

__all__ = ["cache_key", "DiskCache", "CacheEntry", "LibraryCache", "MAGIC",
           "DEFAULT_MAX_BYTES"]

MAGIC = b"CLCCUBN1"
DEFAULT_MAX_BYTES = 1 << 30
# magic, sha256 of the payload, payload length (u64 LE), metadata length (u32 LE)
_HEADER = struct.Struct("<8s32sQI")
_MAX_METADATA = 64 * 1024
_TEMP_MAX_AGE = 3600.0
_KEY = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"\.[0-9a-f]{64}\.\d+\.[0-9a-f]+\.tmp")
_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def cache_key(*parts):
    """The sha256 hex digest of parts (bytes or str), each prefixed with its length."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            part = part.encode()
        elif not isinstance(part, (bytes, bytearray, memoryview)):
            raise TypeError(f"cache_key parts are bytes or str, not {type(part).__name__}")
        part = bytes(part)
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    return h.hexdigest()


def _check_key(key):
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"a cache key is 64 lowercase hex characters, got {key!r}")
    return key


def _env_max_bytes(environ):
    text = environ.get("CLC_CACHE_MAX_BYTES", "")
    if not text.strip():
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ClcError(f"CLC_CACHE_MAX_BYTES={text!r}: expected a number of bytes, "
                       f"optionally with a K, M, G or T suffix (e.g. 1073741824 or 1G)")
    return int(m.group(1)) * _SIZE_SUFFIXES[m.group(2).lower()]


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One file of a DiskCache. metadata is None when its header cannot be read."""
    key: str
    size: int
    mtime: float
    metadata: dict | None


class DiskCache:
    """Linked cubins by key, as files <root>/<key[:2]>/<key>.cubin (see the module doc)."""

    def __init__(self, root=None, max_bytes=None, fsync=False):
        if root is None:
            root = os.environ.get("CLC_CACHE_DIR") or "~/.cache/clc"
        self.root = os.path.abspath(os.path.expanduser(os.fspath(root)))
        if max_bytes is None:
            max_bytes = _env_max_bytes(os.environ)
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.last_error = None
        self.hits = self.misses = self.corrupt = self.stores = self.evictions = 0

    def path(self, key):
        _check_key(key)
        return os.path.join(self.root, key[:2], key + ".cubin")

    def get(self, key):
        """The payload stored under key, or None (missing, damaged or unreadable)."""
        entry = self.get_entry(key)
        return None if entry is None else entry[0]

    def get_entry(self, key):
        """(payload, metadata dict) stored under key, or None."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
                ino = os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as e:
            self._error("read", path, e)
            self.misses += 1
            return None
        entry = _decode(blob)
        if entry is None:
            self.corrupt += 1
            self.misses += 1
            self._remove_corrupt(path, ino)
            return None
        self.hits += 1
        try:
            os.utime(path)
        except OSError:
            pass
        return entry

    def put(self, key, data, metadata=None):
        """Store data under key; True when stored. Never raises for a disk error."""
        path = self.path(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"cache data is bytes, not {type(data).__name__}")
        data = bytes(data)
        meta = json.dumps(metadata, sort_keys=True).encode() if metadata else b""
        if len(meta) > _MAX_METADATA:
            raise ValueError(f"cache metadata is {len(meta)} bytes, more than {_MAX_METADATA}")
        if _HEADER.size + len(meta) + len(data) > self.max_bytes:
            return False
        header = _HEADER.pack(MAGIC, hashlib.sha256(data).digest(), len(data), len(meta))
        directory = os.path.dirname(path)
        temp = os.path.join(directory, f".{key}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(header)
                    f.write(meta)
                    f.write(data)
                    f.flush()
                    if self.fsync:
                        os.fsync(f.fileno())
                os.replace(temp, path)
            except BaseException:
                _unlink(temp)
                raise
        except OSError as e:
            self._error("write", path, e)
            return False
        self.stores += 1
        try:
            self._evict(keep=key)
        except OSError as e:
            self._error("evict in", self.root, e)
        return True

    def entries(self):
        """The entries on disk, as CacheEntry, in no particular order."""
        out = []
        for key, path, st in self._scan()[0]:
            out.append(CacheEntry(key, st.st_size, st.st_mtime, _read_metadata(path)))
        return out

    def stats(self):
        found = self._scan()[0]
        return {"root": self.root, "entries": len(found),
                "bytes": sum(st.st_size for _, _, st in found), "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "corrupt": self.corrupt,
                "stores": self.stores, "evictions": self.evictions}

    def clear(self):
        """Remove every entry and temporary file; the number of entries removed."""
        found, temps = self._scan()
        for path, _ in temps:
            _unlink(path)
        return sum(_unlink(path) for _, path, _ in found)

    def _scan(self):
        """([(key, path, stat)] of the entries, [(path, stat)] of the temporary files)."""
        found, temps = [], []
        try:
            dirs = [d for d in os.scandir(self.root)
                    if len(d.name) == 2 and d.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return found, temps
        for d in dirs:
            try:
                files = list(os.scandir(d.path))
            except FileNotFoundError:
                continue
            for f in files:
                try:
                    if f.name.endswith(".cubin") and f.name.startswith(d.name):
                        key = f.name[:-len(".cubin")]
                        if _KEY.fullmatch(key):
                            found.append((key, f.path, f.stat(follow_symlinks=False)))
                    elif _TEMP.fullmatch(f.name):
                        temps.append((f.path, f.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
        return found, temps

    def _evict(self, keep):
        found, temps = self._scan()
        stale = time.time() - _TEMP_MAX_AGE
        for path, st in temps:
            if st.st_mtime < stale:
                _unlink(path)
        total = sum(st.st_size for _, _, st in found)
        for key, path, st in sorted(found, key=lambda e: e[2].st_mtime):
            if total <= self.max_bytes:
                break
            if key == keep:
                continue
            # Gone already (another process evicted it) counts as freed, not as our eviction.
            if _unlink(path):
                self.evictions += 1
            total -= st.st_size

    def _remove_corrupt(self, path, ino):
        # Only the damaged file we read: a writer may have renamed a good one into place since.
        try:
            if os.stat(path).st_ino == ino:
                os.unlink(path)
        except OSError:
            pass

    def _error(self, what, path, e):
        self.last_error = f"clc cache: cannot {what} {path}: {e.strerror or e}"


def _decode(blob):
    """(payload, metadata) from a whole cache file, or None when it is damaged."""
    if len(blob) < _HEADER.size:
        return None
    magic, digest, size, meta_size = _HEADER.unpack_from(blob)
    if magic != MAGIC or len(blob) != _HEADER.size + meta_size + size:
        return None
    payload = blob[_HEADER.size + meta_size:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    metadata = _parse_metadata(blob[_HEADER.size:_HEADER.size + meta_size])
    if metadata is None:
        return None
    return payload, metadata


def _parse_metadata(raw):
    if not raw:
        return {}
    try:
        metadata = json.loads(raw)
    except ValueError:
        return None
    return metadata if isinstance(metadata, dict) else None


def _read_metadata(path):
    """An entry's metadata from its header alone (payload not checked), None if unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return None
            magic, _, _, meta_size = _HEADER.unpack(head)
            if magic != MAGIC or meta_size > _MAX_METADATA:
                return None
            raw = f.read(meta_size)
    except OSError:
        return None
    return _parse_metadata(raw) if len(raw) == meta_size else None


def _unlink(path):
    """True when this call removed path; False when it was gone or could not be removed."""
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


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
