# SPDX-License-Identifier: Apache-2.0
"""The disk cache of wrapped kernels: linked cubins, one file each (clc.wrapping.cache).

DiskCache: one file per cubin under $CLC_CACHE_DIR (~/.cache/clc), named by cache_key()
of everything the build depends on, shared by every process of every run of one user.
Inside a program that clc-run started, the place, the shared place and the cap are the ones
clc-run resolved from its own environment before the program started (cache_settings) and
sealed into the program's settings (DiskCache.from_settings): the program's environment,
$HOME and working directory included, cannot move the cache or the key in its root. The
environment is read only by a cache made without them (`clc cache`, `clc wrap`, tests).
Many processes may build the same kernel at once, so a file is written under a temporary
name in its final directory and renamed into place: readers see a whole file or none, and
the last writer of the same key wins with the same bytes. The size cap is kept by evicting
the least recently used files (a hit touches its file's mtime) after each store; a full
scan is cheap next to the build that preceded it. A cache problem must never break the
traced program, so disk errors in get and put are a miss or an unstored entry, with the
last message kept in `last_error`.

A cubin taken from the cache runs inside the user's program, with the user's rights, so
on a machine shared with others the cache takes only what the user wrote:

- The root and the directories under it are made mode 0700, and are used only when they
  are directories owned by this user (the effective uid) and not writable by group or
  others. Anything else there (a symbolic link, another user's directory, a root of mode
  1777 that everyone shares) turns the cache off for the process, said once with the path
  and the reason; kernels are then built and not kept. The tree is walked from the root
  down by descriptor (O_DIRECTORY|O_NOFOLLOW, then calls relative to it), so a path
  component swapped midway cannot redirect a read or a write. The root's ancestors are not
  checked: whatever path leads to it, the directory reached is refused unless it is the
  user's own.
- An entry is opened O_NOFOLLOW|O_NONBLOCK (a symbolic link is not followed, a FIFO does
  not block) and read only when fstat says it is a regular file of this user, not writable
  by group or others, and no larger than the cap; else it is a miss, said once for each
  kind of reason.
- Each entry carries an HMAC-SHA256 over its format, key, lengths, metadata and payload,
  keyed by 32 random bytes in <root>/key (mode 0600, this user's alone, checked like an
  entry and refused when others can read it). An entry that does not verify (rewritten,
  moved to another key, or damaged) is a miss and is removed, said once for that entry:
  the caller builds it again and the build is stored in its place. The HMAC is what holds
  where ownership says little: a file system that shows every file as the user's, or a
  tree that others could write into before it was the user's alone.
- Writes go to a temporary file made O_CREAT|O_EXCL|O_NOFOLLOW with mode 0600 in the
  entry's directory, renamed into place by descriptor.

- The shared cache ($CLC_CACHE_SHARED_DIR): entries that an administrator built, read after
a miss in the user's own cache and never written. The administrator fills it as its owner
(CLC_CACHE_DIR=DIR while running the programs), then opens it for reading with
`chmod -R go+rX DIR && chmod 600 DIR/key`. Its trust is by ownership alone: its root, its
directories and its entries must be owned by root or by the owner of its root and not be
writable by group or others, and so must every ancestor of its root (symbolic links
resolved), since whoever can write an ancestor could have made the root and would then be
"its owner" (a directory under /tmp is therefore refused). The administrator's key is not
published: anyone who could read it could forge entries, and a file that only the owner
can write needs no key to show who wrote it. Damage is caught by the sha256 that each
entry carries next to its HMAC, over the same bytes. A shared cache that fails these
checks is not used, said once; the user's own cache goes on.
"""

import contextlib
import dataclasses
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import struct
import sys
import threading
import time

from clc.errors import EXIT_USAGE, ClcError

__all__ = ["cache_key", "cache_settings", "CACHE_SETTINGS", "DiskCache", "CacheEntry", "MAGIC",
           "DEFAULT_MAX_BYTES", "HEADER_SIZE"]


