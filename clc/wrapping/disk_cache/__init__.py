# SPDX-License-Identifier: Apache-2.0
"""The disk cache of wrapped kernels: linked cubins, one file each (clc.wrapping.cache).

DiskCache: one file per cubin under $CLC_CACHE_DIR (~/.cache/clc), named by cache_key() of
everything the build depends on, shared by every process of every run of one user, and
after it the read-only cache that an administrator filled ($CLC_CACHE_SHARED_DIR). A cubin
taken from the cache runs inside the user's program, with the user's rights, so on a machine
shared with others the cache takes only what the user (or, in the shared cache, its owner)
wrote. One module per part:

    settings.py  where the cache is and its cap: clc-run's choice, sealed for the program
    layout.py    keys, file names and the entry format (header, HMAC, sha256, metadata)
    trust.py     which directories and entries are taken, walked by descriptor
    secret.py    the user's HMAC key, <root>/key
    tree.py      the user's tree: its root, its files found and removed, the size cap
    shared.py    the administrator's shared cache, trusted by ownership
    listing.py   `clc cache ls|stats|clear`: the entries, the numbers, the removal
    store.py     DiskCache: get and put, and what is said once
"""

from clc.wrapping.disk_cache.layout import HEADER_SIZE, MAGIC, cache_key
from clc.wrapping.disk_cache.listing import CacheEntry
from clc.wrapping.disk_cache.settings import CACHE_SETTINGS, DEFAULT_MAX_BYTES, cache_settings
from clc.wrapping.disk_cache.store import DiskCache

__all__ = ["cache_key", "cache_settings", "CACHE_SETTINGS", "DiskCache", "CacheEntry", "MAGIC",
           "DEFAULT_MAX_BYTES", "HEADER_SIZE"]
