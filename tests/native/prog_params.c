/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_params [COUNT [bad]]: launches kernels whose arguments a Python hook reads, in both ways a
 * launch can carry them: `kernelParams` (an array of pointers, one per argument) and `extra`
 * (one buffer packed at the offsets the driver's parameter layout gives). Reaches the driver
 * as cudart does (dlopen + cuGetProcAddress_v2, a fatbin wrapper given to cuLibraryLoadData).
 *
 * Its image declares, as nvcc would:
 *   vecAdd(const float *a, const float *b, float *c, int n)   _Z6vecAddPKfS0_Pfi
 *   structArg(Point p, float f)                               _Z9structArg5Pointf
 *       with struct Point {int a; float b; double c;} (16 bytes, aligned to 8)
 *   debug_kernel(int *p)                                      _Z12debug_kernelPi
 *
 * What it does, in this order (COUNT defaults to 10):
 *   1. prints the parameter layout of each kernel (cuKernelGetParamInfo; cuFuncGetParamInfo
 *      must agree) and checks that an index past the end is CUDA_ERROR_INVALID_VALUE (1);
 *   2. vecAdd COUNT times through cuLaunchKernel with kernelParams: launch i (from 0) has
 *      grid (i+1,1,1), block (128,1,1), n = 100*(i+1) and pointers a = 0x700000000000 +
 *      i*0x1000, b = 0x710000000000 + i*0x1000, c = 0x720000000000 + i*0x1000;
 *   3. the same COUNT launches through cuLaunchKernelEx with `extra`;
 *   4. structArg through cuLaunchKernel with kernelParams, grid 1, block 64:
 *      p = {7, 2.5, -1.25}, f = 3; and once through cuLaunchKernelEx with `extra`, grid 2:
 *      p = {-9, 0.5, 65536.125}, f = -0.25. structArg is launched by its CUfunction
 *      (cuKernelGetFunction), vecAdd and debug_kernel by their CUkernel as cudart does;
 *   5. debug_kernel 3 times through cuLaunchKernel with kernelParams, grid (i+1,1,1),
 *      block 32, p = 0x730000000000 + i*0x100;
 *   6. only with `bad`: debug_kernel with arguments the driver refuses, grid 9, block 32,
 *      each after a line `bad <how>`: kernelParams holding NULL (null_entry); extra with an
 *      unknown key (bad_extra); extra whose buffer says 4 bytes for the 8-byte p (short_extra,
 *      p = 0x7400000000aa).
 *
 * Output (stdout), besides the getproc lines and the closing fake: lines of common.h:
 *   param <kernel> index=<i> offset=<o> size=<s>
 *   check cuKernelGetParamInfo <kernel> index=<n> -> <rc>     (n: the number of parameters)
 * and for every launch two lines, the arguments and then the launch:
 *   arg <kernel> form=params|extra handle=kernel|function grid=<gx> block=<bx> <name>=<value>...
 *   launch <kernel> via <entry point> -> <rc>
 * where the names and values are, for vecAdd `a=0x.. b=0x.. c=0x.. n=<int>`, for structArg
 * `p.a=<int> p.b=<float> p.c=<double> f=<float>` (%.17g), for debug_kernel `p=0x..`.
 *
 * Driver counts without a shim: vecAdd launches=2*COUNT, structArg launches=2,
 * debug_kernel launches=3.
 */
#include "common.h"

#define K_STRUCTARG "_Z9structArg5Pointf"

/* The PTX nvcc writes for the three kernels (bodies left out). The third pointer carries the
 * .ptr attributes nvcc adds for pointers it knows point to global memory. */
#define PARAMS_PTX                                                                                 \
    PTX_HEADER                                                                                     \
    ".visible .entry " K_VECADD "(\n"                                                              \
    "\t.param .u64 " K_VECADD "_param_0,\n"                                                        \
    "\t.param .u64 " K_VECADD "_param_1,\n"                                                        \
    "\t.param .u64 .ptr .global .align 4 " K_VECADD "_param_2,\n"                                  \
    "\t.param .u32 " K_VECADD "_param_3\n"                                                         \
    ")\n{\n\tret;\n}\n"                                                                            \
    ".visible .entry " K_STRUCTARG "(\n"                                                           \
    "\t.param .align 8 .b8 " K_STRUCTARG "_param_0[16],\n"                                         \
    "\t.param .f32 " K_STRUCTARG "_param_1\n"                                                      \
    ")\n{\n\tret;\n}\n"                                                                            \
    ".visible .entry " K_DEBUG "(\n"                                                               \
    "\t.param .u64 " K_DEBUG "_param_0\n"                                                          \
    ")\n{\n\tret;\n}\n"

struct point {
    int a;
    float b;
    double c;
};

static __typeof__(&cuLaunchKernel) g_launch;
static __typeof__(&cuLaunchKernelEx) g_launch_ex;
static __typeof__(&cuKernelGetParamInfo) g_kernel_param_info;
static __typeof__(&cuFuncGetParamInfo) g_func_param_info;
static __typeof__(&cuKernelGetFunction) g_kernel_function;

/* Prints the layout of k, checks cuFuncGetParamInfo against it and the index past the end;
 * returns the number of parameters. */
static unsigned print_layout(CUkernel k, const char *name)
{
    size_t off, size, foff, fsize;
    CUfunction f;
    unsigned i;
    CHECK(g_kernel_function(&f, k));
    for (i = 0; g_kernel_param_info(k, i, &off, &size) == CUDA_SUCCESS; i++) {
        printf("param %s index=%u offset=%zu size=%zu\n", name, i, off, size);
        CHECK(g_func_param_info(f, i, &foff, &fsize));
        if (foff != off || fsize != size) {
            fprintf(stderr, "FAILED cuFuncGetParamInfo(%s, %u) = %zu/%zu, the kernel's %zu/%zu\n",
                    name, i, foff, fsize, off, size);
            exit(1);
        }
    }
    printf("check cuKernelGetParamInfo %s index=%u -> %d\n", name, i,
           (int)g_kernel_param_info(k, i, &off, &size));
    return i;
}

/* Packs the arguments into buf at the offsets of k's layout, as a caller of `extra` must;
 * returns the buffer's size (the end of the last parameter). */
static size_t pack(CUkernel k, const char *name, void *const *args, unsigned nargs,
                   unsigned char *buf, size_t cap)
{
    size_t off, size, end = 0;
    unsigned i;
    memset(buf, 0, cap);
    for (i = 0; i < nargs; i++) {
        CHECK(g_kernel_param_info(k, i, &off, &size));
        if (off + size > cap) {
            fprintf(stderr, "FAILED parameter %u of %s does not fit\n", i, name);
            exit(1);
        }
        memcpy(buf + off, args[i], size);
        if (off + size > end)
            end = off + size;
    }
    return end;
}

/* One launch, by cuLaunchKernel with kernelParams or by cuLaunchKernelEx with extra; prints
 * the launch line. */
static void launch(const char *name, CUfunction f, CUkernel k, int use_extra, unsigned gx,
                   unsigned bx, void **args, unsigned nargs)
{
    CUresult rc;
    if (!use_extra) {
        rc = g_launch(f, gx, 1, 1, bx, 1, 1, 0, NULL, args, NULL);
        report_launch(name, "cuLaunchKernel", rc);
        return;
    }
    _Alignas(16) unsigned char buf[64];
    size_t size = pack(k, name, args, nargs, buf, sizeof buf);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CUlaunchConfig cfg = {.gridDimX = gx, .gridDimY = 1, .gridDimZ = 1, .blockDimX = bx,
                          .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = 0, .hStream = NULL,
                          .attrs = NULL, .numAttrs = 0};
    rc = g_launch_ex(&cfg, f, NULL, extra);
    report_launch(name, "cuLaunchKernelEx", rc);
}

static const char *form(int use_extra) { return use_extra ? "extra" : "params"; }

int main(int argc, char **argv)
{
    long count = argc > 1 ? atol(argv[1]) : 10, i;
    CUdevice dev;
    CUcontext ctx;
    CUlibrary lib;
    CUkernel k_vecadd, k_struct, k_debug;
    CUfunction f_struct;
    int use_extra;

    int bad = argc > 2 && strcmp(argv[2], "bad") == 0;
    if (count < 0 || (argc > 2 && !bad)) {
        fprintf(stderr, "usage: %s [COUNT [bad]]\n", argv[0]);
        return 2;
    }
    start_program();
    cudart_open();
    RESOLVE(init, cuInit, RT_VERSION, 0);
    RESOLVE(device_get, cuDeviceGet, RT_VERSION, 0);
    RESOLVE(primary_retain, cuDevicePrimaryCtxRetain, RT_VERSION, 0);
    RESOLVE(set_current, cuCtxSetCurrent, RT_VERSION, 0);
    RESOLVE(library_load, cuLibraryLoadData, RT_VERSION, 0);
    RESOLVE(get_kernel, cuLibraryGetKernel, RT_VERSION, 0);
    g_kernel_function = resolve("cuKernelGetFunction", RT_VERSION, 0);
    g_kernel_param_info = resolve("cuKernelGetParamInfo", RT_VERSION, 0);
    g_func_param_info = resolve("cuFuncGetParamInfo", RT_VERSION, 0);
    g_launch = resolve("cuLaunchKernel", RT_VERSION, 0);
    g_launch_ex = resolve("cuLaunchKernelEx", RT_VERSION, 0);

    CHECK(init(0));
    CHECK(device_get(&dev, 0));
    CHECK(primary_retain(&ctx, dev));
    CHECK(set_current(ctx));
    struct fake_fatbin_wrapper wrapper = make_fatbin_wrapper(make_fatbin(PARAMS_PTX));
    CHECK(library_load(&lib, &wrapper, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(get_kernel(&k_vecadd, lib, K_VECADD));
    CHECK(get_kernel(&k_struct, lib, K_STRUCTARG));
    CHECK(get_kernel(&k_debug, lib, K_DEBUG));
    CHECK(g_kernel_function(&f_struct, k_struct));

    if (print_layout(k_vecadd, K_VECADD) != 4 || print_layout(k_struct, K_STRUCTARG) != 2 ||
        print_layout(k_debug, K_DEBUG) != 1) {
        fprintf(stderr, "FAILED the image's parameter lists were not read as declared\n");
        return 1;
    }

    /* vecAdd: COUNT launches with kernelParams, then the same COUNT with extra. */
    for (use_extra = 0; use_extra < 2; use_extra++) {
        for (i = 0; i < count; i++) {
            CUdeviceptr a = 0x700000000000ull + (CUdeviceptr)i * 0x1000;
            CUdeviceptr b = 0x710000000000ull + (CUdeviceptr)i * 0x1000;
            CUdeviceptr c = 0x720000000000ull + (CUdeviceptr)i * 0x1000;
            int n = (int)(100 * (i + 1));
            void *args[] = {&a, &b, &c, &n};
            printf("arg %s form=%s handle=kernel grid=%ld block=128 a=0x%llx b=0x%llx c=0x%llx "
                   "n=%d\n",
                   K_VECADD, form(use_extra), i + 1, (unsigned long long)a,
                   (unsigned long long)b, (unsigned long long)c, n);
            launch(K_VECADD, (CUfunction)k_vecadd, k_vecadd, use_extra, (unsigned)(i + 1), 128,
                   args, 4);
        }
    }

    /* structArg, by value, once each way. */
    static const struct point points[2] = {{7, 2.5f, -1.25}, {-9, 0.5f, 65536.125}};
    static const float fs[2] = {3.0f, -0.25f};
    for (use_extra = 0; use_extra < 2; use_extra++) {
        struct point p = points[use_extra];
        float f = fs[use_extra];
        void *args[] = {&p, &f};
        printf("arg %s form=%s handle=function grid=%d block=64 p.a=%d p.b=%.17g p.c=%.17g "
               "f=%.17g\n",
               K_STRUCTARG, form(use_extra), use_extra + 1, p.a, (double)p.b, p.c, (double)f);
        launch(K_STRUCTARG, f_struct, k_struct, use_extra, (unsigned)use_extra + 1, 64, args, 2);
    }

    /* debug_kernel, the usual target of deny rules. */
    for (i = 0; i < 3; i++) {
        CUdeviceptr p = 0x730000000000ull + (CUdeviceptr)i * 0x100;
        void *args[] = {&p};
        printf("arg %s form=params handle=kernel grid=%ld block=32 p=0x%llx\n", K_DEBUG, i + 1,
               (unsigned long long)p);
        launch(K_DEBUG, (CUfunction)k_debug, k_debug, 0, (unsigned)(i + 1), 32, args, 1);
    }

    if (bad) {
        CUlaunchConfig cfg = {.gridDimX = 9, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                              .blockDimY = 1, .blockDimZ = 1};
        void *null_args[] = {NULL};
        printf("bad null_entry\n");
        report_launch(K_DEBUG, "cuLaunchKernel",
                      g_launch((CUfunction)k_debug, 9, 1, 1, 32, 1, 1, 0, NULL, null_args, NULL));
        CUdeviceptr p = 0x7400000000aaull;
        size_t size = sizeof p, short_size = 4;
        void *unknown_key[] = {(void *)(uintptr_t)7, &p, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                               CU_LAUNCH_PARAM_END};
        printf("bad bad_extra\n");
        report_launch(K_DEBUG, "cuLaunchKernelEx",
                      g_launch_ex(&cfg, (CUfunction)k_debug, NULL, unknown_key));
        void *short_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &p, CU_LAUNCH_PARAM_BUFFER_SIZE,
                               &short_size, CU_LAUNCH_PARAM_END};
        printf("bad short_extra\n");
        report_launch(K_DEBUG, "cuLaunchKernelEx",
                      g_launch_ex(&cfg, (CUfunction)k_debug, NULL, short_extra));
    }

    print_fake_counts();
    return 0;
}
