/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_conditional: vecAdd (the kernel a policy confines) in CUDA graphs with conditional nodes,
 * the ways a program fills a conditional node's body (the kernel node API, the generic node
 * API, capture into the body, a nested body, a child graph made apart), and once in a plain
 * graph by the generic node API. The driver requires every kernel of a body to be in the conditional node's context.
 * With `churn N`, N graphs each holding a while node are made and destroyed first. Prints, per
 * case:
 *
 *   cond LABEL add=RC instantiate=RC
 *
 * (add: the kernel node's or captured launch's result; instantiate: the graph's), and for the
 * plain graph where its launch ran, as prog_green does:
 *
 *   green plain-generic rc=N first=F sms=S ordered=0|1
 */
#include "common.h"


static CUkernel g_vecadd;
static float g_a = 1.0f;
static int g_n = 1024;
static void *g_args[] = {&g_a, &g_a, &g_a, &g_n};

static CUDA_KERNEL_NODE_PARAMS kernel_params(void)
{
    CUDA_KERNEL_NODE_PARAMS p = {.kern = g_vecadd, .gridDimX = 4, .gridDimY = 1, .gridDimZ = 1,
                                 .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1,
                                 .kernelParams = g_args};
    return p;
}

/* A conditional node of `type` with `size` bodies in `graph`; its first body. */
static CUgraph conditional(CUgraph graph, CUgraphConditionalNodeType type, unsigned size)
{
    CUgraphConditionalHandle handle;
    CUgraphNode node;
    CUgraphNodeParams p;
    CUcontext ctx;
    memset(&p, 0, sizeof p);
    /* The node's context is named, as cudart names it (the driver refuses none). */
    CHECK(cuCtxGetCurrent(&ctx));
    CHECK(cuGraphConditionalHandleCreate(&handle, graph, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.ctx = ctx;
    p.conditional.handle = handle;
    p.conditional.type = type;
    p.conditional.size = size;
    CHECK(cuGraphAddNode(&node, graph, NULL, NULL, 0, &p));
    return p.conditional.phGraph_out[0];
}

static void instantiated(const char *label, CUresult add, CUgraph graph)
{
    CUgraphExec exec;
    CUresult inst = cuGraphInstantiate(&exec, graph, 0);
    printf("cond %s add=%d instantiate=%d\n", label, (int)add, (int)inst);
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext primary;
    CUlibrary lib;
    CUgraph graph, body;
    CUgraphNode node;
    CUstream s;

    start_program();
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuLibraryLoadData(&lib, APP_PTX, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&g_vecadd, lib, K_VECADD));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* `churn N`: first N graphs each with a while node, made and destroyed (a program that
     * builds its graphs again and again). */
    for (int i = 0, n = argc > 2 && strcmp(argv[1], "churn") == 0 ? atoi(argv[2]) : 0; i < n;
         i++) {
        CHECK(cuGraphCreate(&graph, 0));
        conditional(graph, CU_GRAPH_COND_TYPE_WHILE, 1);
        CHECK(cuGraphDestroy(graph));
    }

    /* A kernel node by the generic node API in a plain graph: confined as any node. */
    {
        CUgraphNodeParams p;
        CUgraphExec exec;
        memset(&p, 0, sizeof p);
        p.type = CU_GRAPH_NODE_TYPE_KERNEL;
        CUDA_KERNEL_NODE_PARAMS k = kernel_params();
        memcpy(&p.kernel, &k, sizeof k); /* the _v3 struct has the _v2 layout */
        CHECK(cuGraphCreate(&graph, 0));
        CUresult rc = cuGraphAddNode(&node, graph, NULL, NULL, 0, &p);
        CUresult inst = CUDA_ERROR_INVALID_VALUE;
        if (rc == CUDA_SUCCESS && (inst = cuGraphInstantiate(&exec, graph, 0)) == CUDA_SUCCESS)
            CHECK(cuGraphLaunch(exec, NULL));
        printf("cond plain-generic add=%d instantiate=%d\n", (int)rc, (int)inst);
        print_green("plain-generic", K_VECADD, rc);
    }

    /* A while node's body: a kernel node by cuGraphAddKernelNode. */
    CHECK(cuGraphCreate(&graph, 0));
    body = conditional(graph, CU_GRAPH_COND_TYPE_WHILE, 1);
    CUDA_KERNEL_NODE_PARAMS kp = kernel_params();
    instantiated("while-api", cuGraphAddKernelNode(&node, body, NULL, 0, &kp), graph);

    /* An if/else node's body: a kernel node by the generic node API. */
    CHECK(cuGraphCreate(&graph, 0));
    body = conditional(graph, CU_GRAPH_COND_TYPE_IF, 2);
    {
        CUgraphNodeParams p;
        memset(&p, 0, sizeof p);
        p.type = CU_GRAPH_NODE_TYPE_KERNEL;
        CUDA_KERNEL_NODE_PARAMS k = kernel_params();
        memcpy(&p.kernel, &k, sizeof k); /* the _v3 struct has the _v2 layout */
        instantiated("if-generic", cuGraphAddNode(&node, body, NULL, NULL, 0, &p), graph);
    }

    /* A switch node's body filled by capturing a stream into it. */
    CHECK(cuGraphCreate(&graph, 0));
    body = conditional(graph, CU_GRAPH_COND_TYPE_SWITCH, 3);
    CHECK(cuStreamBeginCaptureToGraph(s, body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult launched = cuLaunchKernel((CUfunction)g_vecadd, 4, 1, 1, 32, 1, 1, 0, s, g_args,
                                       NULL);
    CUgraph captured;
    CUresult ended = cuStreamEndCapture(s, &captured);
    instantiated("switch-capture", launched != CUDA_SUCCESS ? launched : ended, graph);

    /* A while node nested in an if node's body, a kernel node in the inner body. */
    CHECK(cuGraphCreate(&graph, 0));
    body = conditional(conditional(graph, CU_GRAPH_COND_TYPE_IF, 1), CU_GRAPH_COND_TYPE_WHILE, 1);
    instantiated("nested-api", cuGraphAddKernelNode(&node, body, NULL, 0, &kp), graph);

    /* A graph made apart (its node confined), then put in a while node's body as a child. */
    {
        CUgraph apart;
        CHECK(cuGraphCreate(&apart, 0));
        CHECK(cuGraphAddKernelNode(&node, apart, NULL, 0, &kp));
        CHECK(cuGraphCreate(&graph, 0));
        body = conditional(graph, CU_GRAPH_COND_TYPE_WHILE, 1);
        instantiated("child-in-body", cuGraphAddChildGraphNode(&node, body, NULL, 0, apart),
                     graph);
    }

    print_fake_counts();
    return 0;
}
