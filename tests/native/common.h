/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common.h: what the native test programs share: the code images they load, the lines they
 * print, and access to the fake driver's test-only counters. Header-only (everything is
 * static inline) so that each program stays a single .c file; include it before anything else.
 *
 * Output lines (stdout, one per call, grep-able; <rc> is the CUresult as a decimal number):
 *   launch <kernel> via <entry point> -> <rc>
 *   graph-add|graph-set|graph-exec-set <kernel> via <entry point> -> <rc>
 *   graph-launch nodes=<n> via <entry point> -> <rc>
 *   getproc <symbol> version=<v> flags=<f> -> <rc> status=<symbolStatus>
 *   name <kernel> via cuKernelGetName|cuFuncGetName -> <rc>
 *   event elapsed_ms=<ms> -> <rc>
 *   check <what> -> <rc>                  (a call expected to fail, e.g. a wrong handle type)
 *   fake: <kernel> launches=<n> graph=<n>  (at exit, the driver's true counts, sorted by name)
 *   fake-entry: <entry point> calls=<n>   (at exit, successful calls per counted entry point)
 * A forked child prefixes every line with "child: ".
 *
 * A launch that fails (e.g. 800, CUDA_ERROR_NOT_PERMITTED, when clc denies it) is printed and
 * the program goes on, like a real program reporting a CUDA error. Only a failing set-up call
 * (loading code, making a context) stops it, with "FAILED ..." on stderr and exit status 1.
 */
#ifndef CLC_TESTS_NATIVE_COMMON_H
#define CLC_TESTS_NATIVE_COMMON_H

#define _GNU_SOURCE
#include <cuda.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- kernels and images ------------------------------------------------------------------- */

/* nvcc's mangled names, as cudart-built programs have them:
 * vecAdd(const float*, const float*, float*, int), scale(float*, float),
 * debug_kernel(int*) (a target for deny rules) and fill(float*, int, float). */
#define K_VECADD "_Z6vecAddPKfS0_Pfi"
#define K_SCALE "_Z5scalePff"
#define K_DEBUG "_Z12debug_kernelPi"
#define K_FILL "_Z4fillPfif"

/* Triton names kernels after the Python function, unmangled. */
#define K_TRITON_ADD "add_kernel"
#define K_TRITON_MATMUL "matmul_kernel"
#define K_TRITON_DEBUG "debug_kernel"

#define PTX_HEADER ".version 8.0\n.target sm_90\n.address_size 64\n"
#define PTX_ENTRY(name) ".visible .entry " name "(\n)\n{\n\tret;\n}\n"

#define APP_PTX PTX_HEADER PTX_ENTRY(K_VECADD) PTX_ENTRY(K_SCALE) PTX_ENTRY(K_DEBUG)
#define FILL_PTX PTX_HEADER PTX_ENTRY(K_FILL)
#define TRITON_PTX                                                                                 \
    PTX_HEADER PTX_ENTRY(K_TRITON_ADD) PTX_ENTRY(K_TRITON_MATMUL) PTX_ENTRY(K_TRITON_DEBUG)

/* A fatbin container: this header, then its entries. */
struct fake_fatbin_header {
    uint32_t magic; /* 0xBA55ED50 */
    uint16_t version;
    uint16_t header_size;
    uint64_t payload_size;
};

/* An entry's header, as nvcc's fatbinary writes it for an uncompressed PTX entry
 * (clc/wrapping/fatbin.py has every field): 64 bytes, then an options block (the offset of an
 * empty options string, and its length) and that string, padded to 8; the entry's code follows,
 * NUL-padded to 8 bytes. */
struct fake_fatbin_entry {
    uint16_t kind;   /* 1: PTX */
    uint16_t format; /* 0x0101 */
    uint32_t header_size;
    uint64_t payload_size;
    uint32_t compressed_size;
    uint32_t options_offset; /* 64 */
    uint16_t minor, major;   /* PTX ISA version */
    uint32_t arch;
    uint32_t ident_offset, ident_length;
    uint64_t flags; /* 0x11: 64-bit Linux code */
    uint64_t unknown;
    uint64_t uncompressed_size;
    uint32_t options_text_offset; /* 72 */
    uint32_t options_text_length; /* 0 */
    uint64_t options_text;        /* "" */
};

/* What nvcc emits for each translation unit and cudart hands to cuLibraryLoadData. */
struct fake_fatbin_wrapper {
    uint32_t magic; /* 0x466243b1 */
    uint32_t version;
    const void *data; /* the container */
    void *filename_or_fatbins;
};

/* Returns a malloc'd container holding ptx as one uncompressed compute_90 PTX entry, as the
 * real driver reads it (never freed: cudart's images live as long as the program, which is
 * what CU_LIBRARY_BINARY_IS_PRESERVED promises the driver). */
static inline const void *make_fatbin(const char *ptx)
{
    size_t len = strlen(ptx) + 1, padded = (len + 7) & ~(size_t)7;
    struct fake_fatbin_entry e = {1,    0x0101, sizeof e, padded, 0, 64, 0, 8, 90, 0, 0,
                                  0x11, 0,      0,        72,     0, 0};
    struct fake_fatbin_header h = {0xBA55ED50u, 1, sizeof h, sizeof e + padded};
    unsigned char *buf = calloc(1, sizeof h + sizeof e + padded);
    if (!buf) {
        fprintf(stderr, "FAILED out of memory\n");
        exit(1);
    }
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, &e, sizeof e);
    memcpy(buf + sizeof h + sizeof e, ptx, len);
    return buf;
}

