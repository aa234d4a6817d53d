# SPDX-License-Identifier: Apache-2.0
"""Wrapped kernels: the wrappers and their parameters (spec), PTX parsed and spliced (ptx,
splice), fatbins and ELF images (fatbin), the build by NVRTC and nvJitLink (build), the memory
and disk caches (cache), the in-process side that finds a kernel's PTX and loads the wrapped
library (engine), and the device runtime the wrappers link with (device/runtime.cu).

Nothing is imported here: clc.wrapping.spec is standard library only, the rest needs cuda-python.
"""
