/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_wrap [library|module|file|ptx [late|twin|capture|reset]]: launches kernels that clc can
 * wrap, and prints what the
 * driver really received, so that a test can check what clc's `wrap` action changed on the way.
 * `prog_wrap ptx` only prints the PTX it loads (WRAP_PTX), for tests that build from it.
 *
 * It loads WRAP_PTX, real PTX that nvJitLink can build (plain text, the way a JIT-compiling
 * program hands code over), with cuLibraryLoadData and launches the CUkernels cast to
 * CUfunctions as cudart does (`library`, the default), or with cuModuleLoadData and launches
 * CUfunctions (`module`), or from a temporary file with cuModuleLoad, overwritten and removed
 * right after the load (`file`). Everything is reached through cuGetProcAddress, as cudart does. Kernels:
 *   vec_add(float *a, float *b, float *c, unsigned n)    wrappable
 *   scale(float *x, float s, unsigned n)                 wrappable
 *   bump_counter(unsigned d)                             not wrappable: it adds to a __device__
 *                                                        variable (g_counter) of its module
 * Their parameter layouts are those of the PTX: vec_add 0/8, 8/8, 16/8, 24/4 (28 bytes),
 * scale 0/8, 8/4, 12/4 (16 bytes), bump_counter 0/4 (4 bytes).
 *
 * First vec_add may use 100000 bytes of dynamic shared memory (cuKernelSetAttribute, or
 * cuFuncSetAttribute with `module`; the `attr` line); with `late`, that is done instead just
 * before the launch that needs it (after vec_add's first launches). With `twin`, a second
 * module (TWIN_PTX, cuModuleLoadData) defining another `scale` is loaded after the kernels
 * were taken. Then the launches of PLAN,
 * in order
 * (launch i from 0; grids, blocks and shared memory there), each with kernelParams or with
 * `extra` (a buffer packed at the layout's offsets, its size the layout's, or larger with zero
 * padding for one launch), through cuLaunchKernel or cuLaunchKernelEx; argument j of launch i
 * has the value arg_value(i, j). Then vec_add twice as a node of a CUDA graph
 * (cuGraphAddKernelNode_v2), instantiated and launched once.
 *
 * Before each launch the fake driver is told to observe it (fake_cuda_observe_launches) and to
 * copy kernelParams[0..n] (the n own arguments and the one a wrapped launch appends); after it,
 * the program reads back the kernel's last launch. Output (stdout), besides getproc lines:
 *   attr vec_add via cuKernelSetAttribute|cuFuncSetAttribute -> <rc>
 * then for each launch
 *   arg <kernel> i=<i> form=params|extra via=<entry> grid=X,Y,Z block=X,Y,Z smem=<bytes>
 *       extra_size=<bytes, 0 with kernelParams> args=<v0>,<v1>...
 *   launch <kernel> via <entry> -> <rc>
 *   seen <kernel> i=<i> form=none           (the driver ran no launch of it: refused)
 *   seen <kernel> i=<i> form=params|extra via=<entry> original=0|1 code=cubin|ptx grid=X,Y,Z
 *        block=X,Y,Z smem=<bytes> own_args=same|differ extra_size=<bytes> clc_arg=0|1
 *        [slot=0x<addr> vgrid=X,Y,Z seq=<s> share_sms=<n> batch=<b> slot_base=0x<addr>
 *         slot_alloc=<bytes> slot_zero=0|1]
 * on one line: what the driver got. original=1 when it got the program's own handle; code: the
 * function's image was a cubin (what clc links) or PTX (the program's). own_args: the program's
 * arguments reached it unchanged (kernelParams entries, or the first <layout size> bytes of the
 * `extra` buffer). extra_size: the `extra` buffer's size (0 with kernelParams). clc_arg=1 when the
 * launch carried one more argument, the 32-byte struct clc_launch_arg (shim/clc_abi.h): as
 * kernelParams[n], or in `extra` at the layout's size rounded up to 8 when the buffer holds it;
 * its slot address, grid, the 32-bit word after the grid (seq) and the last 8 bytes follow,
 * then the device allocation the slot lies in (its base and size; slot_base=0x0 slot_alloc=0
 * when it lies in none) and whether the slot's 32 bytes are zero (the fake fills new device
 * memory with 0xa5). Then
 *   graph-add vec_add via cuGraphAddKernelNode_v2 -> <rc>        (twice, each followed by
 *   node-seen vec_add i=<100+n> ...          what the node got, in the `seen` line's form)
 *   graph-launch nodes=2 via cuGraphLaunch -> <rc>
 * and the fake: lines of common.h.
 *
 * Driver counts without a shim: vec_add launches=8 graph=2, scale launches=2,
 * bump_counter launches=2.
 */
#include "common.h"

#include <unistd.h>

#define K_VEC_ADD "vec_add"
#define K_WRAP_SCALE "scale"
#define K_BUMP "bump_counter"

/* What nvcc -ptx -arch=sm_90 would write for the three kernels (vec_add's bounds check is a
 * thread-divergent `ret`, which a wrapper's loop must turn into a branch). */
#define WRAP_PTX                                                                                   \
    PTX_HEADER                                                                                     \
    "\n.global .align 4 .u32 g_counter;\n"                                                         \
    "\n.visible .entry vec_add(\n"                                                                 \
    "\t.param .u64 vec_add_param_0,\n"                                                             \
    "\t.param .u64 vec_add_param_1,\n"                                                             \
    "\t.param .u64 vec_add_param_2,\n"                                                             \
    "\t.param .u32 vec_add_param_3\n"                                                              \
    ")\n{\n"                                                                                       \
    "\t.reg .pred %p<2>;\n"                                                                        \
    "\t.reg .b32 %r<6>;\n"                                                                         \
    "\t.reg .f32 %f<4>;\n"                                                                         \
    "\t.reg .b64 %rd<11>;\n\n"                                                                     \
    "\tld.param.u64 %rd1, [vec_add_param_0];\n"                                                    \
    "\tld.param.u64 %rd2, [vec_add_param_1];\n"                                                    \
    "\tld.param.u64 %rd3, [vec_add_param_2];\n"                                                    \
    "\tld.param.u32 %r2, [vec_add_param_3];\n"                                                     \
    "\tmov.u32 %r3, %ctaid.x;\n"                                                                   \
    "\tmov.u32 %r4, %ntid.x;\n"                                                                    \
    "\tmov.u32 %r5, %tid.x;\n"                                                                     \
    "\tmad.lo.s32 %r1, %r3, %r4, %r5;\n"                                                           \
    "\tsetp.ge.u32 %p1, %r1, %r2;\n"                                                               \
    "\t@%p1 ret;\n"                                                                                \
    "\tcvta.to.global.u64 %rd4, %rd1;\n"                                                           \
    "\tmul.wide.u32 %rd5, %r1, 4;\n"                                                               \
    "\tadd.s64 %rd6, %rd4, %rd5;\n"                                                                \
    "\tcvta.to.global.u64 %rd7, %rd2;\n"                                                           \
    "\tadd.s64 %rd8, %rd7, %rd5;\n"                                                                \
    "\tld.global.f32 %f1, [%rd8];\n"                                                               \
    "\tld.global.f32 %f2, [%rd6];\n"                                                               \
    "\tadd.f32 %f3, %f2, %f1;\n"                                                                   \
    "\tcvta.to.global.u64 %rd9, %rd3;\n"                                                           \
    "\tadd.s64 %rd10, %rd9, %rd5;\n"                                                               \
    "\tst.global.f32 [%rd10], %f3;\n"                                                              \
    "\tret;\n"                                                                                     \
    "}\n"                                                                                          \
    "\n.visible .entry scale(\n"                                                                   \
    "\t.param .u64 scale_param_0,\n"                                                               \
    "\t.param .f32 scale_param_1,\n"                                                               \
    "\t.param .u32 scale_param_2\n"                                                                \
    ")\n{\n"                                                                                       \
    "\t.reg .pred %p<2>;\n"                                                                        \
    "\t.reg .b32 %r<6>;\n"                                                                         \
    "\t.reg .f32 %f<4>;\n"                                                                         \
    "\t.reg .b64 %rd<5>;\n\n"                                                                      \
    "\tld.param.u64 %rd1, [scale_param_0];\n"                                                      \
    "\tld.param.f32 %f1, [scale_param_1];\n"                                                       \
    "\tld.param.u32 %r2, [scale_param_2];\n"                                                       \
    "\tmov.u32 %r3, %ctaid.x;\n"                                                                   \
    "\tmov.u32 %r4, %ntid.x;\n"                                                                    \
    "\tmov.u32 %r5, %tid.x;\n"                                                                     \
    "\tmad.lo.s32 %r1, %r3, %r4, %r5;\n"                                                           \
    "\tsetp.ge.u32 %p1, %r1, %r2;\n"                                                               \
    "\t@%p1 ret;\n"                                                                                \
    "\tcvta.to.global.u64 %rd2, %rd1;\n"                                                           \
    "\tmul.wide.u32 %rd3, %r1, 4;\n"                                                               \
    "\tadd.s64 %rd4, %rd2, %rd3;\n"                                                                \
    "\tld.global.f32 %f2, [%rd4];\n"                                                               \
    "\tmul.f32 %f3, %f2, %f1;\n"                                                                   \
    "\tst.global.f32 [%rd4], %f3;\n"                                                               \
    "\tret;\n"                                                                                     \
    "}\n"                                                                                          \
    "\n.visible .entry bump_counter(\n"                                                            \
    "\t.param .u32 bump_counter_param_0\n"                                                         \
    ")\n{\n"                                                                                       \
    "\t.reg .b32 %r<3>;\n\n"                                                                       \
    "\tld.param.u32 %r1, [bump_counter_param_0];\n"                                                \
    "\tatom.global.add.u32 %r2, [g_counter], %r1;\n"                                               \
    "\tret;\n"                                                                                     \
    "}\n"

/* Another module's `scale`, with the same name and another signature (one parameter): loaded
 * last with `twin`, so that it is the newest image defining `scale`. Never launched. */
#define TWIN_PTX                                                                                   \
    PTX_HEADER                                                                                     \
    "\n.visible .entry scale(\n"                                                                  \
    "\t.param .u64 scale_param_0\n"                                                                \
    ")\n{\n\tret;\n}\n"

#define MAX_ARGS 4
#define ARG_BYTES 32 /* sizeof(struct clc_launch_arg) */

struct kernel_desc {
    const char *name;
    unsigned nargs;
    size_t offset[MAX_ARGS], size[MAX_ARGS];
    size_t end; /* the layout's size */
};

static const struct kernel_desc KERNELS[] = {
    {K_VEC_ADD, 4, {0, 8, 16, 24}, {8, 8, 8, 4}, 28},
    {K_WRAP_SCALE, 3, {0, 8, 12}, {8, 4, 4}, 16},
    {K_BUMP, 1, {0}, {4}, 4},
};

/* vec_add may use this much dynamic shared memory (set before its first launch; more than the
 * 48 KiB a kernel gets by default). */
#define VEC_ADD_MAX_SMEM 100000

static const struct plan {
    unsigned kernel; /* index into KERNELS */
    int ex;          /* cuLaunchKernelEx, else cuLaunchKernel */
    int extra;       /* `extra`, else kernelParams */
    unsigned grid[3], block[3];
    unsigned smem;      /* dynamic shared memory */
    size_t extra_size;  /* the `extra` buffer's size when not the layout's (zero padding) */
} PLAN[] = {
    {0, 0, 0, {1000, 1, 1}, {256, 1, 1}, 0, 0},
    {0, 0, 0, {10, 1, 1}, {256, 1, 1}, 0, 0},
    {0, 0, 1, {40, 30, 2}, {32, 4, 1}, 0, 0},
    {0, 1, 0, {2000, 1, 1}, {64, 1, 1}, 0, 0},
    {0, 1, 1, {7, 5, 3}, {1024, 1, 1}, 0, 0},
    {1, 0, 0, {300, 1, 1}, {128, 1, 1}, 0, 0},
    {0, 0, 0, {5, 1, 1}, {32, 1, 1}, 0, 0},
    {1, 1, 1, {64, 2, 1}, {512, 1, 1}, 0, 0},
    {2, 0, 0, {3, 1, 1}, {32, 1, 1}, 0, 0},
    {2, 1, 1, {2, 1, 1}, {32, 1, 1}, 0, 0},
    {0, 1, 0, {500, 1, 1}, {128, 1, 1}, VEC_ADD_MAX_SMEM, 0},
    {0, 0, 1, {300, 1, 1}, {128, 1, 1}, 0, 48},
};

/* Argument j of launch i: pointers 0x7<j>0000000000 + i * 0x1000, 4-byte values i * 1000 + j
 * (scale's s takes those bits as a float: the value does not matter, only that it arrives). */
/* vec_add may use VEC_ADD_MAX_SMEM bytes of dynamic shared memory: what cudaFuncSetAttribute
 * does, with a CUkernel (cuKernelSetAttribute) or a module's CUfunction. */
static void allow_vec_add_smem(int use_module, CUfunction f, CUdevice dev)
{
    CUresult rc;
    if (use_module) {
        RESOLVE(func_set_attribute, cuFuncSetAttribute, RT_VERSION, 0);
        rc = func_set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                VEC_ADD_MAX_SMEM);
        report("attr", K_VEC_ADD, "cuFuncSetAttribute", rc);
    } else {
        RESOLVE(kernel_set_attribute, cuKernelSetAttribute, RT_VERSION, 0);
        rc = kernel_set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  VEC_ADD_MAX_SMEM, (CUkernel)f, dev);
        report("attr", K_VEC_ADD, "cuKernelSetAttribute", rc);
    }
}

