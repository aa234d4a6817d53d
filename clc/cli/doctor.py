# SPDX-License-Identifier: Apache-2.0
"""`clc doctor`: what clc needs, found or not, one line each."""

import ctypes
import ctypes.util
import os
import subprocess
import sys

from clc import __version__
from clc.runtime.shim import bridge_path, libpython_path, preload_path

__all__ = ["DoctorCommand", "driver_status"]


def driver_status():
    """(ok, text) for the NVIDIA driver: version and GPUs, or why there is none."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return False, f"no NVIDIA driver (libcuda.so.1 not loadable: {e})"
    rc = cuda.cuInit(0)
    if rc != 0:
        return False, f"libcuda loaded but cuInit failed (CUresult {rc})"
    version = ctypes.c_int()
    count = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    cuda.cuDeviceGetCount(ctypes.byref(count))
    names = []
    for i in range(count.value):
        dev = ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(dev), i) == 0:
            cuda.cuDeviceGetName(name, 256, dev)
            names.append(f"{i}: {name.value.decode(errors='replace')}")
    v = version.value
    return True, f"CUDA driver API {v // 1000}.{v % 1000 // 10}, {count.value} GPU(s): " + (
        "; ".join(names) or "none")


def _library(names):
    """Where a library is found, or None."""
    for name in names:
        found = ctypes.util.find_library(name)
        try:
            ctypes.CDLL(found or f"lib{name}.so")
            return f"found ({found or f'lib{name}.so'})"
        except OSError:
            continue
    try:
        from cuda.bindings import nvjitlink, nvrtc  # noqa: F401

        return "found (through cuda-bindings)"
    except Exception:
        return None


class DoctorCommand:
    name = "doctor"
    help = "check the driver, the GPUs, the shim, the bridge and the JIT libraries"

    @staticmethod
    def add_arguments(parser):
        pass

    def run(self, args):
        ok = True

        def line(name, good, text, optional=False):
            nonlocal ok
            ok = ok and (good or optional)
            mark = "ok  " if good else "-   " if optional else "FAIL"
            print(f"{mark} {name:<10} {text}")

        line("clc", True, f"{__version__} on Python {sys.version.split()[0]} ({sys.executable})")
        good, text = driver_status()
        line("driver", good, text)
        preload = preload_path()
        if preload:
            env = dict(os.environ, LD_PRELOAD=str(preload))
            probe = subprocess.run(["/bin/true"], env=env, capture_output=True, text=True)
            good = probe.returncode == 0 and not probe.stderr
            line("shim", good, f"{preload} " + ("loads" if good else f"fails: {probe.stderr}"))
        else:
            line("shim", False, "not built (pip install . builds it)")
        bridge = bridge_path()
        line("bridge", bridge is not None,
             f"{bridge} (Python {sys.version_info.major}.{sys.version_info.minor})" if bridge
             else "not built for this Python")
        lib = libpython_path()
        line("libpython", True, f"{lib} (C and C++ programs can be decided)" if lib else
             "none: this Python has no shared library, so only Python programs of this "
             "version can be decided")
        for name, lib in (("nvJitLink", "nvJitLink"), ("NVRTC", "nvrtc")):
            found = _library([lib])
            line(name, found is not None, f"{found or 'not found'} (needed by wrap rules only)",
                 optional=True)
        return 0 if ok else 1
