/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_linked: linked with -lcuda and calling the symbols the header names directly, as a
 * hand-written driver-API program does. The header renames several: cuCtxCreate is
 * cuCtxCreate_v4, cuGraphAddKernelNode is cuGraphAddKernelNode_v2, cuGraphInstantiate is
 * cuGraphInstantiateWithFlags, cuEventElapsedTime, cuEventDestroy and cuCtxDestroy are their
 * _v2. cuLaunchKernel_ptsz is called by its own name. Code comes from cuModuleLoadFatBinary (a
 * fatbin container) and cuModuleLoad (a PTX file).
 *
 * Driver counts without a shim: vecAdd launches=3 graph=2, fill launches=3 graph=2,
 * debug_kernel launches=2, scale launches=0.
 */
#include "common.h"

#include <unistd.h>

/* Only a -DCUDA_API_PER_THREAD_DEFAULT_STREAM build gets this declared (as what cuLaunchKernel
 * means); the library exports it either way, with cuLaunchKernel's signature. */
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule app, fill_mod;
    CUfunction vecadd, debug, fill, missing;
    CUevent start, end;
    CUgraph graph;
    CUgraphExec exec;
    CUgraphNode nodes[2];
    size_t nnodes = 0;
    char devname[64], path[] = "/tmp/clc-fill-XXXXXX.ptx";
    const char *name;
    float a = 1.0f, ms = 0.0f;
    int n = 1024, fd;
    void *args[] = {&a, &a, &a, &n};
    CUresult rc;

    start_program();
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(devname, sizeof devname, dev));
    printf("device %s\n", devname);
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev)); /* CUDA 13: cuCtxCreate_v4, made current */

    CHECK(cuModuleLoadFatBinary(&app, make_fatbin(APP_PTX)));
    if ((fd = mkstemps(path, 4)) < 0 || write(fd, FILL_PTX, strlen(FILL_PTX)) < 0 || close(fd)) {
        perror("FAILED writing the PTX file");
        return 1;
    }
    rc = cuModuleLoad(&fill_mod, path);
    unlink(path);
    CHECK(rc);
    CHECK(cuModuleGetFunction(&vecadd, app, K_VECADD));
    CHECK(cuModuleGetFunction(&debug, app, K_DEBUG));
    CHECK(cuModuleGetFunction(&fill, fill_mod, K_FILL));
    report_check("cuModuleGetFunction(missing)", cuModuleGetFunction(&missing, app, "nope"));

    rc = cuFuncGetName(&name, vecadd);
    report("name", rc == CUDA_SUCCESS ? name : "?", "cuFuncGetName", rc);
    report_check("cuKernelGetName(CUfunction)", cuKernelGetName(&name, (CUkernel)vecadd));

    report_launch(K_VECADD, "cuLaunchKernel",
                  cuLaunchKernel(vecadd, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    report_launch(K_VECADD, "cuLaunchKernel_ptsz",
                  cuLaunchKernel_ptsz(vecadd, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    report_launch(K_FILL, "cuLaunchKernel",
                  cuLaunchKernel(fill, 8, 1, 1, 128, 1, 1, 0, CU_STREAM_PER_THREAD, args, NULL));
    report_launch(K_DEBUG, "cuLaunchKernel",
                  cuLaunchKernel(debug, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    report_launch(K_DEBUG, "cuLaunchKernel_ptsz",
                  cuLaunchKernel_ptsz(debug, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CUlaunchConfig cfg = {.gridDimX = 4, .gridDimY = 2, .gridDimZ = 1, .blockDimX = 16,
                          .blockDimY = 16, .blockDimZ = 1, .sharedMemBytes = 0,
                          .hStream = NULL, .attrs = NULL, .numAttrs = 0};
    report_launch(K_VECADD, "cuLaunchKernelEx", cuLaunchKernelEx(&cfg, vecadd, args, NULL));
    report_launch(K_FILL, "cuLaunchCooperativeKernel",
                  cuLaunchCooperativeKernel(fill, 2, 1, 1, 64, 1, 1, 0, NULL, args));

    /* Without a current context the driver refuses (201) before looking at the kernel. */
    CHECK(cuCtxSetCurrent(NULL));
    report("nocontext-launch", K_VECADD, "cuLaunchKernel",
           cuLaunchKernel(vecadd, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSetCurrent(ctx));

    /* A two-node graph, params with `func` set (the kern field unused). */
    CHECK(cuGraphCreate(&graph, 0));
    CUDA_KERNEL_NODE_PARAMS p = {.func = vecadd, .gridDimX = 4, .gridDimY = 1, .gridDimZ = 1,
                                 .blockDimX = 256, .blockDimY = 1, .blockDimZ = 1,
                                 .sharedMemBytes = 0, .kernelParams = args, .extra = NULL,
                                 .kern = NULL, .ctx = NULL};
    rc = cuGraphAddKernelNode(&nodes[nnodes], graph, NULL, 0, &p);
    report("graph-add", K_VECADD, "cuGraphAddKernelNode_v2", rc);
    nnodes += rc == CUDA_SUCCESS;
    p.func = fill;
    rc = cuGraphAddKernelNode(&nodes[nnodes], graph, nodes, nnodes, &p);
    report("graph-add", K_FILL, "cuGraphAddKernelNode_v2", rc);
    nnodes += rc == CUDA_SUCCESS;
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    char what[32];
    snprintf(what, sizeof what, "nodes=%zu", nnodes);
    report("graph-launch", what, "cuGraphLaunch", cuGraphLaunch(exec, NULL));
    report("graph-launch", what, "cuGraphLaunch", cuGraphLaunch(exec, NULL));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));

    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&end, CU_EVENT_DEFAULT));
    CHECK(cuEventRecord(start, NULL));
    report_launch(K_FILL, "cuLaunchKernel",
                  cuLaunchKernel(fill, 8, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    CHECK(cuEventRecord(end, NULL));
    CHECK(cuEventSynchronize(end));
    CHECK(cuEventQuery(end));
    rc = cuEventElapsedTime(&ms, start, end);
    printf("event elapsed_ms=%.6f -> %d\n", ms, (int)rc);
    CHECK(cuEventDestroy(start));
    CHECK(cuEventDestroy(end));

    /* A function of an unloaded module is a stale handle: 400. */
    CHECK(cuModuleUnload(app));
    report("stale-launch", K_VECADD, "cuLaunchKernel",
           cuLaunchKernel(vecadd, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CHECK(cuModuleUnload(fill_mod));
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxDestroy(ctx));
    print_fake_counts();
    return 0;
}
