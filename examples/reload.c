// SPDX-License-Identifier: Apache-2.0
//
// reload: a CUDA driver-API program that loads a module, launches its kernel, unloads it, loads
// another module, launches that one's kernel, unloads it, and again, round after round. The
// driver gives a kernel of a new module the handle of a kernel it unloaded, so anything that
// keeps a decision by kernel handle would apply it to the wrong kernel. Each kernel writes its
// own value into a zeroed buffer: ok_kernel 1, debug_kernel 2; a launch that was refused leaves
// the zeros.
//
//   reload <reload_ok.ptx> <reload_debug.ptx> module|library|both [rounds]
//
// module:  cuModuleLoadData / cuModuleGetFunction / cuLaunchKernel / cuModuleUnload
// library: cuLibraryLoadData / cuLibraryGetKernel / cuLaunchKernel of the CUkernel (as cudart
//          launches) / cuLibraryUnload
// both:    the module rounds, then the library rounds. Rounds default to 20.
//
// The PTX comes from examples/reload_kernels.cu (see there). Build, linking libcuda directly
// (nvcc adds the toolkit's stub directory):
//   nvcc -O2 -o reload examples/reload.c -lcuda
//
// Output, one line per launch and a summary per API:
//   info reload api=<api> rounds=<n> grid=<g> block=<b>
//   launch api=<api> round=<r> kernel=<name> handle=<p> owner=<p> reused=<0|1> rc=<CUresult>
//          value=<v> ok=<0|1>
//   summary api=<api> rounds=<n> launches=<2n> reused=<u> ok_ran=<a> ok_refused=<b>
//           debug_ran=<c> debug_refused=<d> wrong=<w>
// handle: the kernel handle launched (CUfunction, or CUkernel for library); owner: the module
// or library; reused: the handle is the one the previous (unloaded) kernel had; rc: what
// cuLaunchKernel returned; value: what the whole buffer holds after the launch (-1 when its
// elements differ); ok: a successful launch left its own kernel's value everywhere, a refused
// one left the buffer untouched (all 0). wrong counts the launches with ok=0.
// Exit status: 0, 1 when a launch is wrong, 2 on bad usage, 3 when anything but a launch fails.

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXAMPLE_NAME "reload"
#include "driver_util.h"

enum { GRID = 64, BLOCK = 256, N = GRID * BLOCK };
enum { K_OK, K_DEBUG, K_COUNT };
static const char *const kernel_names[K_COUNT] = {"ok_kernel", "debug_kernel"};
static const int kernel_values[K_COUNT] = {1, 2};

typedef struct {
    long reused, ran[K_COUNT], refused[K_COUNT], wrong;
} tally;

// One load / launch / check / unload of kernel k. *prev is the handle launched before (0 at
// the start), and becomes this one.
static void one_launch(int library, int round, int k, const char *ptx, CUdeviceptr buf,
                       int *host, void **prev, tally *t) {
    const char *api = library ? "library" : "module";
    CUmodule mod = NULL;
    CUlibrary lib = NULL;
    CUfunction f = NULL;
    void *owner;
    if (library) {
        CUkernel kern;
        CUresult lr = cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0);
        if (lr != CUDA_SUCCESS)
            explain_load_failure(ptx);
        REQUIRE(lr);
        REQUIRE(cuLibraryGetKernel(&kern, lib, kernel_names[k]));
        f = (CUfunction)kern;
        owner = (void *)lib;
    } else {
        CUresult lr = cuModuleLoadData(&mod, ptx);
        if (lr != CUDA_SUCCESS)
            explain_load_failure(ptx);
        REQUIRE(lr);
        REQUIRE(cuModuleGetFunction(&f, mod, kernel_names[k]));
        owner = (void *)mod;
    }
    int reused = *prev != NULL && (void *)f == *prev;
    t->reused += reused;
    *prev = (void *)f;

    REQUIRE(cuMemsetD32(buf, 0, N));
    REQUIRE(cuCtxSynchronize());
    void *args[] = {&buf};
    CUresult rc = cuLaunchKernel(f, GRID, 1, 1, BLOCK, 1, 1, 0, NULL, args, NULL);
    REQUIRE(cuCtxSynchronize());
    REQUIRE(cuMemcpyDtoH(host, buf, sizeof(int) * N));
    int value = host[0];
    for (int i = 1; i < N; ++i)
        if (host[i] != value) {
            value = -1;
            break;
        }
    int ok;
    if (rc == CUDA_SUCCESS) {
        t->ran[k]++;
        ok = value == kernel_values[k];
    } else {
        t->refused[k]++;
        ok = value == 0;
    }
    t->wrong += !ok;
    printf("launch api=%s round=%d kernel=%s handle=%p owner=%p reused=%d rc=%d value=%d ok=%d\n",
           api, round, kernel_names[k], (void *)f, owner, reused, (int)rc, value, ok);
    if (!ok)
        fprintf(stderr, "reload: %s %s round %d: rc %d (%s) left value %d\n", api,
                kernel_names[k], round, (int)rc, rc == CUDA_SUCCESS ? "success" : error_name(rc),
                value);

    if (library)
        REQUIRE(cuLibraryUnload(lib));
    else
        REQUIRE(cuModuleUnload(mod));
}

