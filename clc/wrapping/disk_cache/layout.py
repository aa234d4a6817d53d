# SPDX-License-Identifier: Apache-2.0
"""The disk cache's keys, file names and entry format.

An entry is <root>/<key[:2]>/<key>.cubin: a header, the metadata (JSON) and the payload (a
linked cubin). The header carries an HMAC-SHA256 over the format, the key, the lengths, the
metadata and the payload, checked in the user's own cache (its key: clc.wrapping.disk_cache.
secret), and a sha256 over the same bytes, checked in the shared cache. Signing the key too
makes an entry moved to another key's name fail as a rewritten one does.
"""

import hashlib
import hmac
import json
import os
import re
import secrets
import struct

__all__ = ["MAGIC", "HEADER_SIZE", "MAX_METADATA", "cache_key", "check_key", "is_key",
           "is_temp", "temp_name", "encode", "check", "peek", "parse_metadata"]

MAGIC = b"CLCCUBN2"
# The format whose files carried only a sha256 of the payload: such files are replaced
# without a message, as they are expected in any cache that an older clc used.
_OLD_MAGICS = (b"CLCCUBN1",)
# magic, HMAC-SHA256 (checked in the user's own cache), sha256 (checked in the shared cache),
# payload length (u64 LE), metadata length (u32 LE); both digests cover _signed_parts().
_HEADER = struct.Struct("<8s32s32sQI")
HEADER_SIZE = _HEADER.size
MAX_METADATA = 64 * 1024
_KEY = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"\.[0-9a-f]{64}\.\d+\.[0-9a-f]+\.tmp")


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


def check_key(key):
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"a cache key is 64 lowercase hex characters, got {key!r}")
    return key


def is_key(name):
    return _KEY.fullmatch(name) is not None


def temp_name(key):
    """A name for an entry being written, unique to this process and call; is_temp knows it."""
    return f".{key}.{os.getpid()}.{secrets.token_hex(6)}.tmp"


def is_temp(name):
    return _TEMP.fullmatch(name) is not None


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


def encode(key, meta, payload, secret):
    header = _HEADER.pack(MAGIC, _mac(secret, key, meta, payload), _sha(key, meta, payload),
                          len(payload), len(meta))
    return header, meta, payload


def check(blob, key, secret):
    """(payload, metadata) when blob is a whole entry for key, its HMAC verified with secret,
    or with secret None (the shared cache) its sha256; "stale" for the older format; None
    when it fails."""
    if blob[:len(MAGIC)] in _OLD_MAGICS:
        return "stale"
    if len(blob) < _HEADER.size:
        return None
    magic, mac, digest, size, meta_size = _HEADER.unpack_from(blob)
    if (magic != MAGIC or meta_size > MAX_METADATA
            or len(blob) != _HEADER.size + meta_size + size):
        return None
    view = memoryview(blob)
    meta = view[_HEADER.size:_HEADER.size + meta_size]
    payload = view[_HEADER.size + meta_size:]
    if secret is None:
        good = hmac.compare_digest(_sha(key, meta, payload), digest)
    else:
        good = hmac.compare_digest(_mac(secret, key, meta, payload), mac)
    metadata = parse_metadata(bytes(meta)) if good else None
    return None if metadata is None else (bytes(payload), metadata)


def peek(fd, st):
    """(metadata, problem) from an entry's header alone (its digests not checked)."""
    head = os.read(fd, _HEADER.size)
    if head[:len(MAGIC)] in _OLD_MAGICS:
        return None, "written in an older format (replaced at its next use)"
    if len(head) < _HEADER.size:
        return None, "damaged (shorter than a header)"
    magic, _, _, size, meta_size = _HEADER.unpack(head)
    if magic != MAGIC or meta_size > MAX_METADATA:
        return None, "damaged (not a clc cache header)"
    metadata = parse_metadata(os.read(fd, meta_size))
    if metadata is None:
        return None, "damaged (unreadable metadata)"
    if st.st_size != _HEADER.size + meta_size + size:
        return metadata, "damaged (its size does not match its header)"
    return metadata, None


def parse_metadata(raw):
    if not raw:
        return {}
    try:
        metadata = json.loads(raw)
    except ValueError:
        return None
    return metadata if isinstance(metadata, dict) else None
