/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_lookup: launches ok_kernel and debug_kernel through liblookup.so's own lookups of the
 * driver (dlsym(RTLD_NEXT), cuLaunchCooperativeKernelMultiDevice), printing
 * "<way> <kernel> -> <CUresult>" for each, then the fake driver's counts.
 */
#include "common.h"

CUresult lookup_launch_next(CUfunction f);
CUresult lookup_launch_multi(CUfunction f);

#define LOOKUP_PTX PTX_HEADER PTX_ENTRY("ok_kernel") PTX_ENTRY("debug_kernel")

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f[2];
    const char *names[2] = {"ok_kernel", "debug_kernel"};
    start_program();
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, LOOKUP_PTX));
    for (int k = 0; k < 2; k++) {
        CHECK(cuModuleGetFunction(&f[k], mod, names[k]));
        report("rtld-next", names[k], "cuLaunchKernel", lookup_launch_next(f[k]));
        report("multi", names[k], "cuLaunchCooperativeKernelMultiDevice",
               lookup_launch_multi(f[k]));
    }
    CHECK(cuCtxSynchronize());
    print_fake_counts();
    return 0;
}
