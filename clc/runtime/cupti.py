# SPDX-License-Identifier: Apache-2.0
"""Where a run's GPU times come from (`time: true`): CUPTI's kernel activity records where
libcupti is found (shim/cupti.c reads them off the launch path), else CUDA events recorded
around each launch (shim/timing.c). clc-run names the libcupti it found to the shim
(CLC_CUPTI); the shim prefers one the program has loaded already."""

import ctypes.util
import glob
import importlib.util
import os

MODES = ("auto", "cupti", "events")


def _candidates():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            yield os.path.join(root, "extras", "CUPTI", "lib64")
            yield os.path.join(root, "lib64")
            yield os.path.join(root, "lib")
    # the pip package NVIDIA ships it in (PyTorch's dependency)
    try:
        spec = importlib.util.find_spec("nvidia.cuda_cupti")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        yield os.path.join(root, "lib")
    for root in ("/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)):
        yield os.path.join(root, "extras", "CUPTI", "lib64")
        yield os.path.join(root, "lib64")
        yield os.path.join(root, "lib")
        yield os.path.join(root, "targets", "x86_64-linux", "lib")


def find_cupti():
    """The path of a libcupti shared object, or None."""
    for d in _candidates():
        for name in ("libcupti.so", "libcupti.so.13", "libcupti.so.12"):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                return os.path.realpath(p)
    name = ctypes.util.find_library("cupti")
    return name or None


def timing_settings(mode, path=None):
    """The shim's settings for --timing MODE [--cupti PATH]."""
    if mode == "events":
        return {"CLC_TIMING": "events"}
    found = path or find_cupti()
    settings = {"CLC_TIMING": mode}
    if found:
        settings["CLC_CUPTI"] = found
    return settings
