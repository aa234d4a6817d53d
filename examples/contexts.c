// SPDX-License-Identifier: Apache-2.0
//
// contexts: one module's code in many CUDA contexts, for clc's wrap tests and benchmark.
//
//   contexts run <driver_kernels.ptx> N
//       N contexts (cuCtxCreate), each loads the PTX with cuModuleLoadData, launches `fill`
//       (1 << 20 ints) and checks the result. Under a wrap policy, clc builds the wrapped
//       kernel once and loads it once (cuLibraryLoadData) for all N contexts.
//       Output: result ctx<i> ok|mismatch, one per context; exit 1 on a mismatch.
//
//   contexts bench <image> N module|library
//       The cost of having one image's code in N contexts: `module` loads it N times with
//       cuModuleLoadData (a module belongs to one context); `library` loads it once with
//       cuLibraryLoadData and takes the kernel's function in each context (the driver loads
//       the code into a context when a function of it is first needed there). Each context
//       then launches `fill` once, so the code is really resident. Output:
//         load_calls <n>
//         load_ms <wall time of the loads and function lookups, all contexts>
//         device_bytes <device memory used after, minus before (cuMemGetInfo), all contexts>
//
// Build: nvcc -O2 -o contexts examples/contexts.c -lcuda
// Exit status: 0, 1 on a mismatch, 2 on bad usage, 3 when a CUDA call fails.

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CONTEXTS 256

#define REQUIRE(call)                                                                    \
    do {                                                                                 \
        CUresult r_ = (call);                                                            \
        if (r_ != CUDA_SUCCESS) {                                                        \
            const char *name_ = NULL;                                                    \
            cuGetErrorName(r_, &name_);                                                  \
            printf("cuda_error %s %s\n", #call, name_ ? name_ : "?");                    \
            exit(3);                                                                     \
        }                                                                                \
    } while (0)

static char *read_file(const char *path, size_t *size_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *buf = size > 0 ? (char *)malloc((size_t)size + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[size] = '\0';  // PTX given to the driver must end in a NUL
    fclose(f);
    if (size_out) *size_out = (size_t)size;
    return buf;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static CUcontext create_context(CUdevice dev) {
    CUcontext ctx;
#if CUDA_VERSION >= 13000
    REQUIRE(cuCtxCreate(&ctx, NULL, 0, dev));
#else
    REQUIRE(cuCtxCreate(&ctx, 0, dev));
#endif
    return ctx;
}

static const int N_ELEMS = 1 << 20;

static int fill_and_check(CUfunction fill, int value) {
    CUdeviceptr d;
    int n = N_ELEMS;
    REQUIRE(cuMemAlloc(&d, sizeof(int) * (size_t)n));
    void *args[] = {&d, &value, &n};
    REQUIRE(cuLaunchKernel(fill, (unsigned)((n + 255) / 256), 1, 1, 256, 1, 1, 0, NULL, args,
                           NULL));
    REQUIRE(cuCtxSynchronize());
    int *h = (int *)malloc(sizeof(int) * (size_t)n);
    REQUIRE(cuMemcpyDtoH(h, d, sizeof(int) * (size_t)n));
    int ok = 1;
    for (int i = 0; i < n && ok; i++) ok = h[i] == value + (i % 13);
    free(h);
    REQUIRE(cuMemFree(d));
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "run") && strcmp(argv[1], "bench")) ||
        (!strcmp(argv[1], "bench") && argc < 5)) {
        fprintf(stderr, "usage: contexts run <ptx> N | contexts bench <image> N module|library\n");
        return 2;
    }
    int n = atoi(argv[3]);
    if (n < 1 || n > MAX_CONTEXTS) {
        fprintf(stderr, "contexts: N must be 1..%d\n", MAX_CONTEXTS);
        return 2;
    }
    char *image = read_file(argv[2], NULL);
    if (!image) {
        fprintf(stderr, "contexts: cannot read %s\n", argv[2]);
        return 2;
    }
    REQUIRE(cuInit(0));
    CUdevice dev;
    REQUIRE(cuDeviceGet(&dev, 0));
    static CUcontext ctx[MAX_CONTEXTS];

    if (!strcmp(argv[1], "run")) {
        int bad = 0;
        for (int i = 0; i < n; i++) {
            ctx[i] = create_context(dev);  // current from now on
            CUmodule mod;
            CUfunction fill;
            REQUIRE(cuModuleLoadData(&mod, image));
            REQUIRE(cuModuleGetFunction(&fill, mod, "fill"));
            int ok = fill_and_check(fill, 100 * i);
            printf("result ctx%d %s\n", i, ok ? "ok" : "mismatch");
            bad |= !ok;
        }
        for (int i = 0; i < n; i++) REQUIRE(cuCtxDestroy(ctx[i]));
        return bad ? 1 : 0;
    }

    int library = !strcmp(argv[4], "library");
    for (int i = 0; i < n; i++) ctx[i] = create_context(dev);
    size_t free_before, free_after, total;
    REQUIRE(cuCtxSetCurrent(ctx[0]));
    REQUIRE(cuMemGetInfo(&free_before, &total));
    static CUfunction fill[MAX_CONTEXTS];
    int calls = 0;
    double t0 = now_ms();
    if (library) {
        CUlibrary lib;
        CUkernel k;
        REQUIRE(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
        calls++;
        REQUIRE(cuLibraryGetKernel(&k, lib, "fill"));
        for (int i = 0; i < n; i++) {
            REQUIRE(cuCtxSetCurrent(ctx[i]));
            REQUIRE(cuKernelGetFunction(&fill[i], k));
        }
    } else {
        for (int i = 0; i < n; i++) {
            CUmodule mod;
            REQUIRE(cuCtxSetCurrent(ctx[i]));
            REQUIRE(cuModuleLoadData(&mod, image));
            calls++;
            REQUIRE(cuModuleGetFunction(&fill[i], mod, "fill"));
        }
    }
    double load_ms = now_ms() - t0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        REQUIRE(cuCtxSetCurrent(ctx[i]));
        bad |= !fill_and_check(fill[i], i);
    }
    REQUIRE(cuCtxSetCurrent(ctx[0]));
    REQUIRE(cuMemGetInfo(&free_after, &total));
    printf("load_calls %d\nload_ms %.3f\ndevice_bytes %lld\nresult fill %s\n", calls, load_ms,
           (long long)free_before - (long long)free_after, bad ? "mismatch" : "ok");
    for (int i = 0; i < n; i++) REQUIRE(cuCtxDestroy(ctx[i]));
    return bad ? 1 : 0;
}
