// SPDX-License-Identifier: Apache-2.0
//
// bench_inproc: what the shim adds to one launch, measured inside one process.
//
//   bench_inproc [bursts [burst_size]]
//
// Whole-program runs on a virtual machine differ by about 10 % from one process to the next,
// far more than the 1 % being judged. Here one process alternates bursts between two paths to
// the same driver: `cuLaunchKernel` as the program links it (the shim's hook when it is
// preloaded) and libcuda's own function, found with dlvsym, which the shim does not
// interpose. Only the launch loop is timed (the wait for the GPU is not), and bursts are short
// enough never to fill the launch queue, so the figure is the CPU cost of a launch call.
//
// Output:
//   info bench_inproc bursts=<b> burst_size=<s> same_function=<0|1>
//   ns_per_launch_hooked <median over bursts>
//   ns_per_launch_real <median over bursts>
//   ns_added <median over bursts of (hooked - real)>
// Exit status 0; 1 on a CUDA error.

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"

void *bench_real_symbol(const char *name);

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

// One argument, so that a hook asked at every launch has something to read.
static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry empty_kernel(.param .u32 n)\n{\n\tret;\n}\n";

#define CHECK(call)                                                                      \
    do {                                                                                 \
        CUresult rc_ = (call);                                                           \
        if (rc_ != CUDA_SUCCESS) {                                                       \
            fprintf(stderr, "bench_inproc: %s -> %d\n", #call, (int)rc_);                \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

static double burst(launch_fn fn, CUfunction f, int n, int *failed) {
    unsigned arg = 42;
    void *params[] = {&arg};
    double t0 = bench_now_ns();
    for (int i = 0; i < n; ++i)
        if (fn(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS) *failed = 1;
    double t1 = bench_now_ns();
    cuCtxSynchronize();
    return (t1 - t0) / n;
}

int main(int argc, char **argv) {
    int bursts = argc > 1 ? atoi(argv[1]) : 400;
    int size = argc > 2 ? atoi(argv[2]) : 200;
    if (bursts < 1 || size < 1) {
        fprintf(stderr, "usage: bench_inproc [bursts>=1 [burst_size>=1]]\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&f, mod, "empty_kernel"));

    launch_fn hooked = cuLaunchKernel;
    launch_fn real = (launch_fn)bench_real_symbol("cuLaunchKernel");
    if (!real) {
        fprintf(stderr, "bench_inproc: libcuda's own cuLaunchKernel not found\n");
        return 1;
    }
    printf("info bench_inproc bursts=%d burst_size=%d same_function=%d\n", bursts, size,
           hooked == real);

    int failed = 0;
    for (int i = 0; i < 10; ++i) {  // warm-up: first sight, caches, the clocks
        burst(hooked, f, size, &failed);
        burst(real, f, size, &failed);
    }
    double *h = malloc(sizeof(double) * bursts), *r = malloc(sizeof(double) * bursts);
    double *d = malloc(sizeof(double) * bursts);
    if (!h || !r || !d) return 1;
    for (int b = 0; b < bursts; ++b) {
        // Alternate which path goes first, so that neither always follows a GPU wait.
        if (b % 2) {
            h[b] = burst(hooked, f, size, &failed);
            r[b] = burst(real, f, size, &failed);
        } else {
            r[b] = burst(real, f, size, &failed);
            h[b] = burst(hooked, f, size, &failed);
        }
        d[b] = h[b] - r[b];
    }
    if (failed) {
        fprintf(stderr, "bench_inproc: a launch failed\n");
        return 1;
    }
    printf("ns_per_launch_hooked %.1f\n", bench_median(h, bursts));
    printf("ns_per_launch_real %.1f\n", bench_median(r, bursts));
    printf("ns_added %.1f\n", bench_median(d, bursts));
    return 0;
}
