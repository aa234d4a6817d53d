/* SPDX-License-Identifier: Apache-2.0
 *
 * graph.c: graph kernel nodes, decided as launches are (gate.h) when a node is made or its
 * parameters changed: cuGraphAddKernelNode and its setters (whose nodes of a wrapped kernel get
 * the wrapped kernel), and the generic node API (cuGraphAddNode, cuGraphNodeSetParams), whose
 * kernel nodes are gated but keep the original kernel.
 */
#include "gate.h"

/* ---- graph kernel nodes: the same decision, taken when the node is made or changed ---------- */

static CUresult graph_gate(gate *g, int *gated, CUfunction f, CUcontext ctx, uint32_t entry_point,
                           const CUDA_KERNEL_NODE_PARAMS_v1 *p, int wraps, int confines) {
    *gated = 0;
    if (!p || !f) return CUDA_SUCCESS;
    *gated = unlikely(t_in_clc)
                 ? clc_gate_reentrant(g, f, ctx, entry_point, p->gridDimX, p->gridDimY, p->gridDimZ,
                                      p->blockDimX, p->blockDimY, p->blockDimZ, p->sharedMemBytes,
                                      NULL, p->kernelParams, p->extra)
                 : gate_enter(g, f, ctx, entry_point, p->gridDimX, p->gridDimY, p->gridDimZ,
                              p->blockDimX, p->blockDimY, p->blockDimZ, p->sharedMemBytes, NULL,
                              p->kernelParams, p->extra);
    if (*gated && g->outcome->action == CLC_ACTION_DENY) return clc_gate_exit(g, g->outcome->error);
    /* A graph kernel node of a confined kernel made without the v2 parameters (no `ctx` to put
     * it in the green context) is not confined: it gets what a launch that cannot be confined
     * gets, said once. */
    if (*gated && g->outcome->action == CLC_ACTION_CONFINE)
        clc_debug("graph node of a confined kernel (entry point %u, %s parameters)", entry_point,
                  confines ? "v2 kernel-node" : "v1 or generic");
    if (*gated && g->outcome->action == CLC_ACTION_CONFINE && !confines &&
        clc_green_unconfined(g->outcome->replacement, CUDA_ERROR_NOT_SUPPORTED,
                             CLC_UNCONFINED_GRAPH_NODE))
        return clc_gate_exit(g, clc_gate_refuse(g));
    if (*gated && g->outcome->action == CLC_ACTION_REPLACE && !wraps) {
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "a wrapped kernel was put in a CUDA graph through the generic node API "
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
static int node_replace(const gate *g, clc_replaced *r, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    const clc_replacement *rep = (const clc_replacement *)(uintptr_t)g->outcome->replacement;
    CUresult e =
        rep ? clc_replace_begin(r, rep, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                                p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams,
                                p->extra, (rep->flags & CLC_REPLACE_SLOT) != 0)
            : CUDA_ERROR_INVALID_HANDLE;
    if (e == CUDA_SUCCESS) return 1;
    if (e == CLC_NO_GRAPH_SLOT)
        clc_graph_slots_used_up();
    else if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "a wrapped kernel's graph node could not be rewritten (CUresult %d): it runs "
                "unwrapped",
                (int)e);
    return 0;
}

/* The v2 parameters name the kernel by `kern` (in `ctx`) when `func` is NULL. */
#define CLC_V2_KERNEL(p) ((p) && (p)->func ? (p)->func : (p) ? (CUfunction)(p)->kern : NULL)
#define CLC_V2_CTX(p) ((p) && !(p)->func ? (p)->ctx : NULL)

#define CLC_GRAPH_HOOK(name, entry_point, params, fn_of, ctx_of, kernel_params, call)            \
    CLC_EXPORT CUresult name params {                                                            \
        pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        int gated;                                                                               \
        CUresult r = graph_gate(&g, &gated, fn_of, ctx_of, entry_point,                          \
                                (const CUDA_KERNEL_NODE_PARAMS_v1 *)(kernel_params), 0, 0);      \
        if (r != CUDA_SUCCESS) return r;                                                         \
        r = real call;                                                                           \
        return gated ? clc_gate_exit(&g, r) : r;                                                 \
    }

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
    *copy = *p;
    copy->func = NULL;
    copy->kern = kernel;
    copy->ctx = ctx;
    return CUDA_SUCCESS;
}

/* The kernel-node entry points: `p` (of `type`) is given to the driver as is, or rewritten for
 * a wrapped kernel (node_replace) or a confined one (`confine`, v2 only); `clear` names the
 * kernel by its function alone (v2). */
