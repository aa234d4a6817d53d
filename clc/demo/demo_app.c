/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_app: the program `clc demo --no-gpu` runs under clc, over clc's stand-in driver (the
 * fake libcuda of clc's own tests, built beside it): a training loop's worth of launches with
 * nothing on a GPU. Each step launches a GEMM, a softmax and an add; every 50th step a debug
 * kernel too, the kind of launch a policy refuses. It loads its code as PTX text with
 * cuModuleLoadData and launches through cuLaunchKernel, as a driver-API program does, and
 * says what each kind of launch returned.
 *
 *   demo_app [STEPS]      (200 by default)
 */
#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>

#define ENTRY(name) ".visible .entry " name "(\n)\n{\n\tret;\n}\n"
static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n" ENTRY(
    "_Z11sgemm_128x6PKfS0_Pf") ENTRY("_Z7softmaxPfi") ENTRY("_Z6vecAddPKfS0_Pfi")
    ENTRY("_Z12debug_kernelPi");

static const char *const KERNELS[] = {"_Z11sgemm_128x6PKfS0_Pf", "_Z7softmaxPfi",
                                      "_Z6vecAddPKfS0_Pfi", "_Z12debug_kernelPi"};
static const char *const SHOWN[] = {"sgemm_128x6", "softmax", "vecAdd", "debug_kernel"};
#define NKERNELS 4

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        const char *name = NULL;
        cuGetErrorName(rc, &name);
        fprintf(stderr, "demo_app: %s failed: %s (%d)\n", what, name ? name : "?", (int)rc);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 200;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn[NKERNELS];
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(cuModuleLoadData(&mod, PTX), "cuModuleLoadData");
    for (int k = 0; k < NKERNELS; k++)
        check(cuModuleGetFunction(&fn[k], mod, KERNELS[k]), "cuModuleGetFunction");

    int ok[NKERNELS] = {0}, refused[NKERNELS] = {0};
    CUresult last[NKERNELS] = {CUDA_SUCCESS};
    for (int step = 0; step < steps; step++) {
        for (int k = 0; k < NKERNELS; k++) {
            if (k == 3 && step % 50 != 49)
                continue;
            unsigned grid = k == 0 ? 4096 : 256 + step % 4;
            CUresult rc = cuLaunchKernel(fn[k], grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            if (rc == CUDA_SUCCESS) {
                ok[k]++;
            } else {
                refused[k]++;
                last[k] = rc;
            }
        }
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    for (int k = 0; k < NKERNELS; k++) {
        const char *name = "?";
        if (!refused[k]) {
            printf("demo_app: %-12s %4d launched\n", SHOWN[k], ok[k]);
            continue;
        }
        cuGetErrorName(last[k], &name);
        printf("demo_app: %-12s %4d launched, %d refused (%s)\n", SHOWN[k], ok[k], refused[k],
               name);
    }
    cuModuleUnload(mod);
    cuDevicePrimaryCtxRelease(dev);
    return 0;
}