static inline struct fake_fatbin_wrapper make_fatbin_wrapper(const void *fatbin)
{
    struct fake_fatbin_wrapper w = {0x466243b1u, 1, fatbin, NULL};
    return w;
}

/* ---- output ------------------------------------------------------------------------------- */



static const char *g_role = ""; /* "child: " in a forked child */
static inline int over_fake_driver(void);

/* With CLC_NATIVE_SAY_DRIVER=1, at exit: `driver: fake` or `driver: real`, which libcuda.so.1
 * the process used (tests/gpu/test_fake_fidelity.py checks that each run had the one it
 * meant). */
static inline void say_driver(void)
{
    printf("%sdriver: %s\n", g_role, over_fake_driver() ? "fake" : "real");
}

/* Line-buffered even into a pipe, so lines interleave sensibly with the shim's own output and
 * nothing buffered is printed twice after fork(). */
static inline void start_program(void)
{
    const char *say = getenv("CLC_NATIVE_SAY_DRIVER");
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (say && strcmp(say, "1") == 0)
        atexit(say_driver);
}

static inline void report(const char *what, const char *subject, const char *via, CUresult rc)
{
    printf("%s%s %s via %s -> %d\n", g_role, what, subject, via, (int)rc);
}

static inline void report_launch(const char *kernel, const char *via, CUresult rc)
{
    report("launch", kernel, via, rc);
}

static inline void report_check(const char *what, CUresult rc)
{
    printf("%scheck %s -> %d\n", g_role, what, (int)rc);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            fprintf(stderr, "%sFAILED %s -> %d (%s:%d)\n", g_role, #call, (int)rc_, __FILE__,      \
                    __LINE__);                                                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- the fake driver's counters -----------------------------------------------------------------
 * Looked up with dlsym in the already loaded libcuda.so.1, so every program reads them the same
 * way however it reached the driver. Over a real driver the `fake:` lines are not printed, and
 * the programs that print what the fake saw print only what the program saw. */

struct fake_api {
    unsigned long (*launch_count)(const char *name);
    unsigned long (*graph_launch_count)(const char *name);
    unsigned long (*total_launches)(void);
    unsigned long (*total_graph_launches)(void);
    unsigned long (*entry_count)(const char *entry);
    const char *(*entry_name)(unsigned i);
    unsigned (*kernel_count)(void);
    const char *(*kernel_name)(unsigned i);
};

/* One of the fake driver's test hooks in the loaded libcuda.so.1, or NULL over a real driver
 * (the programs also run there: tests/gpu/test_fake_fidelity.py compares what they observe). */
static inline void *fake_hook(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h ? dlsym(h, name) : NULL;
}

static inline int over_fake_driver(void) { return fake_hook("fake_cuda_launch_count") != NULL; }

/* `green LABEL rc=N first=F sms=S ordered=0|1`: where the fake ran `kernel`'s last launch
 * (fake_cuda_last_green: its first SM, how many, whether in the stream's order), after a
 * launch or node that returned rc. Over a real driver, `green LABEL rc=N` only. */
static inline void print_green(const char *label, const char *kernel, CUresult rc)
{
    typedef int (*last_green_t)(const char *, unsigned *, unsigned *, int *, unsigned long *);
    last_green_t last_green = (last_green_t)fake_hook("fake_cuda_last_green");
    unsigned first = 0, sms = 0;
    unsigned long n = 0;
    int ordered = 0;
    if (!last_green) {
        printf("%sgreen %s rc=%d\n", g_role, label, (int)rc);
        return;
    }
    last_green(kernel, &first, &sms, &ordered, &n);
    printf("%sgreen %s rc=%d first=%u sms=%u ordered=%d\n", g_role, label, (int)rc, first, sms,
           ordered);
}

static inline void *fake_sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "%sFAILED dlsym(%s): not running over the fake libcuda.so.1?\n", g_role,
                name);
        exit(1);
    }
    return p;
}

