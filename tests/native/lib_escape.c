/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libescape.so: a library that tries the loader's ordinary ways around the shim. Linked with
 * the driver, and opened by prog_escape with RTLD_LOCAL: "next" after it is the driver, and its
 * own cuLaunchKernel (which it never uses for launches) is no part of the program's chain of
 * definitions.
 *   escape_next(f)    launches f through dlsym(RTLD_NEXT, "cuLaunchKernel"), asked from a
 *                     library that defines cuLaunchKernel itself
 *   escape_dlmopen()  opens libcuda.so.1 in a new link-map namespace with dlmopen
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params,
                        void **extra)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    (void)stream, (void)params, (void)extra;
    return (CUresult)999;
}

CUresult escape_next(CUfunction f)
{
    launch_fn next = (launch_fn)dlsym(RTLD_NEXT, "cuLaunchKernel");
    return next ? next(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) : CUDA_ERROR_NOT_FOUND;
}

int escape_dlmopen(void)
{
    void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
    const char *err = h ? NULL : dlerror();
    printf("dlmopen %s%s\n", h ? "opened" : "refused: ", err ? err : "");
    return h != NULL;
}
