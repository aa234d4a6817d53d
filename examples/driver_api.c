// SPDX-License-Identifier: Apache-2.0
//
// driver_api: a CUDA driver-API program for clc's GPU tests. It never touches the runtime:
// the kernels come as PTX text, loaded with cuModuleLoadData and launched with
// cuLaunchKernel, the path most JIT-based frameworks take.
//
//   driver_api <driver_kernels.ptx> [iterations]
//
// The PTX comes from `nvcc -ptx -arch=sm_90 examples/driver_kernels.cu`. Build, linking
// libcuda directly (nvcc adds the toolkit's stub directory):
//   nvcc -O2 -o driver_api examples/driver_api.c -lcuda
//
// Kernels (extern "C" names) and launches:
//   saxpy  iterations times, each launch timed with driver events around it
//   fill   2 * iterations times
//
// Output, same line formats as examples/vecadd.cu:
//   info driver_api iterations=<i> n=<n>
//   cuda_error <kernel> <cuGetErrorName>   first time each (kernel, error) pair is seen
//   count <kernel> <launches attempted>
//   errors <kernel> <n>                    only for kernels that had errors
//   event_ms saxpy <total ms>
//   result <kernel> ok|mismatch|skipped
// Exit status: 0, 1 on a mismatch, 2 on bad usage, 3 when anything but a launch fails.

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXAMPLE_NAME "driver_api"
#include "driver_util.h"

enum { K_SAXPY, K_FILL, K_COUNT };
static const char *kernel_names[K_COUNT] = {"saxpy", "fill"};
static long launches[K_COUNT];
static long errors[K_COUNT];

#define MAX_SEEN 16
static const char *seen[K_COUNT][MAX_SEEN];
static int n_seen[K_COUNT];

