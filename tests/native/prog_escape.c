/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_escape LIB: opens LIB (a build of lib_escape.c) with RTLD_LOCAL and launches ok_kernel
 * and debug_kernel through its escape_next(), printing "rtld-next-own <kernel> via
 * cuLaunchKernel -> <rc>", then tries its escape_dlmopen(), then the fake driver's counts.
 */
#include "common.h"

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    const char *names[2] = {"ok_kernel", "debug_kernel"};
    start_program();
    void *lib = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) {
        fprintf(stderr, "FAILED dlopen: %s\n", dlerror());
        return 1;
    }
    CUresult (*escape_next)(CUfunction) = (CUresult(*)(CUfunction))dlsym(lib, "escape_next");
    int (*escape_dlmopen)(void) = (int (*)(void))dlsym(lib, "escape_dlmopen");
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX_HEADER PTX_ENTRY("ok_kernel") PTX_ENTRY("debug_kernel")));
    for (int k = 0; k < 2; k++) {
        CHECK(cuModuleGetFunction(&f, mod, names[k]));
        report("rtld-next-own", names[k], "cuLaunchKernel", escape_next(f));
    }
    escape_dlmopen();
    print_fake_counts();
    return 0;
}
