/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_green: launches vecAdd (the kernel a policy confines) and fill (left alone) on every
 * stream kind and entry point, each followed by work of the program's own on the same stream
 * (an event record), and prints where each launch ran, as the fake driver saw it:
 *
 *   green LABEL rc=N first=F sms=S ordered=0|1
 *
 * then a stream destroyed and made again at the same place, a stream capture of a launch, a
 * context destroyed, a primary-context reset, and at the end:
 *
 *   order-violations N
 *   green-contexts created=C destroyed=D streams=S streams-destroyed=X
 */
#include "common.h"

/* Declared only in a -DCUDA_API_PER_THREAD_DEFAULT_STREAM build; exported either way. */
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
extern __typeof__(cuEventRecord) cuEventRecord_ptsz;


static CUevent g_mark;

/* Where the kernel's last launch ran; then the program's own work on `stream`. */
static void where(const char *label, const char *kernel, CUresult rc, CUstream stream, int ptsz)
{
    print_green(label, kernel, rc);
    CUresult r = ptsz ? cuEventRecord_ptsz(g_mark, stream) : cuEventRecord(g_mark, stream);
    if (r != CUDA_SUCCESS)
        printf("FAILED program's event record on %s: %d\n", label, (int)r);
}

int main(void)
{
    CUdevice dev;
    CUcontext primary, other;
    CUmodule app, fill_mod;
    CUfunction vecadd, fill;
    CUstream s, s_prio;
    CUgraph graph;
    float a = 1.0f;
    int n = 1024;
    void *args[] = {&a, &a, &a, &n};

    start_program();
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuModuleLoadData(&app, APP_PTX));
    CHECK(cuModuleLoadData(&fill_mod, FILL_PTX));
    CHECK(cuModuleGetFunction(&vecadd, app, K_VECADD));
    CHECK(cuModuleGetFunction(&fill, fill_mod, K_FILL));
    CHECK(cuEventCreate(&g_mark, CU_EVENT_DISABLE_TIMING));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreateWithPriority(&s_prio, CU_STREAM_DEFAULT, -1));

    where("legacy", K_VECADD, cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, NULL, args, NULL),
          NULL, 0);
    where("legacy-again", K_VECADD,
          cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, CU_STREAM_LEGACY, args, NULL), NULL, 0);
    where("ptsz", K_VECADD, cuLaunchKernel_ptsz(vecadd, 4, 1, 1, 32, 1, 1, 0, NULL, args, NULL),
          NULL, 1);
    where("per-thread", K_VECADD,
          cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, args, NULL),
          CU_STREAM_PER_THREAD, 0);
    where("stream", K_VECADD, cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, s, args, NULL), s, 0);
    where("priority", K_VECADD, cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, s_prio, args, NULL),
          s_prio, 0);
    CUlaunchConfig cfg = {.gridDimX = 4, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                          .blockDimY = 1, .blockDimZ = 1, .hStream = s};
    where("ex", K_VECADD, cuLaunchKernelEx(&cfg, vecadd, args, NULL), s, 0);
    where("cooperative", K_VECADD,
          cuLaunchCooperativeKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, s, args), s, 0);
    where("unconfined", K_FILL, cuLaunchKernel(fill, 4, 1, 1, 32, 1, 1, 0, s, args, NULL), s, 0);

    /* The program's stream destroyed, another made (possibly at the same address). */
    CHECK(cuStreamDestroy(s));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    where("new-stream", K_VECADD, cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, s, args, NULL), s,
          0);

    /* A launch captured into a graph, in global mode. */
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    where("captured", K_VECADD, cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, s, args, NULL), s,
          0);
    report_check("cuStreamEndCapture", cuStreamEndCapture(s, &graph));

    /* Another context, destroyed after a confined launch. */
    CHECK(cuCtxCreate(&other, NULL, 0, dev));
    CUmodule app2;
    CUfunction vecadd2;
    CUevent mark2;
    CHECK(cuModuleLoadData(&app2, APP_PTX));
    CHECK(cuModuleGetFunction(&vecadd2, app2, K_VECADD));
    CHECK(cuEventCreate(&mark2, CU_EVENT_DISABLE_TIMING));
    CUevent keep = g_mark;
    g_mark = mark2;
    where("other-context", K_VECADD,
          cuLaunchKernel(vecadd2, 4, 1, 1, 32, 1, 1, 0, NULL, args, NULL), NULL, 0);
    g_mark = keep;
    CHECK(cuCtxDestroy(other));
    CHECK(cuCtxSetCurrent(primary));
    where("after-destroy", K_VECADD, cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, s, args, NULL),
          s, 0);

    /* A reset of the primary context (cudaDeviceReset), then everything made again. */
    CHECK(cuDevicePrimaryCtxReset(dev));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuModuleLoadData(&app, APP_PTX));
    CHECK(cuModuleGetFunction(&vecadd, app, K_VECADD));
    CHECK(cuEventCreate(&g_mark, CU_EVENT_DISABLE_TIMING));
    where("after-reset", K_VECADD,
          cuLaunchKernel(vecadd, 4, 1, 1, 32, 1, 1, 0, NULL, args, NULL), NULL, 0);
    CHECK(cuCtxSynchronize());

    /* Graph kernel nodes made with the graph API: of a module's function (no CUkernel: it
     * cannot be put in a green context), of a library's kernel, and of that kernel's function
     * in the context (what cudart gives). */
    CUlibrary lib;
    CUkernel kern;
    CUgraphNode node;
    CHECK(cuLibraryLoadData(&lib, APP_PTX, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kern, lib, K_VECADD));
    CUfunction kern_fn;
    CHECK(cuKernelGetFunction(&kern_fn, kern));
    /* The library kernel is named by the CUkernel (`kern`, func NULL), then by its function in
     * the context, as cudart does. */
    CUfunction node_fn[3] = {vecadd, NULL, kern_fn};
    const char *node_label[3] = {"graph-node-module", "graph-node-library",
                                 "graph-node-function"};
    CUgraph graphs3[3];
    CUgraphExec execs3[3];
    for (int i = 0; i < 3; i++) {
        CUDA_KERNEL_NODE_PARAMS np = {.func = node_fn[i], .gridDimX = 4, .gridDimY = 1,
                                      .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1,
                                      .blockDimZ = 1, .kernelParams = args,
                                      .kern = node_fn[i] ? NULL : kern};
        CHECK(cuGraphCreate(&graphs3[i], 0));
        CUresult rc = cuGraphAddKernelNode(&node, graphs3[i], NULL, 0, &np);
        if (rc == CUDA_SUCCESS) {
            CHECK(cuGraphInstantiate(&execs3[i], graphs3[i], 0));
            CHECK(cuGraphLaunch(execs3[i], NULL));
        }
        where(node_label[i], K_VECADD, rc, NULL, 0);
    }

    if (!over_fake_driver())
        return 0; /* over a real driver */
    unsigned long (*violations)(void) = fake_sym(h, "fake_cuda_order_violations");
    void (*counts)(unsigned long *, unsigned long *, unsigned long *, unsigned long *) =
        fake_sym(h, "fake_cuda_green_counts");
    unsigned long created, destroyed, streams, streams_destroyed;
    counts(&created, &destroyed, &streams, &streams_destroyed);
    printf("order-violations %lu\n", violations());
    printf("green-contexts created=%lu destroyed=%lu streams=%lu streams-destroyed=%lu\n",
           created, destroyed, streams, streams_destroyed);
    print_fake_counts();
    return 0;
}
