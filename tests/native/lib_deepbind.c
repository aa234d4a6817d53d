/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libdeepbind.so: linked with -lcuda and opened by prog_deepbind with RTLD_DEEPBIND, so that its
 * references to the driver bind to libcuda before the global scope, where the preloaded shim is.
 * deepbind_run() makes a context, loads ok_kernel and debug_kernel and launches each one way per
 * kind of reference a library can hold to a driver entry point, printing
 * "<way> <kernel> via <entry point> -> <rc>":
 *   direct   cuLaunchKernel called through the PLT (an R_X86_64_JUMP_SLOT relocation)
 *   table    cuLaunchKernel from a constant table of pointers (R_X86_64_64, in RELRO)
 *   address  cuLaunchKernel_ptsz, its address taken in code (R_X86_64_GLOB_DAT)
 *   dlsym    cuLaunchKernel as the library's own dlsym finds it in libcuda (dlsym binds deep too)
 *   saved    cuLaunchKernel as the library's constructor saved it, inside dlopen, while its
 *            references still led to libcuda
 *   libc     cuLaunchKernel as libc's own dlsym, taken from dlopen("libc.so.6"), finds it
 */
#include "common.h"

#define DEEPBIND_PTX PTX_HEADER PTX_ENTRY("ok_kernel") PTX_ENTRY("debug_kernel")

/* Declared by cuda.h only under CUDA_API_PER_THREAD_DEFAULT_STREAM; libcuda exports it. */
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

/* Global, so that the compiler cannot fold the pointer into a direct call. */
const launch_fn deepbind_table[1] = {cuLaunchKernel};

/* Saved by the constructor, which runs inside dlopen. */
launch_fn deepbind_saved;

__attribute__((constructor)) static void save_driver(void)
{
    launch_fn fn = cuLaunchKernel;
    __asm__ volatile("" : "+r"(fn));
    deepbind_saved = fn;
}

static CUresult launch(launch_fn fn, CUfunction f)
{
    return fn ? fn(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) : CUDA_ERROR_NOT_FOUND;
}

void deepbind_run(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    const char *names[2] = {"ok_kernel", "debug_kernel"};
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    launch_fn looked_up = cuda ? (launch_fn)dlsym(cuda, "cuLaunchKernel") : NULL;
    launch_fn address = cuLaunchKernel_ptsz;
    __asm__ volatile("" : "+r"(address)); /* loaded from the GOT here, not called directly */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *(*libc_dlsym)(void *, const char *) =
        libc ? (void *(*)(void *, const char *))dlsym(libc, "dlsym") : NULL;
    launch_fn via_libc = libc_dlsym && cuda ? (launch_fn)libc_dlsym(cuda, "cuLaunchKernel") : NULL;

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, DEEPBIND_PTX));
    for (int k = 0; k < 2; k++) {
        CHECK(cuModuleGetFunction(&f, mod, names[k]));
        report("direct", names[k], "cuLaunchKernel",
               cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        report("table", names[k], "cuLaunchKernel", launch(deepbind_table[0], f));
        report("address", names[k], "cuLaunchKernel_ptsz", launch(address, f));
        report("dlsym", names[k], "cuLaunchKernel", launch(looked_up, f));
        report("saved", names[k], "cuLaunchKernel", launch(deepbind_saved, f));
        report("libc", names[k], "cuLaunchKernel", launch(via_libc, f));
    }
    CHECK(cuCtxSynchronize());
}
