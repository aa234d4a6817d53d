/* SPDX-License-Identifier: Apache-2.0
 *
 * graph.c: graph kernel nodes, decided as launches are (gate.h) when a node is made or its
 * parameters changed: cuGraphAddKernelNode and its setters (whose nodes of a wrapped kernel get
 * the wrapped kernel), and the generic node API (cuGraphAddNode, cuGraphNodeSetParams), whose
 * kernel nodes are gated and confined but keep the original kernel when it is wrapped. A
 * confined kernel's node in a conditional node's body keeps the program's context (the driver
 * requires it there). A rewrite the driver refuses falls back to the program's own node.
 */
#include "gate.h"

/* ---- graph kernel nodes: the same decision, taken when the node is made or changed ---------- */

/* The node's launch is `l` (the hook's: it lives until clc_gate_exit). */
static CUresult graph_gate(gate *g, clc_launch *l, int *gated, CUfunction f, CUcontext ctx,
                           uint32_t entry_point, const CUDA_KERNEL_NODE_PARAMS_v1 *p, int wraps,
                           int confines) {
    *gated = 0;
    if (!p || !f) return CUDA_SUCCESS;
    *l = (clc_launch){.entry_point = entry_point,
                      .grid = {p->gridDimX, p->gridDimY, p->gridDimZ},
                      .block = {p->blockDimX, p->blockDimY, p->blockDimZ},
                      .shmem = p->sharedMemBytes,
                      .params = p->kernelParams,
                      .extra = p->extra};
    *gated = unlikely(t_in_clc) ? clc_gate_reentrant(g, f, ctx, l) : gate_launch(g, f, ctx, l);
    if (*gated && g->outcome->action == CLC_ACTION_DENY) return clc_gate_exit(g, g->outcome->error);
    /* In a program context of scope: program (a partition's) the node runs on the partition as
     * it is made, as a launch there does: nothing to rewrite. */
    uint64_t word;
    unsigned sms;
    CUcontext in =
        *gated && g->outcome->action == CLC_ACTION_CONFINE ? ctx ? ctx : current_ctx() : NULL;
    if (in) clc_debug("graph node of a confined kernel in context %p", in);
    if (in && (sms = clc_green_program_sms(in, &word)) != 0) {
        g->scratch = *g->outcome;
        g->scratch.action = CLC_ACTION_ALLOW;
        g->outcome = &g->scratch;
        if (g->entry) atomic_store_explicit(&g->entry->confined_sms, sms, memory_order_relaxed);
    }
    /* A graph kernel node of a confined kernel made with the v1 parameters (no `ctx` to put it
     * in the green context) is not confined: it gets what a launch that cannot be confined
     * gets, said once. */
    if (*gated && g->outcome->action == CLC_ACTION_CONFINE)
        clc_debug("graph node of a confined kernel (entry point %u, %s parameters)", entry_point,
                  confines ? "v2 or generic" : "v1");
    if (*gated && g->outcome->action == CLC_ACTION_CONFINE && !confines &&
        clc_green_unconfined(g->outcome->replacement, CUDA_ERROR_NOT_SUPPORTED,
                             CLC_UNCONFINED_GRAPH_NODE))
        return clc_gate_exit(g, clc_gate_refuse(g));
    if (*gated && g->outcome->action == CLC_ACTION_REPLACE && !wraps) {
        CLC_WARN_ONCE("a wrapped kernel was put in a CUDA graph through the generic node API "
                      "(cuGraphAddNode / cuGraphNodeSetParams): those nodes run the original "
                      "kernel");
    }
    return CUDA_SUCCESS;
}

/* A kernel node of a wrapped kernel (cuGraphAddKernelNode and its setters) gets the wrapped
 * kernel: its function, the grid it launches with, and the program's arguments plus the launch
 * argument; a wrapper that uses its slot gets a graph slot of its own (each replay of the node
 * starts it afresh, see CLC_GRAPH_SEQ). 1 when `r` holds the rewrite (clc_replace_end after
 * the call); 0: the node keeps the original (said once). */
