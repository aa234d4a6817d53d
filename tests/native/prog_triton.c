/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_triton: reaches the driver the way Triton's launcher does: dlopen("libcuda.so.1") and
 * dlsym of each plain name, cuLaunchKernelEx included; no cuGetProcAddress. Code comes from
 * cuModuleLoadData of PTX text, kernels are CUfunction handles with unmangled names, and the
 * big-shared-memory kernel opts in with cuFuncSetAttribute first, as Triton does.
 *
 * Driver counts without a shim: add_kernel launches=3, matmul_kernel launches=2,
 * debug_kernel launches=1 (no graphs).
 */
#include "common.h"

static void *h;

static void *sym(const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "FAILED dlsym(%s)\n", name);
        exit(1);
    }
    return p;
}

/* `SYM(f, cuLaunchKernelEx);` declares f with the header's type for that name. */
#define SYM(var, name) __typeof__(&name) var = sym(#name)

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add, matmul, debug;
    CUstream stream;
    int smem_optin = 98304, got = 0;
    unsigned long long x = 0, y = 0, out = 0, scratch = 0;
    int n = 4096;
    void *params[] = {&x, &y, &out, &n, &scratch};

    start_program();
    if (!(h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))) {
        fprintf(stderr, "FAILED dlopen(libcuda.so.1): %s\n", dlerror());
        return 1;
    }
    SYM(init, cuInit);
    SYM(device_get, cuDeviceGet);
    SYM(primary_retain, cuDevicePrimaryCtxRetain);
    SYM(get_current, cuCtxGetCurrent);
    SYM(set_current, cuCtxSetCurrent);
    SYM(module_load_data, cuModuleLoadData);
    SYM(module_get_function, cuModuleGetFunction);
    SYM(module_unload, cuModuleUnload);
    SYM(func_set_attribute, cuFuncSetAttribute);
    SYM(func_get_attribute, cuFuncGetAttribute);
    SYM(stream_create, cuStreamCreate);
    SYM(stream_sync, cuStreamSynchronize);
    SYM(launch_ex, cuLaunchKernelEx);

    /* PyTorch has made the primary context current before Triton's first launch. */
    CHECK(init(0));
    CHECK(device_get(&dev, 0));
    CHECK(get_current(&ctx));
    if (!ctx) {
        CHECK(primary_retain(&ctx, dev));
        CHECK(set_current(ctx));
    }
    CHECK(stream_create(&stream, CU_STREAM_NON_BLOCKING));

    CHECK(module_load_data(&mod, TRITON_PTX));
    CHECK(module_get_function(&add, mod, K_TRITON_ADD));
    CHECK(module_get_function(&matmul, mod, K_TRITON_MATMUL));
    CHECK(module_get_function(&debug, mod, K_TRITON_DEBUG));
    CHECK(func_set_attribute(matmul, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_optin));
    CHECK(func_get_attribute(&got, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, matmul));
    report_check("cuFuncGetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) == 98304",
                 got == smem_optin ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);

    /* num_warps=4: 128 threads per block. */
    CUlaunchConfig cfg = {.gridDimX = 16, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128,
                          .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = 0,
                          .hStream = stream, .attrs = NULL, .numAttrs = 0};
    report_launch(K_TRITON_ADD, "cuLaunchKernelEx", launch_ex(&cfg, add, params, NULL));
    report_launch(K_TRITON_ADD, "cuLaunchKernelEx", launch_ex(&cfg, add, params, NULL));

    /* num_ctas > 1: Triton adds a cluster shape and scheduling policy. */
    CUlaunchAttribute attrs[2];
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[0].value.clusterDim.x = 2;
    attrs[0].value.clusterDim.y = 1;
    attrs[0].value.clusterDim.z = 1;
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[1].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
    cfg.gridDimX = 32;
    cfg.attrs = attrs;
    cfg.numAttrs = 2;
    report_launch(K_TRITON_ADD, "cuLaunchKernelEx", launch_ex(&cfg, add, params, NULL));

    CUlaunchConfig mm = {.gridDimX = 8, .gridDimY = 8, .gridDimZ = 1, .blockDimX = 256,
                         .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = (unsigned)smem_optin,
                         .hStream = stream, .attrs = NULL, .numAttrs = 0};
    report_launch(K_TRITON_MATMUL, "cuLaunchKernelEx", launch_ex(&mm, matmul, params, NULL));
    report_launch(K_TRITON_MATMUL, "cuLaunchKernelEx", launch_ex(&mm, matmul, params, NULL));

    CUlaunchConfig one = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                          .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = 0,
                          .hStream = stream, .attrs = NULL, .numAttrs = 0};
    report_launch(K_TRITON_DEBUG, "cuLaunchKernelEx", launch_ex(&one, debug, params, NULL));

    CHECK(stream_sync(stream));
    CHECK(module_unload(mod));
    print_fake_counts();
    return 0;
}
