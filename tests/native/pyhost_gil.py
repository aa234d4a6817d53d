# SPDX-License-Identifier: Apache-2.0
"""pyhost_gil: a Python program whose main thread holds the GIL while a native thread launches
a kernel the process never launched before, run as `python3 pyhost_gil.py` with
LD_LIBRARY_PATH pointing at the fake driver.

The main thread waits for that launch inside a ctypes.PyDLL call (which keeps the GIL), for at
most two seconds, and prints

    held-launch returned=<0|1> result=<CUresult>

A shim that must enter this interpreter to decide the new kernel cannot until the hold ends:
returned=0.
"""

import ctypes
import sys

from pyhost import APP_PTX, K_SCALE, CUdevice, CUhandle, check, load_driver


def main() -> int:
    cuda = load_driver()
    dev, ctx, mod, scale = CUdevice(), CUhandle(), CUhandle(), CUhandle()
    check("cuInit", cuda.cuInit(0))
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))
    check("cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(mod), APP_PTX))
    check("cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(scale), mod, K_SCALE))

    cuda.fake_cuda_launch_when_held.argtypes = [CUhandle, CUhandle]
    check("fake_cuda_launch_when_held", cuda.fake_cuda_launch_when_held(ctx, scale))
    holding = ctypes.PyDLL(cuda._name).fake_cuda_hold
    holding.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int)]
    result = ctypes.c_int(-1)
    returned = holding(2000, ctypes.byref(result))
    print(f"held-launch returned={returned} result={result.value}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
