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


def _driver():
    """(libcuda, None) once cuInit succeeded, else (None, why not)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return None, f"no NVIDIA driver (libcuda.so.1 not loadable: {e})"
    rc = cuda.cuInit(0)
    if rc != 0:
        return None, f"libcuda loaded but cuInit failed (CUresult {rc})"
    return cuda, None


def driver_status():
    """(ok, text) for the NVIDIA driver: version and GPUs, or why there is none."""
    cuda, why = _driver()
    if cuda is None:
        return False, why
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


_CU_DEV_RESOURCE_TYPE_SM = 1
_RESOURCE_BYTES = 144  # CUdevResource_v1: the type, 92 bytes of padding, then the SM resource


def partition_status():
    """(ok, text): whether the GPUs can be partitioned by SMs (green contexts, which sm_share
    confines kernels with), their SM count and the partition step, per device."""
    cuda, _ = _driver()
    if cuda is None:
        return False, "no driver"
    if not hasattr(cuda, "cuDeviceGetDevResource"):
        return False, "this driver has no green contexts (CUDA 12.4 or later has them): " \
            "sm_share needs the splice (mechanism: splice)"
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    parts, ok = [], True
    for i in range(count.value):
        resource = (ctypes.c_uint * (_RESOURCE_BYTES // 4))()
        rc = cuda.cuDeviceGetDevResource(i, resource, _CU_DEV_RESOURCE_TYPE_SM)
        if rc != 0:
            ok = False
            parts.append(f"{i}: cannot be partitioned (CUresult {rc})")
            continue
        sms, step = resource[24], resource[25]
        parts.append(f"{i}: {sms} SMs in steps of {step}")
    return ok and bool(parts), "green contexts: " + ("; ".join(parts) or "no GPU")


def mps_status():
    """(running, text): whether an MPS control daemon runs, which shares across processes
    need (without it the GPU time-slices between processes' contexts)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    running = os.path.exists(os.path.join(pipe, "control"))
    if running:
        return True, f"an MPS daemon is running ({pipe}): shares hold across processes"
    return False, (f"no MPS daemon ({pipe}/control absent): a share holds within a program, "
                   "but processes' contexts time-slice, so shares across processes cannot hold")


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
            print(f"{mark} {name:<11} {text}")

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
        good, text = partition_status()
        line("partitions", good, text, optional=True)
        good, text = mps_status()
        line("MPS", good, text, optional=True)
        lib = libpython_path()
        line("libpython", True, f"{lib} (C and C++ programs can be decided)" if lib else
             "none: this Python has no shared library, so only Python programs of this "
             "version can be decided")
        for name, lib in (("nvJitLink", "nvJitLink"), ("NVRTC", "nvrtc")):
            found = _library([lib])
            line(name, found is not None, f"{found or 'not found'} (needed by wrap rules only)",
                 optional=True)
        plugin = os.path.join(os.path.dirname(preload_path() or __file__), "libclc_spank.so")
        if os.path.exists(plugin):
            line("Slurm", True, f"plugstack.conf: required {plugin} policy=/etc/clc/policy.yaml "
                 f"python={sys.executable} (docs/deploy.md)", optional=True)
        else:
            line("Slurm", False, "SPANK plugin not built (spank.h was missing when clc was "
                 "installed: install libslurm-dev, then clc)", optional=True)
        return 0 if ok else 1
