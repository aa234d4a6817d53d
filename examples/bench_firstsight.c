// SPDX-License-Identifier: Apache-2.0
//
// bench_firstsight: what the first launch of a new kernel costs.
//
//   bench_firstsight [kernels]
//
// clc decides once per kernel: at its first launch the shim names the kernel and asks the
// Python engine (and its hooks). This program loads one module of `kernels` distinct empty
// kernels, launches each once more than once, and times, per kernel, its first launch and
// its second: the difference is what a first sight costs (under clc: the decision; natively:
// the driver's own first-launch work, such as lazy loading). Run it natively and under
// clc-run and compare the medians.
//
// Output:
//   info bench_firstsight kernels=<n>
//   us_first_launch <median over kernels>
//   us_second_launch <median over kernels>
// Exit status 0; 1 on a CUDA error.

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        CUresult rc_ = (call);                                                           \
        if (rc_ != CUDA_SUCCESS) {                                                       \
            fprintf(stderr, "bench_firstsight: %s -> %d\n", #call, (int)rc_);            \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200;
    if (n < 1 || n > 100000) {
        fprintf(stderr, "usage: bench_firstsight [kernels 1..100000]\n");
        return 2;
    }
    size_t cap = 128 + (size_t)n * 96;
    char *ptx = malloc(cap);
    if (!ptx) return 1;
    size_t len = (size_t)snprintf(ptx, cap, ".version 8.0\n.target sm_90\n.address_size 64\n");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(ptx + len, cap - len,
                                ".visible .entry first_sight_%d(.param .u32 n)\n{\n\tret;\n}\n", i);

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ptx));

    double *first = malloc(sizeof(double) * n), *second = malloc(sizeof(double) * n);
    CUfunction *f = malloc(sizeof(CUfunction) * n);
    if (!first || !second || !f) return 1;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "first_sight_%d", i);
        CHECK(cuModuleGetFunction(&f[i], mod, name));
    }
    unsigned arg = 7;
    void *params[] = {&arg};
    for (int i = 0; i < n; i++) {
        double t0 = bench_now_us();
        CHECK(cuLaunchKernel(f[i], 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        double t1 = bench_now_us();
        CHECK(cuLaunchKernel(f[i], 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        double t2 = bench_now_us();
        CHECK(cuCtxSynchronize());
        first[i] = t1 - t0;
        second[i] = t2 - t1;
    }
    printf("info bench_firstsight kernels=%d\n", n);
    printf("us_first_launch %.2f\n", bench_median(first, n));
    printf("us_second_launch %.2f\n", bench_median(second, n));
    return 0;
}
