# SPDX-License-Identifier: Apache-2.0
"""pyhost: a Python host program for the shim tests, run as `python3 pyhost.py` with
LD_LIBRARY_PATH pointing at the fake driver.

It reaches the driver as Python CUDA bindings do: ctypes.CDLL("libcuda.so.1") dlopens it and
every attribute lookup is a dlsym. It loads a module (CUfunction handles) and a library (CUkernel
handles), launches through cuLaunchKernel, cuLaunchKernelEx and the cuLaunchKernel_ptsz that
cuGetProcAddress_v2 returns for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, and prints the
same lines as the C programs (see common.h), ending with the fake driver's counts.

The shim under test calls back into Python inside this interpreter during a launch: ctypes
releases the GIL around each foreign call, so the shim can take it.

Driver counts without a shim: vecAdd launches=3, scale launches=2, debug_kernel launches=1.
"""

from __future__ import annotations

import ctypes
import struct
import sys

K_VECADD = b"_Z6vecAddPKfS0_Pfi"
K_SCALE = b"_Z5scalePff"
K_DEBUG = b"_Z12debug_kernelPi"

PTX_HEADER = b".version 8.0\n.target sm_90\n.address_size 64\n"


def ptx_entry(name: bytes) -> bytes:
    return b".visible .entry " + name + b"(\n)\n{\n\tret;\n}\n"


APP_PTX = PTX_HEADER + ptx_entry(K_VECADD) + ptx_entry(K_SCALE) + ptx_entry(K_DEBUG)


def fatbin(ptx: bytes) -> bytes:
    """A fatbin container (magic, version, header size, payload size) holding one uncompressed
    PTX entry for compute_90, laid out as nvcc's fatbinary writes it (clc/wrapping/fatbin.py)."""
    text = ptx + b"\0"
    text += b"\0" * (-len(text) % 8)
    # kind 1 (PTX), format 0x0101, header 80 bytes, payload, uncompressed, options block at 64,
    # PTX ISA 8.0, arch 90, no identifier, flags 64-bit Linux code; the options block names an
    # empty string at 72
    entry = struct.pack("<HHIQIIHHIIIQQQIIQ", 1, 0x0101, 80, len(text), 0, 64, 0, 8, 90, 0, 0,
                        0x11, 0, 0, 72, 0, 0) + text
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entry)) + entry


CUresult = ctypes.c_int
CUdevice = ctypes.c_int
CUhandle = ctypes.c_void_p  # CUcontext, CUmodule, CUfunction, CUlibrary, CUkernel, CUevent...
P = ctypes.POINTER

CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
CU_LIBRARY_BINARY_IS_PRESERVED = 1


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", CUhandle),
        ("attrs", ctypes.c_void_p),
        ("numAttrs", ctypes.c_uint),
    ]


LAUNCH_ARGTYPES = [CUhandle] + [ctypes.c_uint] * 7 + [CUhandle, P(ctypes.c_void_p),
                                                      P(ctypes.c_void_p)]
PFN_cuLaunchKernel = ctypes.CFUNCTYPE(CUresult, *LAUNCH_ARGTYPES)