static uint64_t arg_value(unsigned i, unsigned j, size_t size)
{
    return size == 8 ? 0x700000000000ull + ((uint64_t)j << 40) + (uint64_t)i * 0x1000
                     : (uint64_t)i * 1000 + j;
}

static struct {
    void (*observe)(int on);
    int (*capture_param)(unsigned index, unsigned bytes);
    int (*last_launch)(const char *name, const void **handle, const char **entry,
                       unsigned dims[7], int *from_cubin);
    long (*last_param)(const char *name, unsigned index, void *buf, size_t cap);
    long (*last_extra)(const char *name, void *buf, size_t cap);
    int (*device_allocation)(CUdeviceptr p, CUdeviceptr *base, size_t *size);
} fake;

static void load_fake_observer(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        fprintf(stderr, "FAILED dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    fake.observe = fake_sym(h, "fake_cuda_observe_launches");
    fake.capture_param = fake_sym(h, "fake_cuda_capture_param");
    fake.last_launch = fake_sym(h, "fake_cuda_last_launch");
    fake.last_param = fake_sym(h, "fake_cuda_last_param");
    fake.last_extra = fake_sym(h, "fake_cuda_last_extra");
    fake.device_allocation = fake_sym(h, "fake_cuda_device_allocation");
}

/* Copy kernelParams[0..nargs] at the next launches: the kernel's own arguments and the one a
 * wrapped launch appends; no index past that (the array may end there). */
static void capture_for(const struct kernel_desc *k)
{
    unsigned j;
    for (j = 0; j < 8; j++) {
        unsigned bytes = j < k->nargs ? (unsigned)k->size[j] : j == k->nargs ? ARG_BYTES : 0;
        if (fake.capture_param(j, bytes) != 0) {
            fprintf(stderr, "FAILED fake_cuda_capture_param(%u, %u)\n", j, bytes);
            exit(1);
        }
    }
}

/* The `seen` line: what the driver got at the last launch of k (`node-seen`: the kernel node
 * last made or changed, which the fake observes as a launch). */
static const char *seen_prefix = "seen";

static void print_seen(const struct kernel_desc *k, unsigned i, CUfunction passed,
                       const uint64_t *values, const unsigned char *packed)
{
    const void *handle = NULL;
    const char *entry = "?";
    unsigned dims[7];
    int cubin = 0, form = fake.last_launch(k->name, &handle, &entry, dims, &cubin);
    int same = 1, has_arg = 0;
    unsigned char arg[ARG_BYTES];
    long extra_size = 0;
    unsigned j;

    if (form < 0) {
        printf("%s %s i=%u form=none\n", seen_prefix, k->name, i);
        return;
    }
    if (form == 1) {
        for (j = 0; j < k->nargs; j++) {
            unsigned char got[8];
            same &= fake.last_param(k->name, j, got, sizeof got) == (long)k->size[j] &&
                    memcmp(got, &values[j], k->size[j]) == 0;
        }
        has_arg = fake.last_param(k->name, k->nargs, arg, sizeof arg) == ARG_BYTES;
    } else if (form == 2) {
        static unsigned char buf[4096];
        size_t at = (k->end + 7) & ~(size_t)7;
        extra_size = fake.last_extra(k->name, buf, sizeof buf);
        same = extra_size >= (long)k->end && memcmp(buf, packed, k->end) == 0;
        if (extra_size >= (long)(at + ARG_BYTES)) {
            memcpy(arg, buf + at, ARG_BYTES);
            has_arg = 1;
        }
    }
    printf("%s %s i=%u form=%s via=%s original=%d code=%s grid=%u,%u,%u block=%u,%u,%u smem=%u "
           "own_args=%s extra_size=%ld clc_arg=%d",
           seen_prefix, k->name, i, form == 1 ? "params" : form == 2 ? "extra" : "none", entry,
           handle == (const void *)passed, cubin ? "cubin" : "ptx", dims[0], dims[1], dims[2],
           dims[3], dims[4], dims[5], dims[6], same ? "same" : "differ", extra_size, has_arg);
    if (has_arg) {
        uint64_t slot;
        uint32_t grid[3], seq, share_sms, batch;
        CUdeviceptr base = 0;
        size_t size = 0;
        static const unsigned char zero[ARG_BYTES];
        int zeroed;
        memcpy(&slot, arg, 8);
        memcpy(grid, arg + 8, 12);
        memcpy(&seq, arg + 20, 4);
        memcpy(&share_sms, arg + 24, 4);
        memcpy(&batch, arg + 28, 4);
        /* The fake's device memory is host memory: the slot is readable once it is known to lie
         * inside an allocation. */
        zeroed = fake.device_allocation((CUdeviceptr)slot, &base, &size) &&
                 slot + ARG_BYTES <= base + size &&
                 memcmp((const void *)(uintptr_t)slot, zero, ARG_BYTES) == 0;
        printf(" slot=0x%llx vgrid=%u,%u,%u seq=%u share_sms=%u batch=%u slot_base=0x%llx "
               "slot_alloc=%zu slot_zero=%d",
               (unsigned long long)slot, grid[0], grid[1], grid[2], seq, share_sms, batch,
               (unsigned long long)base, size, zeroed);
    }
    printf("\n");
}

/* `capture`: vec_add launched on a stream being captured into a CUDA graph (global mode), its
 * first launch there (clc's first sight of it, so a wrapped kernel is built and loaded while
 * the capture is on), then a second; the capture ended; a third launch on the same stream,
 * not captured. Before the second, the 32 bytes after the first launch's slot are set to 0xff
 * (a captured launch's slot must be zeroed before it). Output: the arg/launch/seen lines of
 * launches 200..202, and
 *   capture-begin -> <rc>
 *   capture-end -> <rc>            (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901, if broken)
 *   capture-unsafe-calls <n>       (calls the fake refused because a global capture was on) */
static void run_capture(CUfunction f)
{
    const struct kernel_desc *k = &KERNELS[0];
    int (*unsafe_calls)(void) = fake_sym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD),
                                         "fake_cuda_capture_unsafe_calls");
    CUstream s;
    CUgraph graph;
    uint64_t slot = 0;
    unsigned i, j;
    RESOLVE(stream_create, cuStreamCreate, RT_VERSION, 0);
    RESOLVE(begin, cuStreamBeginCapture, RT_VERSION, 0);
    RESOLVE(end, cuStreamEndCapture, RT_VERSION, 0);
    RESOLVE(launch, cuLaunchKernel, RT_VERSION, 0);
    CHECK(stream_create(&s, 0));
    printf("capture-begin -> %d\n", (int)begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (i = 200; i < 203; i++) {
        uint64_t values[MAX_ARGS];
        void *args[MAX_ARGS];
        unsigned char arg[ARG_BYTES];
        CUdeviceptr base;
        size_t size;
        if (i == 202)
            printf("capture-end -> %d\n", (int)end(s, &graph));
        for (j = 0; j < k->nargs; j++) {
            values[j] = arg_value(i, j, k->size[j]);
            args[j] = &values[j];
        }
        if (slot && fake.device_allocation((CUdeviceptr)slot + ARG_BYTES, &base, &size) &&
            slot + 2 * ARG_BYTES <= base + size)
            memset((void *)(uintptr_t)(slot + ARG_BYTES), 0xff, ARG_BYTES);
        printf("arg %s i=%u form=params via=cuLaunchKernel grid=64,1,1 block=128,1,1 smem=0 "
               "extra_size=0\n", k->name, i);
        fake.observe(1);
        capture_for(k);
        report_launch(k->name, "cuLaunchKernel",
                      launch(f, 64, 1, 1, 128, 1, 1, 0, s, args, NULL));
        print_seen(k, i, f, values, NULL);
        if (fake.last_param(k->name, k->nargs, arg, sizeof arg) == ARG_BYTES)
            memcpy(&slot, arg, 8);
    }
    fake.observe(0);
    printf("capture-unsafe-calls %d\n", unsafe_calls());
}

