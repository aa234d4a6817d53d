/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libinterpose.so: another preloaded interposer of cuLaunchKernel (a profiler, a sharing
 * layer), loaded after clc's shim: it counts the launches that reach it and passes each on to
 * what dlsym(RTLD_NEXT) gives it. A launch that comes back to it from there (a loop) is
 * refused with 999 and counted, so that a test sees the loop instead of a crash.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

static __thread int depth;
static long passed, looped;

static void report(void) { printf("interposer: passed=%ld looped=%ld\n", passed, looped); }

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params,
                        void **extra)
{
    static launch_fn next;
    CUresult r;
    if (!next) {
        next = (launch_fn)dlsym(RTLD_NEXT, "cuLaunchKernel");
        atexit(report);
    }
    if (depth > 0) {
        looped++;
        return (CUresult)999;
    }
    depth++;
    passed++;
    r = next(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
    depth--;
    return r;
}