static int node_replace(const gate *g, clc_replaced *r) {
    const clc_replacement *rep = (const clc_replacement *)(uintptr_t)g->outcome->replacement;
    CUresult e = rep ? clc_replace_begin(r, rep, g->launch, (rep->flags & CLC_REPLACE_SLOT) != 0)
                     : CUDA_ERROR_INVALID_HANDLE;
    if (e == CUDA_SUCCESS) return 1;
    if (e == CLC_NO_GRAPH_SLOT)
        clc_graph_slots_used_up();
    else
        CLC_WARN_ONCE("a wrapped kernel's graph node could not be rewritten (CUresult %d): it runs "
                      "unwrapped",
                      (int)e);
    return 0;
}

/* The v2 parameters name the kernel by `kern` (in `ctx`) when `func` is NULL. */
#define CLC_V2_KERNEL(p) ((p) && (p)->func ? (p)->func : (p) ? (CUfunction)(p)->kern : NULL)
#define CLC_V2_CTX(p) ((p) && !(p)->func ? (p)->ctx : NULL)

/* A kernel node of a confined kernel (v2 parameters): its kernel, as a CUkernel, put in the
 * green context's context (`kern` and `ctx`, `func` NULL). CUDA_SUCCESS with *copy filled, or
 * why not (a module's CUfunction has no CUkernel to name). */
