/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_graph_generic: kernel nodes through the generic graph-node API of CUDA 12.2+, where one
 * CUgraphNodeParams (a type and a union) describes a node of any type. Reaches the driver as
 * cudart does (see prog_cudart.c) and asks cuGetProcAddress for "cuGraphAddNode" twice: with
 * version 12030 (the _v2 ABI, per-dependency CUgraphEdgeData before the count) and with 12020
 * (the 12.2 ABI without it).
 *
 * In one graph, each call printed as it returns (grid X in brackets, the only field that
 * differs, so a test can tell the calls apart in a capture):
 *   graph-add vecAdd        via cuGraphAddNode_v2         (node A)  [4]
 *   graph-add debug_kernel  via cuGraphAddNode            (node B, after A) [1]
 *   graph-add memset        via cuGraphAddNode_v2         (node C, after A and B, edge data)
 *   graph-set debug_kernel  via cuGraphNodeSetParams      (A)       [2]
 *   graph-set scale         via cuGraphNodeSetParams      (A)       [8]
 *   instantiate
 *   graph-exec-set debug_kernel via cuGraphExecNodeSetParams (A)    [3]
 *   graph-exec-set vecAdd   via cuGraphExecNodeSetParams  (A)       [16]
 *   graph-launch nodes=<nodes created> via cuGraphLaunch
 * A refused call is printed and the program goes on; calls on a node that was never created
 * are left out. Driver counts without a shim: vecAdd graph=1, debug_kernel graph=1, scale
 * graph=0 (the memset node runs no kernel).
 */
#include "common.h"

/* cudaTypedefs.h's PFN_cuGraphAddNode_v12020 and _v12030 (only cuda.h is needed here). */
typedef CUresult (*pfn_add_node_v12020)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                        CUgraphNodeParams *);
typedef CUresult (*pfn_add_node_v12030)(CUgraphNode *, CUgraph, const CUgraphNode *,
                                        const CUgraphEdgeData *, size_t, CUgraphNodeParams *);

#define GENERIC_VERSION 12020 /* first version of cuGraphAddNode and the two setters */
#define EDGE_VERSION 12030    /* first version of cuGraphAddNode's _v2 ABI */

/* A kernel node's parameters: the v3 struct, CUkernel in `kern` with `func` NULL, as cudart
 * fills it. Everything not named is zero, as the reserved fields must be. */
static CUgraphNodeParams kernel_params(CUkernel k, unsigned grid, void **args)
{
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_KERNEL;
    p.kernel.func = NULL;
    p.kernel.kern = k;
    p.kernel.ctx = NULL;
    p.kernel.gridDimX = grid;
    p.kernel.gridDimY = p.kernel.gridDimZ = 1;
    p.kernel.blockDimX = 256;
    p.kernel.blockDimY = p.kernel.blockDimZ = 1;
    p.kernel.sharedMemBytes = 0;
    p.kernel.kernelParams = args;
    p.kernel.extra = NULL;
    return p;
}