MAGIC = b"CLCCUBN2"
# The format whose files carried only a sha256 of the payload: such files are replaced
# without a message, as they are expected in any cache that an older clc used.
_OLD_MAGICS = (b"CLCCUBN1",)
DEFAULT_MAX_BYTES = 1 << 30
# magic, HMAC-SHA256 (checked in the user's own cache), sha256 (checked in the shared cache),
# payload length (u64 LE), metadata length (u32 LE); both digests cover _signed_parts().
_HEADER = struct.Struct("<8s32s32sQI")
HEADER_SIZE = _HEADER.size
_MAX_METADATA = 64 * 1024
_TEMP_MAX_AGE = 3600.0
_KEY_FILE = "key"
_SECRET_BYTES = 32
_KEY = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"\.[0-9a-f]{64}\.\d+\.[0-9a-f]+\.tmp")
_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OWN_DIR_HINT = "set CLC_CACHE_DIR to a directory that only you can write"
# The program's settings that fix its disk cache (clc/runtime/engine.py reads the same names
# from the sealed settings without importing this module).
CACHE_SETTINGS = ("CLC_CACHE_DIR", "CLC_CACHE_SHARED_DIR", "CLC_CACHE_MAX_BYTES")


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


def _env_max_bytes(environ, exit_code=1):
    text = environ.get("CLC_CACHE_MAX_BYTES", "")
    if not text.strip():
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ClcError(f"CLC_CACHE_MAX_BYTES={text!r}: expected a number of bytes, "
                       f"optionally with a K, M, G or T suffix (e.g. 1073741824 or 1G)",
                       exit_code)
    return int(m.group(1)) * _SIZE_SUFFIXES[m.group(2).lower()]


def _absolute(path, environ=None):
    """path made absolute; a leading ~ is environ's $HOME (os.environ's without environ)."""
    path = os.fspath(path)
    if environ is not None and (path == "~" or path.startswith("~/")) and environ.get("HOME"):
        path = environ["HOME"].rstrip("/") + path[1:]
    return os.path.abspath(os.path.expanduser(path))


