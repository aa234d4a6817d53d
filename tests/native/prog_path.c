/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_path DRIVER [stub]: opens the driver by the path DRIVER (a copy of it under another name,
 * without the usual SONAME) and reaches every function through dlsym on that handle, as a
 * program that ships its own driver would. Launches debug_kernel 3 times and vecAdd twice.
 * With "stub", DRIVER is a library that has cuLaunchKernel and nothing else of a driver's: the
 * program launches a made-up handle twice.
 */
#include "common.h"

#define SYM(h, var, name) __typeof__(&name) var = (__typeof__(&name))fake_sym(h, #name)

int main(int argc, char **argv)
{
    void *h;
    start_program();
    if (argc < 2 || !(h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL))) {
        fprintf(stderr, "FAILED dlopen(%s): %s\n", argc > 1 ? argv[1] : "?", dlerror());
        return 1;
    }
    SYM(h, launch, cuLaunchKernel);
    if (argc > 2 && strcmp(argv[2], "stub") == 0) {
        for (int i = 0; i < 2; i++)
            report_launch("stub_kernel", "cuLaunchKernel",
                          launch((CUfunction)(uintptr_t)0x1000, 1, 1, 1, 1, 1, 1, 0, NULL, NULL,
                                 NULL));
        return 0;
    }
    SYM(h, init, cuInit);
    SYM(h, device_get, cuDeviceGet);
    SYM(h, retain, cuDevicePrimaryCtxRetain);
    SYM(h, set_current, cuCtxSetCurrent);
    SYM(h, load, cuModuleLoadData);
    SYM(h, get_function, cuModuleGetFunction);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction debug, vecadd;
    CHECK(init(0));
    CHECK(device_get(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(set_current(ctx));
    CHECK(load(&mod, APP_PTX));
    CHECK(get_function(&debug, mod, K_DEBUG));
    CHECK(get_function(&vecadd, mod, K_VECADD));
    for (int i = 0; i < 3; i++)
        report_launch(K_DEBUG, "cuLaunchKernel",
                      launch(debug, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    for (int i = 0; i < 2; i++)
        report_launch(K_VECADD, "cuLaunchKernel",
                      launch(vecadd, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    return 0;
}
