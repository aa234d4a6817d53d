/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): graphs, and the generic node API. */

/* ---- graphs ---------------------------------------------------------------------------------- */

CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    struct CUgraph_st *g;
    TRY(need_init());
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(g = calloc(1, sizeof *g)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->tailp = &g->head;
    g->tag = TAG_GRAPH;
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    struct CUgraphNode_st *n;
    TRY(need_init());
    lock();
    if (tag_of(hGraph) != TAG_GRAPH) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    hGraph->tag = TAG_DEAD;
    for (n = hGraph->head; n; n = n->next)
        n->tag = TAG_DEAD;
    unlock();
    return CUDA_SUCCESS;
}


/* The kernel a node's parameters name. The v1 struct has only `func`; the v2 struct adds
 * `kern`, used when func is NULL, and `ctx` (NULL: the current context). Both structs start
 * with the same ten fields, passed here one by one. */
static CUresult node_kernel(enum entry e, CUfunction func, CUkernel kern, CUcontext ctx, int v2,
                            unsigned gx,
                            unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned smem, void **params, void **extra, struct kname **out)
{
    struct CUfunc_st *f;
    if (func || !v2) {
        /* A CUkernel goes in `kern`: in `func`, where a launch takes one, a node refuses it
         * (CUDA_ERROR_INVALID_HANDLE on the real driver, 580). */
        f = tag_of(func) == TAG_KERNEL ? NULL : launchable(func);
    } else {
        if (ctx == NULL)
            TRY(need_ctx());
        else if (tag_of(ctx) != TAG_CTX)
            return CUDA_ERROR_INVALID_CONTEXT;
        f = tag_of(kern) == TAG_KERNEL ? &kern->func : NULL;
    }
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(check_shape(f, gx, gy, gz, bx, by, bz, smem));
    if (atomic_load_explicit(&g_observe, memory_order_relaxed)) {
        /* what the node was given, read as a launch's (fake_cuda_last_launch) */
        const unsigned dims[7] = {gx, gy, gz, bx, by, bz, smem};
        observe(e, func ? (const void *)func : (const void *)kern, f, dims, params, extra);
    }
    *out = f->k;
    {
        /* A node runs in the context its v2 parameters name with `kern`, else the current one. */
        const struct CUctx_st *in = !func && v2 && ctx ? ctx : tls_ctx;
        tls_node_where = in && in->green ? in->green->first << 16 | in->green->sms : FAKE_SMS_ALL;
        tls_node_ctx = in;
        tls_node_params = (CUDA_KERNEL_NODE_PARAMS){
            .func = func, .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = bx,
            .blockDimY = by, .blockDimZ = bz, .sharedMemBytes = smem, .kernelParams = params,
            .extra = extra, .kern = func ? NULL : kern, .ctx = func ? NULL : ctx};
    }
    return CUDA_SUCCESS;
}

#define NODE_KERNEL_V1(e, p, out)                                                                  \
    node_kernel(e, (p)->func, NULL, NULL, 0, (p)->gridDimX, (p)->gridDimY, (p)->gridDimZ,           \
                (p)->blockDimX, (p)->blockDimY, (p)->blockDimZ, (p)->sharedMemBytes,               \
                (p)->kernelParams, (p)->extra, out)
#define NODE_KERNEL_V2(e, p, out)                                                                  \
    node_kernel(e, (p)->func, (p)->kern, (p)->ctx, 1, (p)->gridDimX, (p)->gridDimY, (p)->gridDimZ,  \
                (p)->blockDimX, (p)->blockDimY, (p)->blockDimZ, (p)->sharedMemBytes,               \
                (p)->kernelParams, (p)->extra, out)

static CUresult add_node(enum entry e, CUgraphNode *phGraphNode, CUgraph g,
                         const CUgraphNode *deps, size_t ndeps, CUgraphNodeType type,
                         struct kname *k)
{
    struct CUgraphNode_st *n;
    size_t i;
    if (!phGraphNode || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    if (tag_of(g) != TAG_GRAPH) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < ndeps; i++) {
        if (tag_of(deps[i]) != TAG_NODE || deps[i]->graph != g) {
            unlock();
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (!(n = calloc(1, sizeof *n))) {
        unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n->tag = TAG_NODE;
    n->type = type;
    n->graph = g;
    n->k = k;
    n->where = k ? tls_node_where : FAKE_SMS_ALL;
    n->ctx = k || type == CU_GRAPH_NODE_TYPE_CONDITIONAL ? tls_node_ctx : NULL;
    if (k)
        n->kp = tls_node_params;
    *g->tailp = n;
    g->tailp = &n->next;
    unlock();
    atomic_fetch_add(&g_entry[e], 1);
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                      const CUgraphNode *dependencies, size_t numDependencies,
                                      const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V1(E_GRAPH_ADD, nodeParams, &k));
    return add_node(E_GRAPH_ADD, phGraphNode, hGraph, dependencies, numDependencies,
                    CU_GRAPH_NODE_TYPE_KERNEL, k);
}

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *dependencies, size_t numDependencies,
                                         const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V2(E_GRAPH_ADD_V2, nodeParams, &k));
    return add_node(E_GRAPH_ADD_V2, phGraphNode, hGraph, dependencies, numDependencies,
                    CU_GRAPH_NODE_TYPE_KERNEL, k);
}

