/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_cudart: reaches the driver the way libcudart does. One dlsym (cuGetProcAddress_v2),
 * then every entry point comes from cuGetProcAddress: the per-thread-stream variants with
 * flags CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, the graph-node calls with version
 * 12000 (the _v2 ABI whose params carry a CUkernel) and once with 11080 (the v1 ABI). Code is
 * registered as cudart registers it: a fatbin wrapper given to cuLibraryLoadData, kernels as
 * CUkernel handles.
 *
 * Driver counts without a shim: vecAdd launches=5 graph=2, scale launches=2 graph=3,
 * debug_kernel launches=1 graph=1.
 */
#include "common.h"

typedef CUresult (*pfn_add_node_v1)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                    const CUDA_KERNEL_NODE_PARAMS_v1 *);

int main(void)
{
    struct cudart rt;
    CUkernel k_vecadd, k_scale, k_debug;
    CUfunction f_scale;
    CUstream stream;
    CUevent start, end;
    CUgraph graph;
    CUgraphExec exec;
    CUgraphNode n_vecadd = NULL, n_middle = NULL, n_v1 = NULL, deps[3];
    size_t ndeps = 0;
    const char *name;
    float a = 1.0f, ms = 0.0f;
    int n = 1024;
    void *args[] = {&a, &a, &a, &n};
    void *probe;
    CUresult rc;

    start_program();
    /* The primary context made current and APP_PTX loaded as cudart registers it. */
    cudart_start(&rt, CUDART_RETAIN | CUDART_SET_CURRENT | CUDART_PRESERVED | CUDART_CLEANUP);

    RESOLVE(kernel_name, cuKernelGetName, RT_VERSION, 0);
    RESOLVE(kernel_function, cuKernelGetFunction, RT_VERSION, 0);
    RESOLVE(func_name, cuFuncGetName, RT_VERSION, 0);
    RESOLVE(stream_create, cuStreamCreate, RT_VERSION, 0);
    RESOLVE(stream_destroy, cuStreamDestroy, RT_VERSION, 0);
    RESOLVE(launch, cuLaunchKernel, RT_VERSION, 0);
    RESOLVE(launch_ptsz, cuLaunchKernel, RT_VERSION, PTSZ);
    RESOLVE(launch_ex, cuLaunchKernelEx, RT_VERSION, 0);
    RESOLVE(launch_ex_ptsz, cuLaunchKernelEx, RT_VERSION, PTSZ);
    RESOLVE(launch_coop, cuLaunchCooperativeKernel, RT_VERSION, 0);
    RESOLVE(launch_coop_ptsz, cuLaunchCooperativeKernel, RT_VERSION, PTSZ);
    RESOLVE(event_create, cuEventCreate, RT_VERSION, 0);
    RESOLVE(event_record, cuEventRecord, RT_VERSION, 0);
    RESOLVE(event_record_ptsz, cuEventRecord, RT_VERSION, PTSZ);
    RESOLVE(event_sync, cuEventSynchronize, RT_VERSION, 0);
    RESOLVE(event_elapsed, cuEventElapsedTime, RT_VERSION, 0);
    RESOLVE(event_destroy, cuEventDestroy, RT_VERSION, 0);
    RESOLVE(graph_create, cuGraphCreate, RT_VERSION, 0);
    RESOLVE(graph_destroy, cuGraphDestroy, RT_VERSION, 0);
    RESOLVE(add_node, cuGraphAddKernelNode, ABI_VERSION, 0);
    RESOLVE(node_set, cuGraphKernelNodeSetParams, ABI_VERSION, 0);
    RESOLVE(exec_node_set, cuGraphExecKernelNodeSetParams, ABI_VERSION, 0);
    RESOLVE(instantiate, cuGraphInstantiateWithFlags, RT_VERSION, 0);
    RESOLVE(graph_launch, cuGraphLaunch, RT_VERSION, 0);
    RESOLVE(exec_destroy, cuGraphExecDestroy, RT_VERSION, 0);
    /* An older runtime's view of the same name: the v1 ABI, params without `kern`. */
    pfn_add_node_v1 add_node_v1 = resolve("cuGraphAddKernelNode", 11080, 0);
    /* Names older than the version asked for are refused (status 2, version not sufficient). */
    resolve_rc("cuLibraryLoadData", 11080, 0, &probe);

    CHECK(stream_create(&stream, 0));
    k_vecadd = cudart_kernel(&rt, K_VECADD);
    k_scale = cudart_kernel(&rt, K_SCALE);
    k_debug = cudart_kernel(&rt, K_DEBUG);
    CHECK(kernel_function(&f_scale, k_scale));

    rc = kernel_name(&name, k_vecadd);
    report("name", rc == CUDA_SUCCESS ? name : "?", "cuKernelGetName", rc);
    report_check("cuFuncGetName(CUkernel)", func_name(&name, (CUfunction)k_vecadd));

    /* cudart launches a CUkernel by casting it to CUfunction. */
    CUfunction vecadd = (CUfunction)k_vecadd, scale = (CUfunction)k_scale;
    CUfunction debug = (CUfunction)k_debug;
    report_launch(K_VECADD, "cuLaunchKernel",
                  launch(vecadd, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    report_launch(K_VECADD, "cuLaunchKernel_ptsz",
                  launch_ptsz(vecadd, 4, 1, 1, 256, 1, 1, 0, stream, args, NULL));

    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PRIORITY, .value.priority = 0};
    CUlaunchConfig cfg = {.gridDimX = 8, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128,
                          .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = 1024,
                          .hStream = stream, .attrs = NULL, .numAttrs = 0};
    report_launch(K_SCALE, "cuLaunchKernelEx", launch_ex(&cfg, scale, args, NULL));
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    report_launch(K_SCALE, "cuLaunchKernelEx_ptsz", launch_ex_ptsz(&cfg, scale, args, NULL));

    report_launch(K_VECADD, "cuLaunchCooperativeKernel",
                  launch_coop(vecadd, 2, 1, 1, 128, 1, 1, 0, stream, args));
    report_launch(K_VECADD, "cuLaunchCooperativeKernel_ptsz",
                  launch_coop_ptsz(vecadd, 2, 1, 1, 128, 1, 1, 0, stream, args));
    report_launch(K_DEBUG, "cuLaunchKernel",
                  launch(debug, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));

    /* One launch between two events: the fake clock says 0.005 ms unless it was denied. */
    CHECK(event_create(&start, CU_EVENT_DEFAULT));
    CHECK(event_create(&end, CU_EVENT_DEFAULT));
    CHECK(event_record(start, stream));
    report_launch(K_VECADD, "cuLaunchKernel",
                  launch(vecadd, 4, 1, 1, 256, 1, 1, 0, stream, args, NULL));
    CHECK(event_record_ptsz(end, stream));
    CHECK(event_sync(end));
    rc = event_elapsed(&ms, start, end);
    printf("event elapsed_ms=%.6f -> %d\n", ms, (int)rc);
    CHECK(event_destroy(start));
    CHECK(event_destroy(end));

    /* A graph of three kernel nodes: two through the v2 ABI (func NULL, kern set), one v1. A
     * node whose add is refused is left out of the dependencies and of later calls. */
    CHECK(graph_create(&graph, 0));
    CUDA_KERNEL_NODE_PARAMS p = {.func = NULL, .gridDimX = 4, .gridDimY = 1, .gridDimZ = 1,
                                 .blockDimX = 256, .blockDimY = 1, .blockDimZ = 1,
                                 .sharedMemBytes = 0, .kernelParams = args, .extra = NULL,
                                 .kern = k_vecadd, .ctx = NULL};
    rc = add_node(&n_vecadd, graph, NULL, 0, &p);
    report("graph-add", K_VECADD, "cuGraphAddKernelNode_v2", rc);
    if (rc == CUDA_SUCCESS)
        deps[ndeps++] = n_vecadd;
    p.kern = k_scale;
    rc = add_node(&n_middle, graph, deps, ndeps, &p);
    report("graph-add", K_SCALE, "cuGraphAddKernelNode_v2", rc);
    if (rc == CUDA_SUCCESS)
        deps[ndeps++] = n_middle;
    else
        n_middle = NULL;
    CUDA_KERNEL_NODE_PARAMS_v1 p1 = {.func = f_scale, .gridDimX = 2, .gridDimY = 1,
                                     .gridDimZ = 1, .blockDimX = 64, .blockDimY = 1,
                                     .blockDimZ = 1, .sharedMemBytes = 0, .kernelParams = args,
                                     .extra = NULL};
    rc = add_node_v1(&n_v1, graph, deps, ndeps, &p1);
    report("graph-add", K_SCALE, "cuGraphAddKernelNode", rc);
    if (rc == CUDA_SUCCESS)
        deps[ndeps++] = n_v1;

    if (n_middle) { /* the middle node now runs debug_kernel... */
        p.kern = k_debug;
        report("graph-set", K_DEBUG, "cuGraphKernelNodeSetParams_v2", node_set(n_middle, &p));
    }
    CHECK(instantiate(&exec, graph, 0));
    char nodes[32];
    snprintf(nodes, sizeof nodes, "nodes=%zu", ndeps);
    report("graph-launch", nodes, "cuGraphLaunch", graph_launch(exec, stream));
    if (n_middle) { /* ...and, in the executable graph only, scale again */
        p.kern = k_scale;
        report("graph-exec-set", K_SCALE, "cuGraphExecKernelNodeSetParams_v2",
               exec_node_set(exec, n_middle, &p));
    }
    report("graph-launch", nodes, "cuGraphLaunch", graph_launch(exec, stream));
    CHECK(exec_destroy(exec));
    CHECK(graph_destroy(graph));

    CHECK(rt.ctx_sync(NULL));
    CHECK(stream_destroy(stream));
    CHECK(rt.library_unload(rt.lib));
    CHECK(rt.primary_release(rt.dev));
    print_fake_counts();
    return 0;
}