static CUresult node_confine(const gate *g, CUfunction f, const CUDA_KERNEL_NODE_PARAMS_v2 *p,
                             CUDA_KERNEL_NODE_PARAMS_v2 *copy) {
    CUlibrary lib;
    CUresult named = f && g_drv.kernel_get_library ? g_drv.kernel_get_library(&lib, (CUkernel)f)
                                                   : CUDA_ERROR_NOT_SUPPORTED;
    CUkernel kernel = (CUkernel)f;
    if (named != CUDA_SUCCESS && !(kernel = clc_library_kernel_of(f))) {
        clc_debug("graph node of a confined kernel: %p is neither a library kernel nor the "
                  "function of one",
                  (void *)f);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUcontext ctx;
    unsigned sms;
    CUresult r = clc_green_context(g->outcome->replacement, &ctx, &sms);
    if (r != CUDA_SUCCESS) return r;
    if (g->entry) atomic_store_explicit(&g->entry->confined_sms, sms, memory_order_relaxed);
    clc_green_note_node_kernel(kernel, g->outcome->replacement);
    *copy = *p;
    copy->func = NULL;
    copy->kern = kernel;
    copy->ctx = ctx;
    return CUDA_SUCCESS;
}

/* Why a confined kernel's node in `graph` (NULL: not known, a setter's) is not confined, with
 * its CLC_UNCONFINED_ reason, or CUDA_SUCCESS with *copy the confined parameters. Inside clc's
 * own work for this thread: the locks taken here are never waited for by a signal handler's
 * launch on this thread (it takes the re-entrant gate). */
static CUresult node_confined(const gate *g, CUfunction f, CUgraph graph,
                              const CUDA_KERNEL_NODE_PARAMS_v2 *p, CUDA_KERNEL_NODE_PARAMS_v2 *copy,
                              int *reason) {
    int was = t_in_clc;
    t_in_clc = 1;
    *reason = CLC_UNCONFINED_GRAPH_NODE;
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;
    if (graph && clc_green_is_body(graph))
        *reason = CLC_UNCONFINED_CONDITIONAL;
    else
        r = node_confine(g, f, p, copy);
    t_in_clc = was;
    return r;
}

/* A new conditional node's bodies noted, inside clc's own work (as node_confined). */
static void note_bodies(CUgraphNode node, CUgraph graph, const clc_graph_node_params *p) {
    int was = t_in_clc;
    t_in_clc = 1;
    clc_green_note_bodies(node, graph, p->conditional.phGraph_out, p->conditional.size);
    t_in_clc = was;
}

/* The driver refused a node's rewrite for a wrapped kernel: the node is made again with the
 * program's own parameters (said once). */
__attribute__((noinline)) static void node_rewrite_refused(CUresult e) {
    CLC_WARN_ONCE("the driver refused a wrapped kernel's graph node (CUresult %d): the node runs "
                  "the original kernel",
                  (int)e);
}

/* In a node hook whose confined parameters are `copy` (when `why` is CUDA_SUCCESS): the node
 * made with them; one the driver refuses, or that could not be confined (`why`, `reason`),
 * gets the rule's on_unwrappable (a refusal returns here; allow goes on to the program's own
 * parameters, `given`). */
#define CLC_CONFINED_NODE_CALL(made)                                                              \
    if (why == CUDA_SUCCESS) {                                                                   \
        p = &copy;                                                                               \
        r = made;                                                                                \
        p = given;                                                                               \
        if (r == CUDA_SUCCESS) return clc_gate_exit(&g, r);                                      \
        why = r;                                                                                 \
        reason = CLC_UNCONFINED_REFUSED;                                                         \
    }                                                                                            \
    if (clc_green_unconfined(g.outcome->replacement, why, reason))                               \
        return clc_gate_exit(&g, clc_gate_refuse(&g));

/* The kernel-node entry points: `p` (of `type`) is given to the driver as is, or rewritten for
 * a wrapped kernel (node_replace) or a confined one (`confine`, v2 only; `graph_of` is the graph
 * an added node goes into). A rewrite the driver refuses is made again as the program gave it:
 * the node then runs as without clc (or is refused, where on_unwrappable says deny). `clear`
 * names the kernel by its function alone (v2). */
#define CLC_KERNEL_NODE_HOOK(name, entry_point, plist, type, fn_of, ctx_of, graph_of, clear,       \
                             confine, call)                                                      \
    CLC_EXPORT CUresult name plist {                                                            \
        pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        clc_launch l;                                                                            \
        int gated;                                                                               \
        CUresult r = graph_gate(&g, &l, &gated, fn_of, ctx_of, entry_point,                      \
                                (const CUDA_KERNEL_NODE_PARAMS_v1 *)p, 1, confine);              \
        if (r != CUDA_SUCCESS) return r;                                                         \
        clc_replaced rr;                                                                         \
        type copy;                                                                               \
        const type *given = p;                                                                   \
        if (confine && gated && g.outcome->action == CLC_ACTION_CONFINE) {                       \
            int reason;                                                                          \
            CUresult why = node_confined(&g, fn_of, graph_of,                                    \
                                         (const CUDA_KERNEL_NODE_PARAMS_v2 *)p,                  \
                                         (CUDA_KERNEL_NODE_PARAMS_v2 *)&copy, &reason);          \
            CLC_CONFINED_NODE_CALL(real call)                                                    \
        }                                                                                        \
        int swapped = gated && g.outcome->action == CLC_ACTION_REPLACE &&                        \
                      node_replace(&g, &rr);                                                     \
        if (swapped) {                                                                           \
            copy = *p;                                                                           \
            copy.func = rr.f;                                                                    \
            copy.gridDimX = rr.grid[0], copy.gridDimY = rr.grid[1], copy.gridDimZ = rr.grid[2];  \
            copy.kernelParams = rr.params;                                                       \
            copy.extra = rr.extra;                                                               \
            clear;                                                                               \
            p = &copy;                                                                           \
        }                                                                                        \
        r = real call;                                                                           \
        if (swapped) {                                                                           \
            clc_replace_end(&rr);                                                                \
            p = given;                                                                           \
            if (r != CUDA_SUCCESS) {                                                             \
                node_rewrite_refused(r);                                                         \
                r = real call;                                                                   \
            }                                                                                    \
        }                                                                                        \
        return gated ? clc_gate_exit(&g, r) : r;                                                 \
    }