# name -> argument types; restype is CUresult for all.
SIGNATURES = {
    "cuInit": [ctypes.c_uint],
    "cuDeviceGet": [P(CUdevice), ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [P(CUhandle), CUdevice],
    "cuDevicePrimaryCtxRelease_v2": [CUdevice],
    "cuCtxSetCurrent": [CUhandle],
    "cuModuleLoadData": [P(CUhandle), ctypes.c_char_p],
    "cuModuleGetFunction": [P(CUhandle), CUhandle, ctypes.c_char_p],
    "cuModuleUnload": [CUhandle],
    "cuLibraryLoadData": [P(CUhandle), ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_uint, P(ctypes.c_int), P(ctypes.c_void_p), ctypes.c_uint],
    "cuLibraryGetKernel": [P(CUhandle), CUhandle, ctypes.c_char_p],
    "cuLibraryUnload": [CUhandle],
    "cuKernelGetName": [P(ctypes.c_char_p), CUhandle],
    "cuLaunchKernel": LAUNCH_ARGTYPES,
    "cuLaunchKernelEx": [P(CUlaunchConfig), CUhandle, P(ctypes.c_void_p), P(ctypes.c_void_p)],
    "cuEventCreate": [P(CUhandle), ctypes.c_uint],
    "cuEventRecord": [CUhandle, CUhandle],
    "cuEventSynchronize": [CUhandle],
    "cuEventElapsedTime_v2": [P(ctypes.c_float), CUhandle, CUhandle],
    "cuEventDestroy_v2": [CUhandle],
    "cuGetProcAddress_v2": [ctypes.c_char_p, P(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                            P(ctypes.c_int)],
}


def load_driver() -> ctypes.CDLL:
    cuda = ctypes.CDLL("libcuda.so.1")
    for name, argtypes in SIGNATURES.items():
        fn = getattr(cuda, name)  # dlsym
        fn.argtypes = argtypes
        fn.restype = CUresult
    return cuda


def check(what: str, rc: int) -> None:
    """A set-up call must succeed; a launch result is only printed (see report)."""
    if rc != 0:
        sys.exit(f"FAILED {what} -> {rc}")


def report(what: str, subject: bytes | str, via: str, rc: int) -> None:
    subject = subject.decode() if isinstance(subject, bytes) else subject
    print(f"{what} {subject} via {via} -> {rc}", flush=True)


def print_fake_counts(cuda: ctypes.CDLL) -> None:
    """The `fake:` and `fake-entry:` lines, as print_fake_counts() in common.h prints them."""
    ulong, name_fn = ctypes.c_ulong, cuda.fake_cuda_kernel_name
    name_fn.restype = ctypes.c_char_p
    name_fn.argtypes = [ctypes.c_uint]
    cuda.fake_cuda_kernel_count.restype = ctypes.c_uint
    cuda.fake_cuda_entry_name.restype = ctypes.c_char_p
    cuda.fake_cuda_entry_name.argtypes = [ctypes.c_uint]
    for fn in (cuda.fake_cuda_launch_count, cuda.fake_cuda_graph_launch_count,
               cuda.fake_cuda_entry_count):
        fn.restype = ulong
        fn.argtypes = [ctypes.c_char_p]
    for i in range(cuda.fake_cuda_kernel_count()):
        name = name_fn(i)
        print(f"fake: {name.decode()} launches={cuda.fake_cuda_launch_count(name)} "
              f"graph={cuda.fake_cuda_graph_launch_count(name)}")
    i = 0
    while (entry := cuda.fake_cuda_entry_name(i)) is not None:
        print(f"fake-entry: {entry.decode()} calls={cuda.fake_cuda_entry_count(entry)}")
        i += 1
    sys.stdout.flush()


def main() -> int:
    cuda = load_driver()
    dev, ctx = CUdevice(), CUhandle()
    check("cuInit", cuda.cuInit(0))
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))

    # The per-thread-stream launch, as bindings that ask cuGetProcAddress get it.
    fn_ptr, status = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = cuda.cuGetProcAddress_v2(b"cuLaunchKernel", ctypes.byref(fn_ptr), 12000,
                                  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                  ctypes.byref(status))
    print(f"getproc cuLaunchKernel version=12000 flags=2 -> {rc} status={status.value}", flush=True)
    check("cuGetProcAddress_v2(cuLaunchKernel)", rc)
    launch_ptsz = PFN_cuLaunchKernel(fn_ptr.value)

    # Module code: CUfunction handles.
    mod, vecadd, debug = CUhandle(), CUhandle(), CUhandle()
    check("cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(mod), APP_PTX))
    check("cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(vecadd), mod, K_VECADD))
    check("cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(debug), mod, K_DEBUG))

    # Library code: CUkernel handles (the container bytes outlive the library: preserved).
    image = fatbin(APP_PTX)
    lib, scale = CUhandle(), CUhandle()
    opt = (ctypes.c_int * 1)(CU_LIBRARY_BINARY_IS_PRESERVED)
    val = (ctypes.c_void_p * 1)(1)
    check("cuLibraryLoadData",
          cuda.cuLibraryLoadData(ctypes.byref(lib), image, None, None, 0, opt, val, 1))
    check("cuLibraryGetKernel", cuda.cuLibraryGetKernel(ctypes.byref(scale), lib, K_SCALE))
    name = ctypes.c_char_p()
    rc = cuda.cuKernelGetName(ctypes.byref(name), scale)
    report("name", name.value if rc == 0 else "?", "cuKernelGetName", rc)

    # kernelParams: an array of pointers to the argument values.
    a, n = ctypes.c_float(1.0), ctypes.c_int(1024)
    args = (ctypes.c_void_p * 4)(*(ctypes.addressof(x) for x in (a, a, a, n)))

    report("launch", K_VECADD, "cuLaunchKernel",
           cuda.cuLaunchKernel(vecadd, 4, 1, 1, 256, 1, 1, 0, None, args, None))
    report("launch", K_VECADD, "cuLaunchKernel_ptsz",
           launch_ptsz(vecadd, 4, 1, 1, 256, 1, 1, 0, None, args, None))
    report("launch", K_SCALE, "cuLaunchKernel",
           cuda.cuLaunchKernel(scale, 2, 1, 1, 128, 1, 1, 0, None, args, None))
    cfg = CUlaunchConfig(8, 1, 1, 128, 1, 1, 0, None, None, 0)
    report("launch", K_SCALE, "cuLaunchKernelEx",
           cuda.cuLaunchKernelEx(ctypes.byref(cfg), scale, args, None))
    report("launch", K_DEBUG, "cuLaunchKernel",
           cuda.cuLaunchKernel(debug, 1, 1, 1, 32, 1, 1, 0, None, args, None))

    start, end, ms = CUhandle(), CUhandle(), ctypes.c_float()
    check("cuEventCreate", cuda.cuEventCreate(ctypes.byref(start), 0))
    check("cuEventCreate", cuda.cuEventCreate(ctypes.byref(end), 0))
    check("cuEventRecord", cuda.cuEventRecord(start, None))
    report("launch", K_VECADD, "cuLaunchKernel",
           cuda.cuLaunchKernel(vecadd, 4, 1, 1, 256, 1, 1, 0, None, args, None))
    check("cuEventRecord", cuda.cuEventRecord(end, None))
    check("cuEventSynchronize", cuda.cuEventSynchronize(end))
    rc = cuda.cuEventElapsedTime_v2(ctypes.byref(ms), start, end)
    print(f"event elapsed_ms={ms.value:.6f} -> {rc}", flush=True)
    check("cuEventDestroy", cuda.cuEventDestroy_v2(start))
    check("cuEventDestroy", cuda.cuEventDestroy_v2(end))

    check("cuModuleUnload", cuda.cuModuleUnload(mod))
    check("cuLibraryUnload", cuda.cuLibraryUnload(lib))
    check("cuDevicePrimaryCtxRelease", cuda.cuDevicePrimaryCtxRelease_v2(dev))
    print_fake_counts(cuda)
    return 0


if __name__ == "__main__":
    sys.exit(main())
