# SPDX-License-Identifier: Apache-2.0
"""Where the built shim is, and the environment that preloads it into a program."""

import fcntl
import importlib.machinery
import os
import pathlib
import sys
import sysconfig

import clc
from clc import abi

__all__ = ["preload_path", "bridge_path", "libpython_path", "preload_environment", "settings_fd",
           "SETTINGS_VAR", "FALLBACK_VAR"]

SETTINGS_VAR = abi.SETTINGS_VAR.decode()
FALLBACK_VAR = abi.FALLBACK_VAR.decode()

PACKAGE = pathlib.Path(clc.__file__).resolve().parent


def preload_path():
    """Stage 1, or None when the package was not built (an unbuilt source checkout)."""
    path = PACKAGE / "libclc_preload.so"
    return path if path.exists() else None


def bridge_path():
    """Stage 2 for this interpreter, or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = PACKAGE / "runtime" / f"_bridge{suffix}"
        if path.exists():
            return path
    return None


def libpython_path():
    """The shared libpython a C host loads to start clc's interpreter, or None when this
    Python was built without one (then only Python hosts of this version can be decided)."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    for libdir in (sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib")):
        if libdir and name and os.path.exists(os.path.join(libdir, name)):
            return pathlib.Path(libdir, name)
    return None


def preload_environment(base, *, policy_json, on_error, output, force=False, verbose=False):
    """(environment, settings) for the program: `base` plus the preload (prepended to
    LD_PRELOAD, never replacing it), and the CLC_* settings the shim reads at start-up, which
    reach it through a sealed memfd (settings_fd), not through the environment. The wrap disk
    cache's place, shared place and cap are resolved here, from `base` (clc-run's environment),
    so that the program cannot move them; a bad $CLC_CACHE_MAX_BYTES is a ClcError."""
    # Imported here: clc.runtime loads a part of clc.wrapping only where it is used
    # (clc.wrapping.cache needs only the standard library).
    from clc.wrapping.cache import cache_settings

    cache = cache_settings(base)
    preload = preload_path()
    if preload is None:
        raise FileNotFoundError("the shim is not built: install clc with pip install .")
    env = {k: v for k, v in base.items() if k != SETTINGS_VAR}
    old = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{preload}:{old}" if old else str(preload)
    bridge = bridge_path()
    settings = {
        "CLC_POLICY": policy_json,
        "CLC_ON_ERROR": on_error,
        "CLC_OUTPUT": str(output),
        "CLC_FORCE": "1" if force else "0",
        "CLC_VERBOSE": "1" if verbose else "0",
        "CLC_BRIDGE": str(bridge) if bridge else "",
        "CLC_PYTHON_VERSION": f"{sys.version_info.major}.{sys.version_info.minor}",
        "CLC_PYTHON_LIB": str(libpython_path() or ""),
        "CLC_PYTHON_EXE": sys.executable,
        "CLC_SYS_PATH": os.pathsep.join(p for p in sys.path if p and os.pathsep not in p),
        "CLC_PKG_PATH": str(PACKAGE.parent),
        **cache,
    }
    if base.get("CLC_TENANT"):
        settings["CLC_TENANT"] = base["CLC_TENANT"]
    return env, settings


def settings_fd(settings):
    """A sealed memfd holding `settings` as "KEY=VALUE\0" records (shim/core/settings.c reads it),
    inheritable: its number goes into the program's CLC_SETTINGS_FD."""
    unknown = sorted(set(settings) - abi.SETTINGS)
    if unknown:
        raise ValueError(f"not a clc setting (shim/clc_abi.h's CLC_SETTING_KEYS): "
                         f"{', '.join(unknown)}")
    block = b"".join(f"{k}={v}".encode() + b"\0" for k, v in settings.items())
    if block.count(b"\0") != len(settings):
        raise ValueError("a clc setting contains a NUL byte")
    fd = os.memfd_create(abi.SETTINGS_NAME.decode(), os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