int main(void)
{
    struct cudart rt;
    CUkernel k_vecadd, k_scale, k_debug;
    CUstream stream;
    CUgraph graph;
    CUgraphExec exec;
    CUgraphNode n_a = NULL, n_b = NULL, n_c = NULL, deps[3];
    CUgraphEdgeData edges[3];
    CUgraphNodeParams p;
    size_t ndeps = 0, nodes = 0;
    float a = 1.0f;
    int n = 1024;
    void *args[] = {&a, &a, &a, &n};
    CUresult rc;
    char what[32];
    CUdeviceptr buffer;

    start_program();
    cudart_start(&rt, CUDART_RETAIN | CUDART_SET_CURRENT | CUDART_PRESERVED | CUDART_CLEANUP);
    RESOLVE(stream_create, cuStreamCreate, RT_VERSION, 0);
    RESOLVE(stream_destroy, cuStreamDestroy, RT_VERSION, 0);
    RESOLVE(graph_create, cuGraphCreate, RT_VERSION, 0);
    RESOLVE(graph_destroy, cuGraphDestroy, RT_VERSION, 0);
    RESOLVE(instantiate, cuGraphInstantiateWithFlags, RT_VERSION, 0);
    RESOLVE(graph_launch, cuGraphLaunch, RT_VERSION, 0);
    RESOLVE(exec_destroy, cuGraphExecDestroy, RT_VERSION, 0);
    RESOLVE(node_set, cuGraphNodeSetParams, GENERIC_VERSION, 0);
    RESOLVE(exec_node_set, cuGraphExecNodeSetParams, GENERIC_VERSION, 0);
    RESOLVE(mem_alloc, cuMemAlloc, RT_VERSION, 0);
    /* One name, two ABIs: which one comes back depends only on the version asked for. */
    pfn_add_node_v12030 add_node_v2 = resolve("cuGraphAddNode", EDGE_VERSION, 0);
    pfn_add_node_v12020 add_node_v1 = resolve("cuGraphAddNode", GENERIC_VERSION, 0);

    CHECK(stream_create(&stream, 0));
    CHECK(mem_alloc(&buffer, 1024)); /* what the memset node sets */
    k_vecadd = cudart_kernel(&rt, K_VECADD);
    k_scale = cudart_kernel(&rt, K_SCALE);
    k_debug = cudart_kernel(&rt, K_DEBUG);

    CHECK(graph_create(&graph, 0));

    /* A: vecAdd through the 12.3 ABI, no dependencies (and so no edge data). */
    p = kernel_params(k_vecadd, 4, args);
    rc = add_node_v2(&n_a, graph, NULL, NULL, 0, &p);
    report("graph-add", K_VECADD, "cuGraphAddNode_v2", rc);
    if (rc == CUDA_SUCCESS) {
        deps[ndeps++] = n_a;
        nodes++;
    } else {
        n_a = NULL;
    }

    /* B: debug_kernel through the 12.2 ABI, after A. */
    p = kernel_params(k_debug, 1, args);
    rc = add_node_v1(&n_b, graph, deps, ndeps, &p);
    report("graph-add", K_DEBUG, "cuGraphAddNode", rc);
    if (rc == CUDA_SUCCESS) {
        deps[ndeps++] = n_b;
        nodes++;
    } else {
        n_b = NULL;
    }

    /* C: a memset node after everything so far, with explicit default edge data. */
    memset(&p, 0, sizeof p);
    memset(edges, 0, sizeof edges);
    p.type = CU_GRAPH_NODE_TYPE_MEMSET;
    p.memset.dst = buffer;
    p.memset.pitch = 0;
    p.memset.value = 0;
    p.memset.elementSize = 4;
    p.memset.width = 256;
    p.memset.height = 1;
    p.memset.ctx = NULL;
    rc = add_node_v2(&n_c, graph, deps, edges, ndeps, &p);
    report("graph-add", "memset", "cuGraphAddNode_v2", rc);
    if (rc == CUDA_SUCCESS)
        nodes++;
    else
        n_c = NULL;

    /* A becomes debug_kernel (what a deny policy must stop), then scale. */
    if (n_a) {
        p = kernel_params(k_debug, 2, args);
        report("graph-set", K_DEBUG, "cuGraphNodeSetParams", node_set(n_a, &p));
        p = kernel_params(k_scale, 8, args);
        report("graph-set", K_SCALE, "cuGraphNodeSetParams", node_set(n_a, &p));
    }

    CHECK(instantiate(&exec, graph, 0));

    /* In the executable graph only: A becomes debug_kernel, then vecAdd. */
    if (n_a) {
        p = kernel_params(k_debug, 3, args);
        report("graph-exec-set", K_DEBUG, "cuGraphExecNodeSetParams",
               exec_node_set(exec, n_a, &p));
        p = kernel_params(k_vecadd, 16, args);
        report("graph-exec-set", K_VECADD, "cuGraphExecNodeSetParams",
               exec_node_set(exec, n_a, &p));
    }

    snprintf(what, sizeof what, "nodes=%zu", nodes);
    report("graph-launch", what, "cuGraphLaunch", graph_launch(exec, stream));

    CHECK(exec_destroy(exec));
    CHECK(graph_destroy(graph));
    CHECK(rt.ctx_sync(NULL));
    CHECK(stream_destroy(stream));
    CHECK(rt.library_unload(rt.lib));
    CHECK(rt.primary_release(rt.dev));
    print_fake_counts();
    return 0;
}