// Each distinct error per kernel is printed once; a denied kernel fails every launch.
static void after_launch(int k, CUresult r) {
    launches[k]++;
    if (r == CUDA_SUCCESS)
        return;
    const char *name = error_name(r);
    errors[k]++;
    for (int s = 0; s < n_seen[k]; ++s)
        if (strcmp(seen[k][s], name) == 0)
            return;
    if (n_seen[k] < MAX_SEEN)
        seen[k][n_seen[k]++] = name;
    printf("cuda_error %s %s\n", kernel_names[k], name);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: driver_api <driver_kernels.ptx> [iterations]\n");
        return 2;
    }
    int iterations = argc > 2 ? atoi(argv[2]) : 100;
    if (iterations < 1) {
        fprintf(stderr, "driver_api: iterations must be >= 1\n");
        return 2;
    }
    char *ptx = read_file(argv[1]);
    if (!ptx) {
        fprintf(stderr, "driver_api: cannot read PTX from %s\n", argv[1]);
        return 2;
    }

    const int n = 1 << 20;
    const unsigned block = 256;
    const unsigned grid = (n + block - 1) / block;

    REQUIRE(cuInit(0));
    CUdevice dev;
    REQUIRE(cuDeviceGet(&dev, 0));
    // The primary context, as the runtime would use: its creation API is the same in every
    // CUDA version (cuCtxCreate changed signature in 13).
    CUcontext ctx;
    REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev));
    REQUIRE(cuCtxSetCurrent(ctx));

    printf("info driver_api iterations=%d n=%d\n", iterations, n);

    CUmodule mod;
    CUresult lr = cuModuleLoadData(&mod, ptx);
    if (lr != CUDA_SUCCESS) {
        explain_load_failure(ptx);
        REQUIRE(lr);
    }
    CUfunction f_saxpy, f_fill;
    REQUIRE(cuModuleGetFunction(&f_saxpy, mod, "saxpy"));
    REQUIRE(cuModuleGetFunction(&f_fill, mod, "fill"));

    float *hx = (float *)malloc(sizeof(float) * n);
    float *hy = (float *)malloc(sizeof(float) * n);
    float *hout = (float *)malloc(sizeof(float) * n);
    int *hd = (int *)malloc(sizeof(int) * n);
    if (!hx || !hy || !hout || !hd) {
        fprintf(stderr, "driver_api: out of host memory\n");
        return 3;
    }
    // Small integers: a*x + y is exact in float, fused or not.
    for (int i = 0; i < n; ++i) {
        hx[i] = (float)(i % 100);
        hy[i] = (float)(i % 7);
    }

    CUdeviceptr dx, dy, dout, dd;
    REQUIRE(cuMemAlloc(&dx, sizeof(float) * n));
    REQUIRE(cuMemAlloc(&dy, sizeof(float) * n));
    REQUIRE(cuMemAlloc(&dout, sizeof(float) * n));
    REQUIRE(cuMemAlloc(&dd, sizeof(int) * n));
    REQUIRE(cuMemcpyHtoD(dx, hx, sizeof(float) * n));
    REQUIRE(cuMemcpyHtoD(dy, hy, sizeof(float) * n));
    REQUIRE(cuMemsetD32(dout, 0, n));
    REQUIRE(cuMemsetD32(dd, 0, n));

    CUevent ev0, ev1;
    REQUIRE(cuEventCreate(&ev0, CU_EVENT_DEFAULT));
    REQUIRE(cuEventCreate(&ev1, CU_EVENT_DEFAULT));
    double saxpy_ms = 0.0;

    float a = 2.0f;
    int n_arg = n;
    int last_value = -1;
    for (int it = 0; it < iterations; ++it) {
        void *saxpy_args[] = {&a, &dx, &dy, &dout, &n_arg};
        REQUIRE(cuEventRecord(ev0, NULL));
        CUresult r = cuLaunchKernel(f_saxpy, grid, 1, 1, block, 1, 1, 0, NULL, saxpy_args, NULL);
        after_launch(K_SAXPY, r);
        REQUIRE(cuEventRecord(ev1, NULL));
        REQUIRE(cuEventSynchronize(ev1));
        float ms = 0.0f;
        REQUIRE(cuEventElapsedTime(&ms, ev0, ev1));
        saxpy_ms += ms;

        for (int j = 0; j < 2; ++j) {
            int value = it * 2 + j;
            void *fill_args[] = {&dd, &value, &n_arg};
            r = cuLaunchKernel(f_fill, grid, 1, 1, block, 1, 1, 0, NULL, fill_args, NULL);
            after_launch(K_FILL, r);
            last_value = value;
        }
    }

    CUresult sr = cuCtxSynchronize();
    if (sr != CUDA_SUCCESS) {
        printf("cuda_error sync %s\n", error_name(sr));
        fprintf(stderr, "driver_api: cuCtxSynchronize: %s\n", error_name(sr));
        return 3;
    }
    REQUIRE(cuMemcpyDtoH(hout, dout, sizeof(float) * n));
    REQUIRE(cuMemcpyDtoH(hd, dd, sizeof(int) * n));

    long first_bad[K_COUNT] = {-1, -1};
    for (int i = 0; i < n && first_bad[K_SAXPY] < 0; ++i)
        if (hout[i] != a * hx[i] + hy[i])
            first_bad[K_SAXPY] = i;
    for (int i = 0; i < n && first_bad[K_FILL] < 0; ++i)
        if (hd[i] != last_value + (i % 13))
            first_bad[K_FILL] = i;

    const char *result[K_COUNT];
    int bad = 0;
    for (int k = 0; k < K_COUNT; ++k) {
        if (errors[k]) {
            result[k] = "skipped";
        } else if (first_bad[k] >= 0) {
            result[k] = "mismatch";
            bad = 1;
            fprintf(stderr, "driver_api: %s result wrong at index %ld\n", kernel_names[k],
                    first_bad[k]);
        } else {
            result[k] = "ok";
        }
    }

    for (int k = 0; k < K_COUNT; ++k)
        printf("count %s %ld\n", kernel_names[k], launches[k]);
    for (int k = 0; k < K_COUNT; ++k)
        if (errors[k])
            printf("errors %s %ld\n", kernel_names[k], errors[k]);
    printf("event_ms saxpy %.4f\n", saxpy_ms);
    for (int k = 0; k < K_COUNT; ++k)
        printf("result %s %s\n", kernel_names[k], result[k]);

    cuEventDestroy(ev0);
    cuEventDestroy(ev1);
    cuMemFree(dx);
    cuMemFree(dy);
    cuMemFree(dout);
    cuMemFree(dd);
    cuModuleUnload(mod);
    cuDevicePrimaryCtxRelease(dev);
    free(ptx);
    free(hx);
    free(hy);
    free(hout);
    free(hd);
    return bad ? 1 : 0;
}
