# SPDX-License-Identifier: Apache-2.0
"""Where the disk cache is and how large it may grow.

Inside a program that clc-run started, the place, the shared place and the cap are the ones
clc-run resolved from its own environment before the program started (cache_settings) and
sealed into the program's settings (DiskCache.from_settings): the program's environment,
$HOME and working directory included, cannot move the cache or the key in its root. The
environment is read only by a cache made without them (`clc cache`, `clc wrap`, tests).
"""

import os
import re

from clc.errors import EXIT_USAGE, ClcError

__all__ = ["CACHE_SETTINGS", "DEFAULT_MAX_BYTES", "cache_settings", "env_max_bytes",
           "absolute"]

DEFAULT_MAX_BYTES = 1 << 30
_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# The program's settings that fix its disk cache (clc/runtime/engine.py reads the same names
# from the sealed settings without importing this module).
CACHE_SETTINGS = ("CLC_CACHE_DIR", "CLC_CACHE_SHARED_DIR", "CLC_CACHE_MAX_BYTES")


def env_max_bytes(environ, exit_code=1):
    text = environ.get("CLC_CACHE_MAX_BYTES", "")
    if not text.strip():
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ClcError(f"CLC_CACHE_MAX_BYTES={text!r}: expected a number of bytes, "
                       f"optionally with a K, M, G or T suffix (e.g. 1073741824 or 1G)",
                       exit_code)
    return int(m.group(1)) * _SIZE_SUFFIXES[m.group(2).lower()]


def absolute(path, environ=None):
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
        "CLC_CACHE_DIR": absolute(environ.get("CLC_CACHE_DIR") or "~/.cache/clc", environ),
        "CLC_CACHE_SHARED_DIR": absolute(shared, environ) if shared else "",
        "CLC_CACHE_MAX_BYTES": str(env_max_bytes(environ, EXIT_USAGE)),
    }