static long run_api(int library, int rounds, char *const ptx[K_COUNT], CUdeviceptr buf,
                    int *host) {
    const char *api = library ? "library" : "module";
    tally t;
    memset(&t, 0, sizeof t);
    void *prev = NULL;
    printf("info reload api=%s rounds=%d grid=%d block=%d\n", api, rounds, GRID, BLOCK);
    for (int r = 0; r < rounds; ++r)
        for (int k = 0; k < K_COUNT; ++k)
            one_launch(library, r, k, ptx[k], buf, host, &prev, &t);
    printf("summary api=%s rounds=%d launches=%d reused=%ld ok_ran=%ld ok_refused=%ld "
           "debug_ran=%ld debug_refused=%ld wrong=%ld\n",
           api, rounds, 2 * rounds, t.reused, t.ran[K_OK], t.refused[K_OK], t.ran[K_DEBUG],
           t.refused[K_DEBUG], t.wrong);
    return t.wrong;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr,
                "usage: reload <reload_ok.ptx> <reload_debug.ptx> module|library|both [rounds]\n");
        return 2;
    }
    const char *mode = argv[3];
    int do_module = strcmp(mode, "module") == 0 || strcmp(mode, "both") == 0;
    int do_library = strcmp(mode, "library") == 0 || strcmp(mode, "both") == 0;
    int rounds = argc > 4 ? atoi(argv[4]) : 20;
    if ((!do_module && !do_library) || rounds < 1) {
        fprintf(stderr, "reload: bad mode %s or rounds %d\n", mode, rounds);
        return 2;
    }
    char *ptx[K_COUNT];
    for (int k = 0; k < K_COUNT; ++k) {
        ptx[k] = read_file(argv[1 + k]);
        if (!ptx[k]) {
            fprintf(stderr, "reload: cannot read PTX from %s\n", argv[1 + k]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    REQUIRE(cuInit(0));
    CUdevice dev;
    REQUIRE(cuDeviceGet(&dev, 0));
    // The primary context, as the runtime would use: its creation API is the same in every
    // CUDA version (cuCtxCreate changed signature in 13).
    CUcontext ctx;
    REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev));
    REQUIRE(cuCtxSetCurrent(ctx));

    CUdeviceptr buf;
    REQUIRE(cuMemAlloc(&buf, sizeof(int) * N));
    int *host = (int *)malloc(sizeof(int) * N);
    if (!host) {
        fprintf(stderr, "reload: out of host memory\n");
        return 3;
    }

    long wrong = 0;
    if (do_module)
        wrong += run_api(0, rounds, ptx, buf, host);
    if (do_library)
        wrong += run_api(1, rounds, ptx, buf, host);

    REQUIRE(cuMemFree(buf));
    REQUIRE(cuDevicePrimaryCtxRelease(dev));
    free(host);
    for (int k = 0; k < K_COUNT; ++k)
        free(ptx[k]);
    return wrong ? 1 : 0;
}