#define CLC_V1_CLEAR ((void)0)
#define CLC_V2_CLEAR (copy.kern = NULL, copy.ctx = NULL)
CLC_KERNEL_NODE_HOOK(cuGraphAddKernelNode, CLC_ENTRY_GRAPH_ADD_NODE,
                     (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                      const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, graph, CLC_V1_CLEAR, 0,
                     (node, graph, deps, n_deps, p))
CLC_KERNEL_NODE_HOOK(cuGraphAddKernelNode_v2, CLC_ENTRY_GRAPH_ADD_NODE,
                     (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                      const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), graph,
                     CLC_V2_CLEAR, 1, (node, graph, deps, n_deps, p))
CLC_KERNEL_NODE_HOOK(cuGraphKernelNodeSetParams, CLC_ENTRY_GRAPH_NODE_SET,
                     (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, NULL, CLC_V1_CLEAR, 0,
                     (node, p))
CLC_KERNEL_NODE_HOOK(cuGraphKernelNodeSetParams_v2, CLC_ENTRY_GRAPH_NODE_SET,
                     (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), NULL,
                     CLC_V2_CLEAR, 1, (node, p))
CLC_KERNEL_NODE_HOOK(cuGraphExecKernelNodeSetParams, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
                     (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, NULL, CLC_V1_CLEAR, 0,
                     (exec, node, p))
CLC_KERNEL_NODE_HOOK(cuGraphExecKernelNodeSetParams_v2, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
                     (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), NULL,
                     CLC_V2_CLEAR, 1, (exec, node, p))

/* ---- child graphs put in a conditional node's body ---------------------------------------------
 * A child graph node embeds a copy of the program's graph, whose confined kernels' nodes are in
 * a partition's context: in a body the driver would refuse them at instantiation. So when a
 * child graph node goes into a body, the copy's kernel nodes in a partition's context are put
 * back in the program's current context (the one a body's kernels must share), nested child
 * graphs too; the copy counts as a body from then on. Said once, as a body's own nodes are; a
 * kernel named by a module's function alone cannot be moved, and its graph is left as it is. */
#define CU_GRAPH_NODE_TYPE_GRAPH 4

/* The driver's graph queries (g_drv, filled as the driver is placed, which a current context
 * implies): 1 when all four are there. */
static int graph_queries(void) {
    return g_drv.graph_child && g_drv.graph_nodes && g_drv.graph_node_type &&
           g_drv.graph_kernel_node_get;
}

/* Puts the kernel nodes of `graph` (its child graphs and its conditional nodes' bodies too) that
 * clc put in a partition's context back in the program's context `ctx`: each one whose kernel's
 * rule lets it run unconfined (on_unwrappable: allow); the others are counted in *kept. Child
 * graphs are noted as bodies when `bodies` (they are in one). */
static void unconfine_graph(CUgraph graph, CUcontext ctx, int depth, int bodies, unsigned *moved,
                            unsigned *kept) {
    size_t n = 0;
    if (depth > 16 || g_drv.graph_nodes(graph, NULL, &n) != CUDA_SUCCESS || n == 0) return;
    CUgraphNode *nodes = malloc(n * sizeof *nodes);
    if (!nodes) return;
    pfn_cuGraphKernelNodeSetParams_v2 set =
        (pfn_cuGraphKernelNodeSetParams_v2)clc_real(CLC_SYM_cuGraphKernelNodeSetParams_v2);
    if (g_drv.graph_nodes(graph, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            int type = -1;
            CUgraph inner[8];
            CUDA_KERNEL_NODE_PARAMS_v2 p;
            if (g_drv.graph_node_type(nodes[i], &type) != CUDA_SUCCESS) continue;
            if (type == CU_GRAPH_NODE_TYPE_GRAPH &&
                g_drv.graph_child(nodes[i], &inner[0]) == CUDA_SUCCESS) {
                if (bodies) clc_green_note_bodies(nodes[i], graph, inner, 1);
                unconfine_graph(inner[0], ctx, depth + 1, bodies, moved, kept);
            }
            if (type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
                unsigned nb = clc_green_bodies_of(nodes[i], inner, 8);
                for (unsigned b = 0; b < nb; b++)
                    unconfine_graph(inner[b], ctx, depth + 1, bodies, moved, kept);
            }
            /* A node already in the program's context (a program context of scope: program is
             * a partition's) needs no move. */
            if (type != CU_GRAPH_NODE_TYPE_KERNEL || !set ||
                g_drv.graph_kernel_node_get(nodes[i], &p) != CUDA_SUCCESS ||
                !clc_green_is_node_context(p.ctx) || p.ctx == ctx || !p.kern)
                continue;
            if (!clc_green_node_kernel_movable(p.kern)) {
                (*kept)++;
                continue;
            }
            clc_debug("graph node %p moved from context %p to %p", nodes[i], p.ctx, ctx);
            p.func = NULL;
            p.ctx = ctx;
            if (set(nodes[i], &p) == CUDA_SUCCESS) (*moved)++;
        }
    }
    free(nodes);
}

static void child_in_body(CUgraphNode node, CUgraph graph) {
    CUgraph child;
    CUcontext ctx;
    if (!node || t_in_clc || !clc_green_is_body(graph) || !(ctx = current_ctx()) ||
        !graph_queries() || g_drv.graph_child(node, &child) != CUDA_SUCCESS)
        return;
    unsigned moved = 0, kept = 0;
    t_in_clc = 1;
    clc_green_note_bodies(node, graph, &child, 1);
    unconfine_graph(child, ctx, 0, 1, &moved, &kept);
    t_in_clc = 0;
    /* In a program context of scope: program the nodes moved into it still run on the
     * partition: nothing to say. */
    uint64_t word;
    if (moved && !clc_green_program_sms(ctx, &word))
        CLC_WARN_ONCE("sm_share: a child graph put in a conditional node's body had %u confined "
                      "kernel nodes: they run in the program's context, not confined (the driver "
                      "requires every kernel of a body to be in the conditional node's context)",
                      moved);
}

/* ---- a graph the driver will not instantiate with confined nodes ----------------------------
 * Whatever the reason (a restriction of conditional bodies clc did not see, a driver's new
 * rule), a graph that fails to instantiate while it holds kernel nodes clc put in a partition's
 * context has those nodes put back in the program's context, where their rule's on_unwrappable
 * is allow, and is instantiated again: the program gets its own graph. Said once. A node whose
 * rule says deny stays confined, and the program gets the driver's error. */
static int unconfined_for_instantiation(CUgraph graph, CUresult why) {
    CUcontext ctx;
    if (t_in_clc || !clc_green_any_node_context() || !(ctx = current_ctx()) || !graph_queries())
        return 0;
    unsigned moved = 0, kept = 0;
    t_in_clc = 1;
    unconfine_graph(graph, ctx, 0, 0, &moved, &kept);
    t_in_clc = 0;
    if (moved && !kept)
        CLC_WARN_ONCE("sm_share: the driver refused to instantiate a graph holding confined kernel "
                      "nodes (CUresult %d): %u of them run in the program's context, not confined, "
                      "and the graph is instantiated again",
                      (int)why, moved);
    if (kept)
        CLC_WARN_ONCE(
            "sm_share: the driver refused to instantiate a graph holding confined kernel "
            "nodes (CUresult %d): %u of them stay confined, as their rule's on_unwrappable "
            "(deny) says, and the program gets the driver's error",
            (int)why, kept);
    return moved > 0 && kept == 0;
}

/* A destroyed graph's conditional bodies are forgotten (before: the driver may give its address
 * to a new graph at once). */
CLC_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
    CLC_REAL_OR_FAIL(cuGraphDestroy)
    if (!t_in_clc) {
        t_in_clc = 1; /* as node_confined */
        clc_green_forget_graph(graph);
        t_in_clc = 0;
    }
    return real(graph);
}

#define CLC_INSTANTIATE_HOOK(name, plist, call)                                                  \
    CLC_EXPORT CUresult name plist {                                                            \
        CLC_REAL_OR_FAIL(name)                                                                   \
        CUresult r = real call;                                                                  \
        if (likely(r == CUDA_SUCCESS) || !unconfined_for_instantiation(graph, r)) return r;      \
        return real call;                                                                        \
    }
CLC_INSTANTIATE_HOOK(cuGraphInstantiateWithFlags,
                     (CUgraphExec * exec, CUgraph graph, unsigned long long flags),
                     (exec, graph, flags))
CLC_INSTANTIATE_HOOK(cuGraphInstantiateWithParams,
                     (CUgraphExec * exec, CUgraph graph, void *params), (exec, graph, params))
CLC_INSTANTIATE_HOOK(cuGraphInstantiateWithParams_ptsz,
                     (CUgraphExec * exec, CUgraph graph, void *params), (exec, graph, params))

/* The generic node API: only kernel nodes are gated, any other type passes untouched. A
 * confined kernel's node is confined as the v2 kernel nodes are (its kernel parameters are the
 * _v2 layout); a wrapped kernel's keeps the original (said once). A conditional node's bodies
 * are noted (clc_green_note_bodies) once the driver has made them. */
#define CLC_NODE_KERNEL(p) ((p) && (p)->type == CU_GRAPH_NODE_TYPE_KERNEL ? &(p)->kernel : NULL)
#define CLC_GENERIC_HOOK(name, entry_point, plist, graph_of, added, call)                        \
    CLC_EXPORT CUresult name plist {                                                            \
        CLC_REAL_OR_FAIL(name)                                                                   \
        gate g;                                                                                  \
        clc_launch l;                                                                            \
        int gated;                                                                               \
        const CUDA_KERNEL_NODE_PARAMS_v2 *k = CLC_NODE_KERNEL(p);                                \
        CUresult r = graph_gate(&g, &l, &gated, CLC_V2_KERNEL(k), CLC_V2_CTX(k), entry_point,     \
                                (const CUDA_KERNEL_NODE_PARAMS_v1 *)k, 0, 1);                    \
        if (r != CUDA_SUCCESS) return r;                                                         \
        if (gated && g.outcome->action == CLC_ACTION_CONFINE) {                                  \
            clc_graph_node_params copy = *p, *given = p;                                         \
            int reason;                                                                          \
            CUresult why =                                                                       \
                node_confined(&g, CLC_V2_KERNEL(k), graph_of, k, &copy.kernel, &reason);         \
            CLC_CONFINED_NODE_CALL(real call)                                                    \
        }                                                                                        \
        r = real call;                                                                           \
        if (r == CUDA_SUCCESS && p && (added) && p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL)      \
            note_bodies((added), graph_of, p);                                                   \
        if (r == CUDA_SUCCESS && p && p->type == CU_GRAPH_NODE_TYPE_GRAPH && graph_of)           \
            child_in_body((added), graph_of);                                                    \
        return gated ? clc_gate_exit(&g, r) : r;                                                 \
    }
CLC_GENERIC_HOOK(cuGraphAddNode, CLC_ENTRY_GRAPH_ADD_NODE,
                 (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                  clc_graph_node_params *p),
                 graph, node ? *node : NULL, (node, graph, deps, n_deps, p))
CLC_GENERIC_HOOK(cuGraphAddNode_v2, CLC_ENTRY_GRAPH_ADD_NODE,
                 (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, const void *edges,
                  size_t n_deps, clc_graph_node_params *p),
                 graph, node ? *node : NULL, (node, graph, deps, edges, n_deps, p))
CLC_GENERIC_HOOK(cuGraphNodeSetParams, CLC_ENTRY_GRAPH_NODE_SET,
                 (CUgraphNode node, clc_graph_node_params *p), NULL, NULL, (node, p))
CLC_GENERIC_HOOK(cuGraphExecNodeSetParams, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
                 (CUgraphExec exec, CUgraphNode node, clc_graph_node_params *p), NULL, NULL,
                 (exec, node, p))

CLC_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph,
                                             const CUgraphNode *deps, size_t n_deps,
                                             CUgraph child) {
    CLC_REAL_OR_FAIL(cuGraphAddChildGraphNode)
    CUresult r = real(node, graph, deps, n_deps, child);
    if (r == CUDA_SUCCESS && node) child_in_body(*node, graph);
    return r;
}