static inline struct fake_api load_fake_api(void)
{
    struct fake_api api;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%sFAILED dlopen(libcuda.so.1): %s\n", g_role, dlerror());
        exit(1);
    }
    api.launch_count = fake_sym(h, "fake_cuda_launch_count");
    api.graph_launch_count = fake_sym(h, "fake_cuda_graph_launch_count");
    api.total_launches = fake_sym(h, "fake_cuda_total_launches");
    api.total_graph_launches = fake_sym(h, "fake_cuda_total_graph_launches");
    api.entry_count = fake_sym(h, "fake_cuda_entry_count");
    api.entry_name = fake_sym(h, "fake_cuda_entry_name");
    api.kernel_count = fake_sym(h, "fake_cuda_kernel_count");
    api.kernel_name = fake_sym(h, "fake_cuda_kernel_name");
    return api;
}

/* The `fake:` and `fake-entry:` lines every program ends with. */
static inline void print_fake_counts(void)
{
    if (!over_fake_driver())
        return; /* a real driver's counts are not known to the program */
    struct fake_api api = load_fake_api();
    unsigned i, n = api.kernel_count();
    const char *name;
    for (i = 0; i < n; i++) {
        name = api.kernel_name(i);
        printf("%sfake: %s launches=%lu graph=%lu\n", g_role, name, api.launch_count(name),
               api.graph_launch_count(name));
    }
    for (i = 0; (name = api.entry_name(i)); i++)
        printf("%sfake-entry: %s calls=%lu\n", g_role, name, api.entry_count(name));
    fflush(stdout);
}

/* ---- reaching the driver the way cudart does ----------------------------------------------------
 * dlopen("libcuda.so.1"), dlsym the one symbol cuGetProcAddress_v2, ask it for
 * "cuGetProcAddress" itself and resolve everything else through the answer. */

#define RT_VERSION 13000  /* the runtime version these programs pretend to be */
#define ABI_VERSION 12000 /* cudart 12's version for the ABI-versioned graph-node calls */
#define PTSZ CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

typedef __typeof__(&cuGetProcAddress_v2) pfn_getproc_t;
static pfn_getproc_t g_getproc;

/* Prints the getproc line and returns the driver's answer. */
static inline CUresult resolve_rc(const char *symbol, int version, cuuint64_t flags, void **pfn)
{
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = g_getproc(symbol, pfn, version, flags, &status);
    printf("%sgetproc %s version=%d flags=%llu -> %d status=%d\n", g_role, symbol, version,
           (unsigned long long)flags, (int)rc, (int)status);
    return rc;
}

static inline void *resolve(const char *symbol, int version, cuuint64_t flags)
{
    void *p = NULL;
    if (resolve_rc(symbol, version, flags, &p) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "%sFAILED cuGetProcAddress(%s)\n", g_role, symbol);
        exit(1);
    }
    return p;
}

/* `RESOLVE(launch, cuLaunchKernel, v, 0);` declares `launch` with the type the header gives the
 * name (cuEventDestroy's is cuEventDestroy_v2's) and asks the driver for the base name. */
#define RESOLVE(var, sym, version, flags) __typeof__(&sym) var = resolve(#sym, version, flags)

static inline void cudart_open(void)
{
    pfn_getproc_t bootstrap;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "FAILED dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    if (!(bootstrap = (pfn_getproc_t)dlsym(h, "cuGetProcAddress_v2"))) {
        fprintf(stderr, "FAILED dlsym(cuGetProcAddress_v2)\n");
        exit(1);
    }
    g_getproc = bootstrap;
    g_getproc = resolve("cuGetProcAddress", ABI_VERSION, 0);
}

/* ---- a cudart-style program's start-up ----------------------------------------------------------
 * cudart_start(&rt, flags) does what prog_cudart, prog_threads, prog_fork, prog_teardown and
 * prog_graph_generic all begin with: cudart_open(), cuGetProcAddress (RT_VERSION, flags 0) of the
 * entry points below, then cuInit, cuDeviceGet of device 0, [retain the primary context, [make
 * it current]], and cuLibraryLoadData of APP_PTX in a fatbin wrapper, as cudart registers code.
 * The program resolves whatever else it needs afterwards, so its getproc lines keep their order:
 *
 *   init, device_get, primary_retain, [primary_release, CUDART_CLEANUP], set_current (at the
 *   end instead with CUDART_SET_CURRENT_LAST), [ctx_sync, CUDART_CLEANUP], library_load,
 *   [library_unload, CUDART_CLEANUP], get_kernel
 *
 * rt must stay put while the library is loaded: the wrapper handed to the driver lives in it. */

