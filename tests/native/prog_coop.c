/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_coop: cooperative launches of vecAdd (the kernel a policy confines), then a context made
 * with execution-affinity parameters. Prints where each ran, as prog_green does:
 *
 *   green LABEL rc=N first=F sms=S ordered=0|1
 *
 * small: 16 blocks (cuLaunchCooperativeKernel); whole: a grid that fills the whole device
 * (132 SMs x 32 blocks of 32 threads); whole-ex: the same through cuLaunchKernelEx with the
 * cooperative attribute; affinity: a plain launch of a module's vecAdd in a context made by
 * cuCtxCreate_v4 with execution-affinity parameters, which only an MPS client may make
 * (`check cuCtxCreate(affinity) -> 224` otherwise; FAKE_CUDA_MPS=1 plays one on the fake).
 */
#include "common.h"

static void where(const char *label, CUresult rc) { print_green(label, K_VECADD, rc); }

int main(void)
{
    CUdevice dev;
    CUcontext primary, made;
    CUlibrary lib;
    CUkernel vecadd;
    float a = 1.0f;
    int n = 1024;
    void *args[] = {&a, &a, &a, &n};

    start_program();
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuLibraryLoadData(&lib, APP_PTX, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&vecadd, lib, K_VECADD));
    CUfunction f = (CUfunction)vecadd;

    where("small", cuLaunchCooperativeKernel(f, 16, 1, 1, 32, 1, 1, 0, NULL, args));
    where("whole", cuLaunchCooperativeKernel(f, 132 * 32, 1, 1, 32, 1, 1, 0, NULL, args));
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE, .value.cooperative = 1};
    CUlaunchConfig config = {.gridDimX = 132 * 32, .gridDimY = 1, .gridDimZ = 1,
                             .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1,
                             .attrs = &attr, .numAttrs = 1};
    where("whole-ex", cuLaunchKernelEx(&config, f, args, NULL));

    CUexecAffinityParam affinity = {.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT,
                                    .param.smCount.val = 66};
    CUctxCreateParams params = {.execAffinityParams = &affinity, .numExecAffinityParams = 1};
    /* Only an MPS client may ask for an SM count (224 otherwise, as the driver says). */
    CUresult made_rc = cuCtxCreate(&made, &params, 0, dev);
    report_check("cuCtxCreate(affinity)", made_rc);
    if (made_rc == CUDA_SUCCESS) {
        CUmodule mod;
        CUfunction vecadd_made;
        CHECK(cuModuleLoadData(&mod, APP_PTX));
        CHECK(cuModuleGetFunction(&vecadd_made, mod, K_VECADD));
        where("affinity", cuLaunchKernel(vecadd_made, 4, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
        CHECK(cuCtxDestroy(made));
    }
    print_fake_counts();
    return 0;
}
