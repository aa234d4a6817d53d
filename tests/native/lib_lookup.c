/* SPDX-License-Identifier: Apache-2.0 */
/*
 * liblookup.so: launches through driver functions it finds itself: dlsym(RTLD_NEXT) (linked
 * after the preloaded shim, "next" from here is libcuda), and through
 * cuLaunchCooperativeKernelMultiDevice.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

CUresult lookup_launch_next(CUfunction f)
{
    launch_fn launch = (launch_fn)dlsym(RTLD_NEXT, "cuLaunchKernel");
    return launch ? launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) : CUDA_ERROR_NOT_FOUND;
}

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
CUresult lookup_launch_multi(CUfunction f)
{
    CUDA_LAUNCH_PARAMS p = {.function = f, .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                            .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1,
                            .sharedMemBytes = 0, .hStream = NULL, .kernelParams = NULL};
    return cuLaunchCooperativeKernelMultiDevice(&p, 1, 0);
}
