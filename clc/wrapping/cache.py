# SPDX-License-Identifier: Apache-2.0
"""The caches of wrapped kernels: linked cubins on disk, loaded libraries in the process.

Building a wrapped kernel (its PTX plus wrapper code, compiled and linked) takes a JIT run of
tens to hundreds of milliseconds, so the linked cubin is kept in two places:

- DiskCache (clc.wrapping.disk_cache): one file per cubin under $CLC_CACHE_DIR, this user's
  alone, each entry signed; and the shared cache an administrator fills.
- LibraryCache (clc.wrapping.library_cache): the loaded libraries by key, reference-counted.
"""

from clc.wrapping.disk_cache import (CACHE_SETTINGS, DEFAULT_MAX_BYTES, HEADER_SIZE, MAGIC,
                                     CacheEntry, DiskCache, cache_key, cache_settings)
from clc.wrapping.library_cache import LibraryCache

__all__ = ["cache_key", "cache_settings", "CACHE_SETTINGS", "DiskCache", "CacheEntry",
           "LibraryCache", "MAGIC", "DEFAULT_MAX_BYTES", "HEADER_SIZE"]