def cache_settings(environ):
    """The disk cache of a program that clc-run starts, resolved once from environ (clc-run's
    own): {"CLC_CACHE_DIR": absolute root, "CLC_CACHE_SHARED_DIR": absolute directory or "",
    "CLC_CACHE_MAX_BYTES": the cap in bytes}, for the program's sealed settings (read back by
    DiskCache.from_settings). A bad $CLC_CACHE_MAX_BYTES is a ClcError (EXIT_USAGE)."""
    shared = environ.get("CLC_CACHE_SHARED_DIR", "")
    return {
        "CLC_CACHE_DIR": _absolute(environ.get("CLC_CACHE_DIR") or "~/.cache/clc", environ),
        "CLC_CACHE_SHARED_DIR": _absolute(shared, environ) if shared else "",
        "CLC_CACHE_MAX_BYTES": str(_env_max_bytes(environ, EXIT_USAGE)),
    }


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One file of a DiskCache. metadata is None when its header cannot be read; problem
    says why the cache would not use it (None when nothing was found against it)."""
    key: str
    size: int
    mtime: float
    metadata: dict | None
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class _Owners:
    """Whose files a cache tree takes, and how a message names them."""
    uids: frozenset
    label: str


class _Refused(Exception):
    """A directory or key file that others could have made or changed: the tree is not used."""

    def __init__(self, path, why, hint):
        super().__init__(f"{path} is {why}")
        self.path, self.why, self.hint = path, why, hint


class _Untrusted(Exception):
    """An entry that is not read; kind groups the reasons that are said once."""

    def __init__(self, kind, why):
        super().__init__(why)
        self.kind, self.why = kind, why


_FILE_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
               (stat.S_ISREG, "a regular file"))


def _file_kind(st):
    return next((name for test, name in _FILE_KINDS if test(st.st_mode)), "an unknown file")


def _untrusted(st, owners, directory):
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


def _open_dir(name, owners, shown, dir_fd=None, create=False, hint=_OWN_DIR_HINT):
    """A descriptor of directory name (relative to dir_fd), made 0700 when missing and
    create; FileNotFoundError when missing; _Refused when it is not one of owners'."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
        return _open_dir(name, owners, shown, dir_fd, hint=hint)
    except OSError as e:
        # O_DIRECTORY|O_NOFOLLOW on a symbolic link or a file: say which it is.
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise e from None
        if stat.S_ISLNK(st.st_mode):
            raise _Refused(shown, "a symbolic link (not followed)",
                           "set CLC_CACHE_DIR to the directory it points to, if that is yours"
                           if dir_fd is None else hint) from None
        raise _Refused(shown, f"{_file_kind(st)}, not a directory", hint) from None
    try:
        problem = _untrusted(os.fstat(fd), owners, directory=True)
        if problem is not None:
            kind, why = problem
            raise _Refused(shown, why, f"chmod go-w {shown}, or {hint}"
                           if kind == "mode" and hint == _OWN_DIR_HINT else hint)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_entry(dir_fd, name, owners, max_bytes):
    """(descriptor, stat) of an entry that may be read; FileNotFoundError when missing,
    _Untrusted when it is not a regular file of owners, only theirs to write, within the cap."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _Untrusted("type", "a symbolic link (not followed)") from None
        if e.errno == errno.ENXIO:
            raise _Untrusted("type", "a socket, not a regular file") from None
        raise
    try:
        # The descriptor's own stat decides: the name may point elsewhere by now.
        st = os.fstat(fd)
        problem = _untrusted(st, owners, directory=False)
        if problem is None and st.st_size > max_bytes:
            problem = "size", f"{st.st_size} bytes, more than the cache's cap of {max_bytes}"
        if problem is not None:
            raise _Untrusted(*problem)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_all(fd, size):
    """Up to size + 1 bytes: one more than fstat said shows a file that grew while read."""
    chunks, left = [], size + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _signed_parts(key, meta, payload):
    return (MAGIC, key.encode(), struct.pack("<QI", len(payload), len(meta)), meta, payload)


def _digest(h, key, meta, payload):
    for part in _signed_parts(key, meta, payload):
        h.update(part)
    return h.digest()


def _mac(secret, key, meta, payload):
    return _digest(hmac.new(secret, digestmod=hashlib.sha256), key, meta, payload)


def _sha(key, meta, payload):
    return _digest(hashlib.sha256(), key, meta, payload)


def _encode(key, meta, payload, secret):
    header = _HEADER.pack(MAGIC, _mac(secret, key, meta, payload), _sha(key, meta, payload),
                          len(payload), len(meta))
    return header, meta, payload


def _check(blob, key, secret):
    """(payload, metadata) when blob is a whole entry for key, its HMAC verified with secret,
    or with secret None (the shared cache) its sha256; "stale" for the older format; None
    when it fails."""
    if blob[:len(MAGIC)] in _OLD_MAGICS:
        return "stale"
    if len(blob) < _HEADER.size:
        return None
    magic, mac, digest, size, meta_size = _HEADER.unpack_from(blob)
    if (magic != MAGIC or meta_size > _MAX_METADATA
            or len(blob) != _HEADER.size + meta_size + size):
        return None
    view = memoryview(blob)
    meta = view[_HEADER.size:_HEADER.size + meta_size]
    payload = view[_HEADER.size + meta_size:]
    if secret is None:
        good = hmac.compare_digest(_sha(key, meta, payload), digest)
    else:
        good = hmac.compare_digest(_mac(secret, key, meta, payload), mac)
    metadata = _parse_metadata(bytes(meta)) if good else None
    return None if metadata is None else (bytes(payload), metadata)


def _peek(fd, st):
    """(metadata, problem) from an entry's header alone (its digests not checked)."""
    head = os.read(fd, _HEADER.size)
    if head[:len(MAGIC)] in _OLD_MAGICS:
        return None, "written in an older format (replaced at its next use)"
    if len(head) < _HEADER.size:
        return None, "damaged (shorter than a header)"
    magic, _, _, size, meta_size = _HEADER.unpack(head)
    if magic != MAGIC or meta_size > _MAX_METADATA:
        return None, "damaged (not a clc cache header)"
    metadata = _parse_metadata(os.read(fd, meta_size))
    if metadata is None:
        return None, "damaged (unreadable metadata)"
    if st.st_size != _HEADER.size + meta_size + size:
        return metadata, "damaged (its size does not match its header)"
    return metadata, None


def _parse_metadata(raw):
    if not raw:
        return {}
    try:
        metadata = json.loads(raw)
    except ValueError:
        return None
    return metadata if isinstance(metadata, dict) else None


