# SPDX-License-Identifier: Apache-2.0
"""Where a run's GPU times come from (`time: true`): CUPTI's kernel activity records where
libcupti is found (shim/records/cupti.c reads them off the launch path), else CUDA events recorded
around each launch (shim/records/timing.c). clc-run names the libcupti it found to the shim
(CLC_CUPTI); the shim prefers one the program has loaded already."""

import ctypes.util
import glob
import importlib.util
import os
import re

MODES = ("auto", "cupti", "events")


def _version(path):
    """(13, 0) of /usr/local/cuda-13.0, for newest first; () where it has none."""
    m = re.search(r"-(\d+)\.(\d+)$", path)
    return (int(m[1]), int(m[2])) if m else ()


def _candidates():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            yield os.path.join(root, "extras", "CUPTI", "lib64")
            yield os.path.join(root, "lib64")
            yield os.path.join(root, "lib")
    # NVIDIA's pip packages (PyTorch's dependencies): nvidia/cu13/lib, nvidia/cuda_cupti/lib;
    # found without importing anything
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13", "cuda_cupti"):
            yield os.path.join(root, sub, "lib")
    tools = sorted(glob.glob("/usr/local/cuda-*"), key=_version, reverse=True)
    for root in ("/usr/local/cuda", *tools):
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