#define CLC_KERNEL_NODE_HOOK(name, entry_point, plist, type, fn_of, ctx_of, clear, confine, call) \
    CLC_EXPORT CUresult name plist {                                                            \
        pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        int gated;                                                                               \
        CUresult r = graph_gate(&g, &gated, fn_of, ctx_of, entry_point,                          \
                                (const CUDA_KERNEL_NODE_PARAMS_v1 *)p, 1, confine);              \
        if (r != CUDA_SUCCESS) return r;                                                         \
        clc_replaced rr;                                                                         \
        type copy;                                                                               \
        if (confine && gated && g.outcome->action == CLC_ACTION_CONFINE) {                       \
            CUresult why = node_confine(&g, fn_of, (const CUDA_KERNEL_NODE_PARAMS_v2 *)p,       \
                                        (CUDA_KERNEL_NODE_PARAMS_v2 *)&copy);                   \
            if (why == CUDA_SUCCESS) {                                                           \
                const type *given = p;                                                           \
                p = &copy;                                                                       \
                r = real call;                                                                   \
                p = given;                                                                       \
                if (r == CUDA_SUCCESS) return clc_gate_exit(&g, r);                              \
                why = r;                                                                         \
            }                                                                                    \
            if (clc_green_unconfined(g.outcome->replacement, why, CLC_UNCONFINED_GRAPH_NODE))     \
                return clc_gate_exit(&g, clc_gate_refuse(&g));                                   \
        }                                                                                        \
        int swapped = gated && g.outcome->action == CLC_ACTION_REPLACE &&                        \
                      node_replace(&g, &rr, (const CUDA_KERNEL_NODE_PARAMS_v1 *)p);              \
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
        if (swapped) clc_replace_end(&rr);                                                       \
        return gated ? clc_gate_exit(&g, r) : r;                                                 \
    }
#define CLC_V1_CLEAR ((void)0)
#define CLC_V2_CLEAR (copy.kern = NULL, copy.ctx = NULL)
CLC_KERNEL_NODE_HOOK(cuGraphAddKernelNode, CLC_ENTRY_GRAPH_ADD_NODE,
                     (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                      const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, CLC_V1_CLEAR, 0,
                     (node, graph, deps, n_deps, p))
CLC_KERNEL_NODE_HOOK(cuGraphAddKernelNode_v2, CLC_ENTRY_GRAPH_ADD_NODE,
                     (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                      const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), CLC_V2_CLEAR, 1,
                     (node, graph, deps, n_deps, p))
CLC_KERNEL_NODE_HOOK(cuGraphKernelNodeSetParams, CLC_ENTRY_GRAPH_NODE_SET,
                     (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, CLC_V1_CLEAR, 0,
                     (node, p))
CLC_KERNEL_NODE_HOOK(cuGraphKernelNodeSetParams_v2, CLC_ENTRY_GRAPH_NODE_SET,
                     (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), CLC_V2_CLEAR, 1,
                     (node, p))
CLC_KERNEL_NODE_HOOK(cuGraphExecKernelNodeSetParams, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
                     (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, CLC_V1_CLEAR, 0,
                     (exec, node, p))
CLC_KERNEL_NODE_HOOK(cuGraphExecKernelNodeSetParams_v2, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
                     (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), CLC_V2_CLEAR, 1,
                     (exec, node, p))

/* The generic node API: only kernel nodes are gated, any other type passes untouched. */
#define CLC_NODE_KERNEL(p) ((p) && (p)->type == CU_GRAPH_NODE_TYPE_KERNEL ? &(p)->kernel : NULL)
CLC_GRAPH_HOOK(cuGraphAddNode, CLC_ENTRY_GRAPH_ADD_NODE,
               (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                clc_graph_node_params *p),
               CLC_V2_KERNEL(CLC_NODE_KERNEL(p)), CLC_V2_CTX(CLC_NODE_KERNEL(p)),
               CLC_NODE_KERNEL(p), (node, graph, deps, n_deps, p))
CLC_GRAPH_HOOK(cuGraphAddNode_v2, CLC_ENTRY_GRAPH_ADD_NODE,
               (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, const void *edges,
                size_t n_deps, clc_graph_node_params *p),
               CLC_V2_KERNEL(CLC_NODE_KERNEL(p)), CLC_V2_CTX(CLC_NODE_KERNEL(p)),
               CLC_NODE_KERNEL(p), (node, graph, deps, edges, n_deps, p))
CLC_GRAPH_HOOK(cuGraphNodeSetParams, CLC_ENTRY_GRAPH_NODE_SET,
               (CUgraphNode node, clc_graph_node_params *p), CLC_V2_KERNEL(CLC_NODE_KERNEL(p)),
               CLC_V2_CTX(CLC_NODE_KERNEL(p)), CLC_NODE_KERNEL(p), (node, p))
CLC_GRAPH_HOOK(cuGraphExecNodeSetParams, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
               (CUgraphExec exec, CUgraphNode node, clc_graph_node_params *p),
               CLC_V2_KERNEL(CLC_NODE_KERNEL(p)), CLC_V2_CTX(CLC_NODE_KERNEL(p)),
               CLC_NODE_KERNEL(p), (exec, node, p))