def _unlink_at(name, dir_fd):
    """True when this call removed name; False when it was gone or could not be removed."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _remove_same(dir_fd, name, st):
    # Only the file that was read: a writer may have renamed a good one into place since.
    try:
        if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino == st.st_ino:
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _ancestors(path):
    """"/", "/a", "/a/b" for "/a/b/c"."""
    out = []
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return out[::-1]
        out.append(parent)
        path = parent


def _make_secret(root_fd):
    """Make <root>/key unless another process made it first."""
    temp = f".{_KEY_FILE}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=root_fd)
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
        _unlink_at(temp, root_fd)


class DiskCache:
    """Linked cubins by key, as files <root>/<key[:2]>/<key>.cubin, and after them a
    read-only shared cache (see the module doc). shared: its directory, by default
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
        self.root = _absolute(root)
        if shared is None:
            shared = os.environ.get("CLC_CACHE_SHARED_DIR", "")
        self.shared = _absolute(shared) if shared else None
        if self.shared == self.root:
            self.shared = None
        if max_bytes is None:
            max_bytes = _env_max_bytes(os.environ)
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
        self._secret = None           # ((st_dev, st_ino) of the root, the key in it)
        self._shared_checked = None   # (st_dev, st_ino) of the shared root whose ancestors passed
        self.hits = self.misses = self.corrupt = self.refused = self.stores = 0
        self.evictions = self.shared_hits = 0

    def path(self, key):
        _check_key(key)
        return os.path.join(self.root, key[:2], key + ".cubin")

    def get(self, key):
        """The payload stored under key, or None (missing, refused, unauthenticated)."""
        entry = self.get_entry(key)
        return None if entry is None else entry[0]

    def get_entry(self, key):
        """(payload, metadata dict) stored under key in this user's cache, else in the
        shared cache, or None."""
        _check_key(key)
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
        if len(meta) > _MAX_METADATA:
            raise ValueError(f"cache metadata is {len(meta)} bytes, more than {_MAX_METADATA}")
        if _HEADER.size + len(meta) + len(data) > self.max_bytes or self.disabled:
            return False
        owners = self._owners()
        try:
            root_fd = self._open_root(owners, create=True)
            try:
                secret = self._secret_key(root_fd, owners, create=True)
                sub_fd = _open_dir(key[:2], owners, os.path.dirname(path), root_fd, create=True)
                try:
                    self._write(sub_fd, key, _encode(key, meta, data, secret))
                finally:
                    os.close(sub_fd)
                self.stores += 1
                try:
                    self._evict(root_fd, owners, keep=key)
                except _Refused as e:
                    self._disable(e)
                except OSError as e:
                    self._error("evict in", self.root, e)
            finally:
                os.close(root_fd)
        except _Refused as e:
            self._disable(e)
            return False
        except OSError as e:
            self._error("write", path, e)
            return False
        return True

    def entries(self, verify=False):
        """The entries of this user's cache, as CacheEntry, in no particular order. Their
        problem comes from their file type, owner, mode, size and header; with verify, from
        their HMAC too, which reads them whole. ClcError when the cache itself is refused."""
        out = []
        with self._scanned() as (root_fd, owners, found, _):
            secret = None
            if verify and root_fd is not None:
                try:
                    secret = self._secret_key(root_fd, owners, create=False)
                except _Refused as e:
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
                self._unlink_in(root_fd, owners, sub, name)
            return sum(self._unlink_in(root_fd, owners, sub, key + ".cubin")
                       for key, sub, _ in found)

    # ---- this user's cache ------------------------------------------------------------------

    @staticmethod
    def _owners():
        uid = os.geteuid()
        return _Owners(frozenset({uid}), f"you (uid {uid})")

    def _open_root(self, owners, create):
        """A descriptor of the root; None when it is missing and not to be made."""
        try:
            return _open_dir(self.root, owners, self.root)
        except FileNotFoundError:
            if not create:
                return None
        os.makedirs(os.path.dirname(self.root), exist_ok=True)
        return _open_dir(self.root, owners, self.root, create=True)

    def _secret_key(self, root_fd, owners, create):
        """The HMAC key in the root, made when missing and create; None when missing."""
        root = os.fstat(root_fd)
        if self._secret is not None and self._secret[0] == (root.st_dev, root.st_ino):
            return self._secret[1]
        shown = os.path.join(self.root, _KEY_FILE)
        hint = "remove it: a new key is made, and every entry is rebuilt"
        try:
            fd, st = _open_entry(root_fd, _KEY_FILE, owners, 1 << 12)
        except FileNotFoundError:
            if not create:
                return None
            _make_secret(root_fd)
            secret = self._secret_key(root_fd, owners, create=False)
            if secret is None:
                raise FileNotFoundError(errno.ENOENT, "removed as it was made", shown) from None
            return secret
        except _Untrusted as e:
            raise _Refused(shown, e.why, hint) from None
        try:
            secret = _read_all(fd, _SECRET_BYTES)
        finally:
            os.close(fd)
        if st.st_mode & 0o077:
            raise _Refused(shown, f"open to others (mode {stat.S_IMODE(st.st_mode):04o}), "
                                  f"and the key must be yours alone", hint)
        if len(secret) != _SECRET_BYTES:
            raise _Refused(shown, f"{len(secret)} bytes long, not {_SECRET_BYTES}", hint)
        self._secret = ((root.st_dev, root.st_ino), secret)
        return secret

    def _get_own(self, key):
        """(entry or None, whether a file there failed authentication)."""
        owners = self._owners()
        sub, name = key[:2], key + ".cubin"
        try:
            root_fd = self._open_root(owners, create=False)
            if root_fd is None:
                return None, False
            try:
                secret = self._secret_key(root_fd, owners, create=False)
                if secret is None:
                    return None, False
                sub_fd = _open_dir(sub, owners, os.path.join(self.root, sub), root_fd)
                try:
                    return self._read_own(sub_fd, name, key, secret, owners)
                finally:
                    os.close(sub_fd)
            finally:
                os.close(root_fd)
        except FileNotFoundError:
            return None, False
        except _Refused as e:
            self._disable(e)
        except OSError as e:
            self._error("read", self.path(key), e)
        return None, False

    def _read_own(self, sub_fd, name, key, secret, owners):
        try:
            fd, st = _open_entry(sub_fd, name, owners, self.max_bytes)
        except _Untrusted as e:
            self.refused += 1
            self._say(("entry", e.kind), f"wrapped-kernel disk cache: ignored {self.path(key)}, "
                                         f"{e.why}: taken as missing (said once for entries "
                                         f"like it)")
            return None, False
        try:
            result = _check(_read_all(fd, st.st_size), key, secret)
            if isinstance(result, tuple):
                try:
                    os.utime(fd)
                except OSError:
                    pass
                return result, False
        finally:
            os.close(fd)
        self.corrupt += 1
        _remove_same(sub_fd, name, st)
        return None, result is None

    def _write(self, sub_fd, key, parts):
        temp = f".{key}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=sub_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                for part in parts:
                    f.write(part)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(temp, key + ".cubin", src_dir_fd=sub_fd, dst_dir_fd=sub_fd)
        except BaseException:
            _unlink_at(temp, sub_fd)
            raise

    @contextlib.contextmanager
    def _scanned(self):
        """(root descriptor or None, owners, entries, temporary files) of this user's cache,
        for entries, stats and clear."""
        owners = self._owners()
        try:
            root_fd = self._open_root(owners, create=False)
            if root_fd is None:
                yield None, owners, [], []
                return
            try:
                found, temps = self._scan(root_fd, owners)
                yield root_fd, owners, found, temps
            finally:
                os.close(root_fd)
        except _Refused as e:
            raise ClcError(_refusal(e)) from None

    def _scan(self, root_fd, owners):
        """([(key, subdirectory, stat)] of the entries, [(subdirectory, name, stat)] of the
        temporary files); _Refused for a subdirectory that is not this user's alone."""
        found, temps = [], []
        with os.scandir(root_fd) as it:
            subs = [d.name for d in it if len(d.name) == 2 and d.is_dir(follow_symlinks=False)]
        for sub in subs:
            try:
                sub_fd = _open_dir(sub, owners, os.path.join(self.root, sub), root_fd)
            except FileNotFoundError:
                continue
            try:
                with os.scandir(sub_fd) as it:
                    files = list(it)
                for f in files:
                    try:
                        if f.name.endswith(".cubin") and f.name.startswith(sub):
                            key = f.name[:-len(".cubin")]
                            if _KEY.fullmatch(key):
                                found.append((key, sub, f.stat(follow_symlinks=False)))
                        elif _TEMP.fullmatch(f.name):
                            temps.append((sub, f.name, f.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue
            finally:
                os.close(sub_fd)
        return found, temps

    def _unlink_in(self, root_fd, owners, sub, name):
        """True when this call removed <sub>/<name>."""
        try:
            sub_fd = _open_dir(sub, owners, os.path.join(self.root, sub), root_fd)
        except OSError:
            return False
        try:
            return _unlink_at(name, sub_fd)
        finally:
            os.close(sub_fd)

    def _evict(self, root_fd, owners, keep):
        found, temps = self._scan(root_fd, owners)
        stale = time.time() - _TEMP_MAX_AGE
        for sub, name, st in temps:
            if st.st_mtime < stale:
                self._unlink_in(root_fd, owners, sub, name)
        total = sum(st.st_size for _, _, st in found)
        for key, sub, st in sorted(found, key=lambda e: e[2].st_mtime):
            if total <= self.max_bytes:
                break
            if key == keep:
                continue
            # Gone already (another process evicted it) counts as freed, not as our eviction.
            if self._unlink_in(root_fd, owners, sub, key + ".cubin"):
                self.evictions += 1
            total -= st.st_size

    def _describe(self, root_fd, owners, sub, key, verify, secret):
        """(metadata, problem) of one entry, for entries()."""
        try:
            sub_fd = _open_dir(sub, owners, os.path.join(self.root, sub), root_fd)
        except OSError as e:
            return None, f"unreadable ({e.strerror or e})"
        try:
            fd, st = _open_entry(sub_fd, key + ".cubin", owners, self.max_bytes)
        except _Untrusted as e:
            return None, e.why
        except OSError as e:
            return None, f"unreadable ({e.strerror or e})"
        finally:
            os.close(sub_fd)
        try:
            metadata, problem = _peek(fd, st)
            if verify and problem is None:
                os.lseek(fd, 0, os.SEEK_SET)
                if secret is None or _check(_read_all(fd, st.st_size), key, secret) is None:
                    problem = "failed authentication (rebuilt at its next use)"
            return metadata, problem
        except OSError as e:
            return None, f"unreadable ({e.strerror or e})"
        finally:
            os.close(fd)

    # ---- the shared cache -------------------------------------------------------------------

    def _open_shared(self):
        """(descriptor, owners) of the shared root, or (None, None) when it is missing."""
        real = os.path.realpath(self.shared)
        hint = "ask the administrator who set CLC_CACHE_SHARED_DIR"
        try:
            fd = os.open(real, _DIR_FLAGS)
        except FileNotFoundError:
            return None, None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise _Refused(self.shared, "not a directory", hint) from None
            raise
        try:
            st = os.fstat(fd)
            owners = _Owners(frozenset({0, st.st_uid}),
                             f"root or uid {st.st_uid} (the owner of {real})")
            problem = _untrusted(st, owners, directory=True)
            if problem is not None:
                raise _Refused(self.shared, problem[1], hint)
            if self._shared_checked != (st.st_dev, st.st_ino):
                for ancestor in _ancestors(real):
                    problem = _untrusted(os.stat(ancestor, follow_symlinks=False), owners, True)
                    if problem is not None:
                        raise _Refused(ancestor, problem[1],
                                       f"whoever can write it could have made {real}; {hint}")
                self._shared_checked = (st.st_dev, st.st_ino)
        except BaseException:
            os.close(fd)
            raise
        return fd, owners

    def _get_shared(self, key):
        sub, name = key[:2], key + ".cubin"
        shown = os.path.join(self.shared, sub, name)
        try:
            root_fd, owners = self._open_shared()
            if root_fd is None:
                return None
            try:
                hint = "ask the administrator who set CLC_CACHE_SHARED_DIR"
                sub_fd = _open_dir(sub, owners, os.path.join(self.shared, sub), root_fd,
                                   hint=hint)
                try:
                    fd, st = _open_entry(sub_fd, name, owners, self.max_bytes)
                    try:
                        result = _check(_read_all(fd, st.st_size), key, None)
                    finally:
                        os.close(fd)
                finally:
                    os.close(sub_fd)
            finally:
                os.close(root_fd)
        except FileNotFoundError:
            return None
        except _Untrusted as e:
            self.refused += 1
            self._say(("shared entry", e.kind), f"shared wrapped-kernel cache: ignored {shown}, "
                                                f"{e.why}: taken as missing (said once for "
                                                f"entries like it)")
            return None
        except _Refused as e:
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


def _refusal(refused):
    return f"{refused}: the cache is not used ({refused.hint})"