#define CUDART_RETAIN 0x1            /* retain device 0's primary context into rt->ctx */
#define CUDART_SET_CURRENT 0x2       /* and make it current (with CUDART_RETAIN) */
#define CUDART_PRESERVED 0x4         /* load with CU_LIBRARY_BINARY_IS_PRESERVED, as cudart does */
#define CUDART_CLEANUP 0x8           /* also resolve primary_release, ctx_sync, library_unload */
#define CUDART_SET_CURRENT_LAST 0x10 /* resolve cuCtxSetCurrent after cuLibraryGetKernel */

struct cudart {
    __typeof__(&cuInit) init;
    __typeof__(&cuDeviceGet) device_get;
    __typeof__(&cuDevicePrimaryCtxRetain) primary_retain;
    __typeof__(&cuDevicePrimaryCtxRelease) primary_release; /* CUDART_CLEANUP only */
    __typeof__(&cuCtxSetCurrent) set_current;
    /* CUDART_CLEANUP only: CUDA 13's cuCtxSynchronize, which names the context (NULL: current) */
    CUresult (*ctx_sync)(CUcontext);
    __typeof__(&cuLibraryLoadData) library_load;
    __typeof__(&cuLibraryUnload) library_unload; /* CUDART_CLEANUP only */
    __typeof__(&cuLibraryGetKernel) get_kernel;
    CUdevice dev;
    CUcontext ctx; /* CUDART_RETAIN only */
    CUlibrary lib;
    struct fake_fatbin_wrapper wrapper;
};

static inline void cudart_start(struct cudart *rt, unsigned flags)
{
    int cleanup = (flags & CUDART_CLEANUP) != 0, set_last = (flags & CUDART_SET_CURRENT_LAST) != 0;
    int preserved = (flags & CUDART_PRESERVED) != 0;
    CUlibraryOption lib_opt = CU_LIBRARY_BINARY_IS_PRESERVED;
    void *lib_val = (void *)(uintptr_t)1;

    memset(rt, 0, sizeof *rt);
    cudart_open();
    rt->init = resolve("cuInit", RT_VERSION, 0);
    rt->device_get = resolve("cuDeviceGet", RT_VERSION, 0);
    rt->primary_retain = resolve("cuDevicePrimaryCtxRetain", RT_VERSION, 0);
    if (cleanup)
        rt->primary_release = resolve("cuDevicePrimaryCtxRelease", RT_VERSION, 0);
    if (!set_last)
        rt->set_current = resolve("cuCtxSetCurrent", RT_VERSION, 0);
    if (cleanup)
        rt->ctx_sync = resolve("cuCtxSynchronize", RT_VERSION, 0);
    rt->library_load = resolve("cuLibraryLoadData", RT_VERSION, 0);
    if (cleanup)
        rt->library_unload = resolve("cuLibraryUnload", RT_VERSION, 0);
    rt->get_kernel = resolve("cuLibraryGetKernel", RT_VERSION, 0);
    if (set_last)
        rt->set_current = resolve("cuCtxSetCurrent", RT_VERSION, 0);

    /* cuInit makes no context current; cudart retains the primary context and sets it. */
    CHECK(rt->init(0));
    CHECK(rt->device_get(&rt->dev, 0));
    if (flags & CUDART_RETAIN) {
        CHECK(rt->primary_retain(&rt->ctx, rt->dev));
        if (flags & CUDART_SET_CURRENT)
            CHECK(rt->set_current(rt->ctx));
    }

    /* cudart's registration: the fatbin wrapper, kept alive by the program. */
    rt->wrapper = make_fatbin_wrapper(make_fatbin(APP_PTX));
    CHECK(rt->library_load(&rt->lib, &rt->wrapper, NULL, NULL, 0, preserved ? &lib_opt : NULL,
                           preserved ? &lib_val : NULL, preserved ? 1 : 0));
}

/* A kernel of rt's library, as cudart holds it (a CUkernel). */
static inline CUkernel cudart_kernel(const struct cudart *rt, const char *name)
{
    CUkernel k;
    CHECK(rt->get_kernel(&k, rt->lib, name));
    return k;
}

#endif /* CLC_TESTS_NATIVE_COMMON_H */