/* Parameters of one type only fit a node of that type (a kernel node's setter refuses a memset
 * node, as the real driver does). */
static CUresult node_set(enum entry e, CUgraphNode n, CUgraphNodeType type, struct kname *k)
{
    lock();
    if (tag_of(n) != TAG_NODE || n->type != type) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    n->k = k;
    n->where = k ? tls_node_where : FAKE_SMS_ALL;
    n->ctx = k ? tls_node_ctx : NULL;
    if (k)
        n->kp = tls_node_params;
    unlock();
    atomic_fetch_add(&g_entry[e], 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeSetParams(CUgraphNode hNode,
                                            const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V1(E_NODE_SET, nodeParams, &k));
    return node_set(E_NODE_SET, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode hNode,
                                               const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V2(E_NODE_SET_V2, nodeParams, &k));
    return node_set(E_NODE_SET_V2, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

/* Every kernel of a conditional node's body (nested bodies too) must be in the conditional
 * node's context, as the real driver requires (else cudaErrorInvalidValue at instantiation). */
static int body_ok(const struct CUgraph_st *g, const struct CUctx_st *ctx)
{
    const struct CUgraphNode_st *n;
    unsigned i;
    for (n = g->head; n; n = n->next) {
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL && n->k && n->ctx != ctx)
            return 0;
        if (n->type == CU_GRAPH_NODE_TYPE_GRAPH && n->child && !body_ok(n->child, ctx))
            return 0;
        if (n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
            if (n->ctx != ctx)
                return 0;
            for (i = 0; i < n->n_bodies; i++)
                if (!body_ok(n->bodies[i], ctx))
                    return 0;
        }
    }
    return 1;
}

/* No kernel node of g, its child graphs or bodies, in a green context. */
static int body_ok_green(const struct CUgraph_st *g)
{
    const struct CUgraphNode_st *n;
    unsigned i;
    for (n = g->head; n; n = n->next) {
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL && n->k && n->ctx && n->ctx->green)
            return 0;
        if (n->type == CU_GRAPH_NODE_TYPE_GRAPH && n->child && !body_ok_green(n->child))
            return 0;
        for (i = 0; i < n->n_bodies; i++)
            if (!body_ok_green(n->bodies[i]))
                return 0;
    }
    return 1;
}

/* What `cuGraphInstantiate` means in the CUDA 12+ header. */
CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             unsigned long long flags)
{
    struct CUgraphExec_st *x;
    struct CUgraphNode_st *n;
    unsigned count = 0;
    (void)flags;
    TRY(need_init());
    if (!phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    if (tag_of(hGraph) != TAG_GRAPH) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* FAKE_CUDA_REFUSE_GREEN_NODES: a driver that will not instantiate a graph holding a kernel
     * node in a green context (as it refuses one in a conditional body of another context). */
    if (getenv("FAKE_CUDA_REFUSE_GREEN_NODES") && !body_ok_green(hGraph)) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (n = hGraph->head; n; n = n->next) {
        unsigned i;
        count++;
        for (i = 0; n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL && i < n->n_bodies; i++) {
            if (!body_ok(n->bodies[i], n->ctx)) {
                unlock();
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
    }
    if (!(x = calloc(1, sizeof *x)) || !(x->nodes = calloc(count ? count : 1, sizeof *x->nodes))) {
        unlock();
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (n = hGraph->head; n; n = n->next) {
        x->nodes[x->n].node = n;
        x->nodes[x->n].k = n->k;
        x->nodes[x->n].where = n->where;
        x->n++;
    }
    x->graph = hGraph;
    x->tag = TAG_EXEC;
    unlock();
    *phGraphExec = x;
    return CUDA_SUCCESS;
}

static CUresult exec_node_set(enum entry e, CUgraphExec x, CUgraphNode n, CUgraphNodeType type,
                              struct kname *k)
{
    unsigned i;
    lock();
    if (tag_of(x) != TAG_EXEC) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < x->n; i++) {
        if (x->nodes[i].node == n) {
            if (n->type != type) {
                unlock();
                return CUDA_ERROR_INVALID_VALUE;
            }
            x->nodes[i].k = k;
            x->nodes[i].where = k ? tls_node_where : FAKE_SMS_ALL;
            unlock();
            atomic_fetch_add(&g_entry[e], 1);
            return CUDA_SUCCESS;
        }
    }
    unlock();
    return CUDA_ERROR_INVALID_VALUE; /* not a node of the graph this was instantiated from */
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V1(E_EXEC_SET, nodeParams, &k));
    return exec_node_set(E_EXEC_SET, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                   const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V2(E_EXEC_SET_V2, nodeParams, &k));
    return exec_node_set(E_EXEC_SET_V2, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

/* ---- the generic node API (CUDA 12.2+): one CUgraphNodeParams for every node type ------------
 * A KERNEL node goes through the kernel-node machinery above (its params are
 * CUDA_KERNEL_NODE_PARAMS_v3: `func`, or `kern` when func is NULL, and `ctx`), so a graph launch
 * counts it as it counts a node from cuGraphAddKernelNode. A MEMSET node is checked (its rows
 * within one cuMemAlloc allocation) and kept, but does nothing when the graph runs. Other types:
 * CUDA_ERROR_NOT_SUPPORTED. As in the real driver the reserved fields must be zero. */

static CUresult generic_params(const CUgraphNodeParams *p, struct kname **k)
{
    const CUDA_MEMSET_NODE_PARAMS_v2 *m;
    if (!p || p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        return NODE_KERNEL_V2(E_ADD_NODE, &p->kernel, k);
    case CU_GRAPH_NODE_TYPE_MEMSET:
        m = &p->memset;
        if (!m->dst || !m->width || !m->height ||
            (m->elementSize != 1 && m->elementSize != 2 && m->elementSize != 4))
            return CUDA_ERROR_INVALID_VALUE;
        {
            /* The rows it sets lie in one allocation (the real driver refuses an address it
             * did not allocate, 580). */
            size_t row, span = 0;
            int inside;
            if (__builtin_mul_overflow(m->width, (size_t)m->elementSize, &row) ||
                (m->height > 1 && m->pitch < row) ||
                __builtin_mul_overflow(m->height - 1, m->pitch, &span) ||
                __builtin_add_overflow(span, row, &span))
                return CUDA_ERROR_INVALID_VALUE;
            lock();
            inside = allocation_of_locked((uintptr_t)m->dst, span) != NULL;
            unlock();
            if (!inside)
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (m->ctx == NULL)
            TRY(need_ctx());
        else if (tag_of(m->ctx) != TAG_CTX)
            return CUDA_ERROR_INVALID_CONTEXT;
        *k = NULL;
        return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
        const CUDA_CONDITIONAL_NODE_PARAMS *c = &p->conditional;
        unsigned most = c->type == CU_GRAPH_COND_TYPE_IF       ? 2
                        : c->type == CU_GRAPH_COND_TYPE_SWITCH ? MAX_BODIES
                                                               : 1;
        if (!c->handle || c->size == 0 || c->size > most)
            return CUDA_ERROR_INVALID_VALUE;
        if (c->ctx == NULL)
            TRY(need_ctx());
        else if (tag_of(c->ctx) != TAG_CTX)
            return CUDA_ERROR_INVALID_CONTEXT;
        tls_node_ctx = c->ctx ? c->ctx : tls_ctx;
        *k = NULL;
        return CUDA_SUCCESS;
    }
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

/* Child graph nodes: a copy of the graph's nodes (not of their dependencies, which the fake
 * does not keep); cuGraphChildGraphNodeGetGraph gives the copy, which may be changed. */
CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                          const CUgraphNode *dependencies, size_t numDependencies,
                                          CUgraph childGraph)
{
    struct CUgraph_st *copy;
    struct CUgraphNode_st *n;
    TRY(need_init());
    if (tag_of(childGraph) != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(cuGraphCreate(&copy, 0));
    lock();
    for (n = childGraph->head; n; n = n->next) {
        struct CUgraphNode_st *c = malloc(sizeof *c);
        if (!c) {
            unlock();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *c = *n;
        c->graph = copy;
        c->next = NULL;
        *copy->tailp = c;
        copy->tailp = &c->next;
    }
    unlock();
    TRY(add_node(E_GRAPH_ADD, phGraphNode, hGraph, dependencies, numDependencies,
                 CU_GRAPH_NODE_TYPE_GRAPH, NULL));
    (*phGraphNode)->child = copy;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    TRY(need_init());
    if (!phGraph || tag_of(hNode) != TAG_NODE || hNode->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = hNode->child;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    struct CUgraphNode_st *n;
    size_t i = 0;
    TRY(need_init());
    if (!numNodes || tag_of(hGraph) != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    for (n = hGraph->head; n; n = n->next, i++)
        if (nodes && i < *numNodes)
            nodes[i] = n;
    unlock();
    if (!nodes || i < *numNodes)
        *numNodes = i;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    TRY(need_init());
    if (!type || tag_of(hNode) != TAG_NODE)
        return CUDA_ERROR_INVALID_VALUE;
    *type = hNode->type;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                               CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    TRY(need_init());
    if (!nodeParams || tag_of(hNode) != TAG_NODE || hNode->type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    *nodeParams = hNode->kp;
    return CUDA_SUCCESS;
}

/* Conditional handles: distinct non-zero values; the fake keeps no condition. The context is
 * required (NULL is CUDA_ERROR_INVALID_CONTEXT on the real driver, 580). */
CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle *pHandle_out,
                                                CUgraph hGraph, CUcontext ctx,
                                                unsigned int defaultLaunchValue,
                                                unsigned int flags)
{
    static atomic_ullong next = 1;
    (void)defaultLaunchValue;
    (void)flags;
    TRY(need_init());
    if (!pHandle_out || tag_of(hGraph) != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    if (tag_of(ctx) != TAG_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    *pHandle_out = atomic_fetch_add(&next, 1);
    return CUDA_SUCCESS;
}

/* A new conditional node's bodies: empty graphs, handed back in the caller's parameters. */
static CUresult make_bodies(CUgraphNode n, CUgraphNodeParams *p)
{
    unsigned i;
    if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL)
        return CUDA_SUCCESS;
    for (i = 0; i < p->conditional.size; i++)
        TRY(cuGraphCreate(&n->bodies[i], 0));
    n->n_bodies = p->conditional.size;
    p->conditional.phGraph_out = n->bodies;
    return CUDA_SUCCESS;
}

/* Edge data: the fake has no ports or programmatic edges, only full-completion edges (all
 * fields zero, which is also what NULL means). */
static CUresult default_edges(const CUgraphEdgeData *edges, size_t n)
{
    size_t i;
    for (i = 0; edges && i < n; i++)
        if (edges[i].from_port || edges[i].to_port || edges[i].type)
            return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

/* The 12.2 ABI, without edge data (cuGetProcAddress versions 12020..12029). */
CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    TRY(add_node(E_ADD_NODE, phGraphNode, hGraph, dependencies, numDependencies,
                 nodeParams->type, k));
    return make_bodies(*phGraphNode, nodeParams);
}

/* The 12.3 ABI: per-dependency edge data (may be NULL) before the count. */
CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                   const CUgraphNode *dependencies,
                                   const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                   CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    TRY(default_edges(dependencyData, numDependencies));
    TRY(add_node(E_ADD_NODE_V2, phGraphNode, hGraph, dependencies, numDependencies,
                 nodeParams->type, k));
    return make_bodies(*phGraphNode, nodeParams);
}

/* The node keeps its type: parameters of another type are CUDA_ERROR_INVALID_VALUE. */
CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    return node_set(E_NODE_SET_PARAMS, hNode, nodeParams->type, k);
}

CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                          CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    return exec_node_set(E_EXEC_NODE_SET_PARAMS, hGraphExec, hNode, nodeParams->type, k);
}

/* One graph launch runs every kernel node once (a memset node does nothing). */
static CUresult graph_launch(enum entry e, CUgraphExec x, CUstream s)
{
    unsigned i;
    TRY(need_ctx());
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    lock();
    if (tag_of(x) != TAG_EXEC) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < x->n; i++) {
        if (!x->nodes[i].k)
            continue;
        atomic_fetch_add(&x->nodes[i].k->graph, 1);
        atomic_store(&x->nodes[i].k->where, x->nodes[i].where);
        if (x->nodes[i].where != FAKE_SMS_ALL)
            atomic_fetch_add(&x->nodes[i].k->green, 1);
        atomic_fetch_add(&g_total_graph, 1);
        atomic_fetch_add(&g_clock_ns, FAKE_NS_PER_LAUNCH);
    }
    unlock();
    atomic_fetch_add(&g_entry[e], 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(E_GRAPH_LAUNCH, hGraphExec, hStream);
}

CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(E_GRAPH_LAUNCH_PTSZ, hGraphExec, hStream);
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    TRY(need_init());
    lock();
    if (tag_of(hGraphExec) != TAG_EXEC) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    hGraphExec->tag = TAG_DEAD;
    unlock();
    return CUDA_SUCCESS;
}