/* `reset`: vec_add launched twice (300, 301), the primary context reset (cudaDeviceReset) and
 * retained again (the driver hands back the same CUcontext), vec_add launched twice more
 * (302, 303). Output: the arg/launch/seen lines of those launches, and
 *   reset -> <rc>
 *   same-context <0|1> */
static void run_reset(CUfunction f, CUdevice dev, CUcontext before)
{
    const struct kernel_desc *k = &KERNELS[0];
    CUcontext after;
    unsigned i, j;
    RESOLVE(launch, cuLaunchKernel, RT_VERSION, 0);
    /* At version 7000, as cudart 13 asks for it: the first ABI's entry point. */
    RESOLVE(reset, cuDevicePrimaryCtxReset, 7000, 0);
    RESOLVE(retain, cuDevicePrimaryCtxRetain, RT_VERSION, 0);
    RESOLVE(set_current, cuCtxSetCurrent, RT_VERSION, 0);
    for (i = 300; i < 304; i++) {
        uint64_t values[MAX_ARGS];
        void *args[MAX_ARGS];
        if (i == 302) {
            printf("reset -> %d\n", (int)reset(dev));
            CHECK(retain(&after, dev));
            CHECK(set_current(after));
            printf("same-context %d\n", after == before);
        }
        for (j = 0; j < k->nargs; j++) {
            values[j] = arg_value(i, j, k->size[j]);
            args[j] = &values[j];
        }
        printf("arg %s i=%u form=params via=cuLaunchKernel grid=64,1,1 block=128,1,1 smem=0 "
               "extra_size=0\n", k->name, i);
        fake.observe(1);
        capture_for(k);
        report_launch(k->name, "cuLaunchKernel", launch(f, 64, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
        print_seen(k, i, f, values, NULL);
    }
    fake.observe(0);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "library";
    int use_module;
    CUdevice dev;
    CUcontext ctx;
    CUfunction fn[3];
    CUresult rc;
    unsigned i, j;

    if (strcmp(mode, "ptx") == 0) {
        fputs(WRAP_PTX, stdout);
        return 0;
    }
    int late = argc > 2 && strcmp(argv[2], "late") == 0;
    int twin = argc > 2 && strcmp(argv[2], "twin") == 0;
    int capture = argc > 2 && strcmp(argv[2], "capture") == 0;
    int reset = argc > 2 && strcmp(argv[2], "reset") == 0;
    if ((strcmp(mode, "library") != 0 && strcmp(mode, "module") != 0 &&
         strcmp(mode, "file") != 0) ||
        (argc > 2 && !late && !twin && !capture && !reset)) {
        fprintf(stderr, "usage: %s [library|module|file|ptx [late|twin|capture|reset]]\n",
                argv[0]);
        return 2;
    }
    use_module = strcmp(mode, "module") == 0 || strcmp(mode, "file") == 0;
    start_program();
    cudart_open();
    RESOLVE(init, cuInit, RT_VERSION, 0);
    RESOLVE(device_get, cuDeviceGet, RT_VERSION, 0);
    RESOLVE(primary_retain, cuDevicePrimaryCtxRetain, RT_VERSION, 0);
    RESOLVE(set_current, cuCtxSetCurrent, RT_VERSION, 0);
    RESOLVE(launch, cuLaunchKernel, RT_VERSION, 0);
    RESOLVE(launch_ex, cuLaunchKernelEx, RT_VERSION, 0);
    RESOLVE(graph_create, cuGraphCreate, RT_VERSION, 0);
    RESOLVE(graph_add, cuGraphAddKernelNode, ABI_VERSION, 0);
    RESOLVE(graph_instantiate, cuGraphInstantiateWithFlags, RT_VERSION, 0);
    RESOLVE(graph_launch, cuGraphLaunch, RT_VERSION, 0);

    CHECK(init(0));
    CHECK(device_get(&dev, 0));
    CHECK(primary_retain(&ctx, dev));
    CHECK(set_current(ctx));
    load_fake_observer();

    if (strcmp(mode, "file") == 0) {
        /* The PTX from a file, which is then overwritten: its kernels must still be wrapped
         * from what the driver loaded. */
        RESOLVE(module_load_file, cuModuleLoad, RT_VERSION, 0);
        RESOLVE(module_function, cuModuleGetFunction, RT_VERSION, 0);
        char path[] = "/tmp/prog_wrap_XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0 || write(fd, WRAP_PTX, strlen(WRAP_PTX)) != (ssize_t)strlen(WRAP_PTX)) {
            perror("prog_wrap: temporary PTX file");
            return 2;
        }
        close(fd);
        CUmodule mod;
        CHECK(module_load_file(&mod, path));
        FILE *f = fopen(path, "w");
        if (f) {
            fputs("// not the PTX that was loaded\n", f);
            fclose(f);
        }
        unlink(path);
        for (i = 0; i < 3; i++)
            CHECK(module_function(&fn[i], mod, KERNELS[i].name));
    } else if (use_module) {
        RESOLVE(module_load, cuModuleLoadData, RT_VERSION, 0);
        RESOLVE(module_function, cuModuleGetFunction, RT_VERSION, 0);
        CUmodule mod;
        CHECK(module_load(&mod, WRAP_PTX));
        for (i = 0; i < 3; i++)
            CHECK(module_function(&fn[i], mod, KERNELS[i].name));
    } else {
        RESOLVE(library_load, cuLibraryLoadData, RT_VERSION, 0);
        RESOLVE(library_kernel, cuLibraryGetKernel, RT_VERSION, 0);
        CUlibrary lib;
        CUkernel k;
        CHECK(library_load(&lib, WRAP_PTX, NULL, NULL, 0, NULL, NULL, 0));
        for (i = 0; i < 3; i++) {
            CHECK(library_kernel(&k, lib, KERNELS[i].name));
            fn[i] = (CUfunction)k;
        }
    }
    if (reset) {
        run_reset(fn[0], dev, ctx);
        print_fake_counts();
        return 0;
    }
    if (capture) {
        run_capture(fn[0]);
        print_fake_counts();
        return 0;
    }
    if (!late) allow_vec_add_smem(use_module, fn[0], dev);
    if (twin) {
        RESOLVE(twin_load, cuModuleLoadData, RT_VERSION, 0);
        CUmodule twin_mod;
        CHECK(twin_load(&twin_mod, TWIN_PTX));
    }

    for (i = 0; i < sizeof PLAN / sizeof PLAN[0]; i++) {
        const struct plan *p = &PLAN[i];
        const struct kernel_desc *k = &KERNELS[p->kernel];
        const char *via = p->ex ? "cuLaunchKernelEx" : "cuLaunchKernel";
        if (late && p->smem > 49152) allow_vec_add_smem(use_module, fn[0], dev);
        uint64_t values[MAX_ARGS];
        void *args[MAX_ARGS];
        _Alignas(8) unsigned char packed[64] = {0};
        size_t packed_size = p->extra_size ? p->extra_size : k->end;
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                         &packed_size, CU_LAUNCH_PARAM_END};

        printf("arg %s i=%u form=%s via=%s grid=%u,%u,%u block=%u,%u,%u smem=%u extra_size=%zu "
               "args=",
               k->name, i, p->extra ? "extra" : "params", via, p->grid[0], p->grid[1], p->grid[2],
               p->block[0], p->block[1], p->block[2], p->smem, p->extra ? packed_size : 0);
        for (j = 0; j < k->nargs; j++) {
            values[j] = arg_value(i, j, k->size[j]);
            args[j] = &values[j]; /* little-endian: a 4-byte argument is the low half */
            memcpy(packed + k->offset[j], &values[j], k->size[j]);
            printf("%s0x%llx", j ? "," : "", (unsigned long long)values[j]);
        }
        printf("\n");

        fake.observe(1);
        capture_for(k);
        if (p->ex) {
            CUlaunchConfig cfg = {.gridDimX = p->grid[0], .gridDimY = p->grid[1],
                                  .gridDimZ = p->grid[2], .blockDimX = p->block[0],
                                  .blockDimY = p->block[1], .blockDimZ = p->block[2],
                                  .sharedMemBytes = p->smem, .hStream = NULL, .attrs = NULL,
                                  .numAttrs = 0};
            rc = launch_ex(&cfg, fn[p->kernel], p->extra ? NULL : args, p->extra ? extra : NULL);
        } else {
            rc = launch(fn[p->kernel], p->grid[0], p->grid[1], p->grid[2], p->block[0],
                        p->block[1], p->block[2], p->smem, NULL, p->extra ? NULL : args,
                        p->extra ? extra : NULL);
        }
        report_launch(k->name, via, rc);
        print_seen(k, i, fn[p->kernel], values, packed);
    }
    fake.observe(0);

    /* vec_add as a graph's kernel node, twice: clc leaves graph nodes unwrapped. */
    {
        CUgraph graph;
        CUgraphExec exec;
        CUgraphNode node;
        uint64_t values[MAX_ARGS];
        void *args[MAX_ARGS];
        CHECK(graph_create(&graph, 0));
        for (i = 0; i < 2; i++) {
            for (j = 0; j < 4; j++) {
                values[j] = arg_value(100 + i, j, KERNELS[0].size[j]);
                args[j] = &values[j];
            }
            CUDA_KERNEL_NODE_PARAMS np = {.func = fn[0], .gridDimX = 64, .gridDimY = 1,
                                          .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1,
                                          .blockDimZ = 1, .sharedMemBytes = 0,
                                          .kernelParams = args, .extra = NULL};
            fake.observe(1);
            capture_for(&KERNELS[0]);
            rc = graph_add(&node, graph, NULL, 0, &np);
            report("graph-add", K_VEC_ADD, "cuGraphAddKernelNode_v2", rc);
            seen_prefix = "node-seen";
            print_seen(&KERNELS[0], 100 + i, fn[0], values, NULL);
            seen_prefix = "seen";
            fake.observe(0);
        }
        CHECK(graph_instantiate(&exec, graph, 0));
        rc = graph_launch(exec, NULL);
        printf("graph-launch nodes=2 via cuGraphLaunch -> %d\n", (int)rc);
    }

    print_fake_counts();
    return 0;
}
