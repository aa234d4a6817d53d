/* SPDX-License-Identifier: Apache-2.0
 *
 * gate.h: the launch gate, shared by the launch entry points (launch.c, which holds its
 * out-of-line parts) and the graph kernel-node entry points (graph.c). Its fast path is inlined
 * into each hook.
 */
#ifndef CLC_GATE_H
#define CLC_GATE_H

#include "shim.h"

typedef struct {
    clc_entry *entry;
    const clc_outcome *outcome;
    uint32_t entry_point;
    uint32_t grid[3], block[3], shmem;
    CUstream stream;
    uint64_t t_ns, seq;
    clc_timing *timing;
    int record; /* write a LAUNCH record: the outcome asks, or one of a kernel's first denies */
    int reentrant; /* made while this thread was inside clc (a signal handler's): no locks */
    int refused; /* refused by its rule's on_unwrappable: counted and recorded as denied */
    clc_outcome scratch; /* the engine's answer for this launch (modes other than cached) */
} gate;

/* The gate's out-of-line parts (launch.c): a first sight, an outcome that depends on the
 * launch, everything a launch that is not a plain allow needs (a launch of a process in a
 * priority class too: clc_gate_setup returns 0 for it when it is a plain allow after all), and
 * what follows the call. */
clc_entry *clc_first_sight(gate *g, uint64_t f, uint64_t ctx, uint32_t entry_point, unsigned gx,
                           unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                           unsigned shmem, CUstream stream, void **params, void **extra);
const clc_outcome *clc_shaped_outcome(gate *g, clc_entry *e, uint32_t entry_point, unsigned gx,
                                      unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                      unsigned bz, unsigned shmem, CUstream stream, void **params,
                                      void **extra);
int clc_gate_setup(gate *g, const clc_outcome *o, uint32_t entry_point, unsigned gx, unsigned gy,
                   unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                   CUstream stream, int reentrant);
CUresult clc_gate_exit(gate *g, CUresult result);
/* A launch its rule's on_unwrappable refuses (it cannot be confined): counted and recorded as
 * denied by the rule; returns CUDA_ERROR_NOT_PERMITTED. */
CUresult clc_gate_refuse(gate *g);
/* The gate of a launch made while the thread is inside clc: a signal handler that interrupted
 * clc's own work, or a Python hook's own launch. It is decided all the same, from the decision
 * cache alone (a first sight would wait for locks the interrupted code may hold): a kernel not
 * decided yet gets on_error, a confine the rule's on_unwrappable, said once. */
int clc_gate_reentrant(gate *g, CUfunction f, CUcontext ctx, uint32_t entry_point, unsigned gx,
                       unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, CUstream stream, void **params, void **extra);
/* No driver could be placed: the launch gets on_error, counted in the capture's END record. */
int clc_gate_unplaced(gate *g, uint32_t entry_point, unsigned gx, unsigned gy, unsigned gz,
                      unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream);
/* Graph slots used up (CLC_GRAPH_SLOTS in one context): said once, for launches captured into
 * graphs and kernel nodes alike. */
void clc_graph_slots_used_up(void);

/* A launch, or a graph node made or changed, counted to its kernel's entry. */
static inline void count_launch(clc_entry *e, uint32_t entry_point) {
    if (unlikely((entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) >= CLC_ENTRY_GRAPH_ADD_NODE))
        atomic_fetch_add_explicit(&e->graph_nodes, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&e->launches, 1, memory_order_relaxed);
}

/* The fast path, inlined into each hook: find the (kernel, context) entry, count the launch,
 * pick its outcome. Returns 0 when the launch is a plain allow with nothing to record, the
 * common case; it then touches one cache line of the table and one of g_hot. */
static inline __attribute__((always_inline)) int gate_enter(gate *g, CUfunction f, CUcontext ctx,
                                                            uint32_t entry_point, unsigned gx,
                                                            unsigned gy, unsigned gz, unsigned bx,
                                                            unsigned by, unsigned bz,
                                                            unsigned shmem, CUstream stream,
                                                            void **params, void **extra) {
    g->entry = NULL;
    if (unlikely(!clc_hook_ready()))
        return clc_gate_unplaced(g, entry_point, gx, gy, gz, bx, by, bz, shmem, stream);
    if (!ctx) ctx = current_ctx();
    clc_entry *e = clc_cache_find((uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)ctx);
    int first = 0;
    if (unlikely(!e)) {
        e = clc_first_sight(g, (uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)ctx, entry_point, gx,
                            gy, gz, bx, by, bz, shmem, stream, params, extra);
        first = 1;
    }
    const clc_outcome *o;
    if (likely(e != NULL)) {
        /* At first sight the engine has just answered for this very launch (in the cached
         * mode the entry's answer holds for every launch, whichever thread made it). */
        if (likely(e->shaped == 0))
            o = &e->fallback;
        else if (first && e->mode != CLC_MODE_CACHED)
            o = &g->scratch;
        else
            o = clc_shaped_outcome(g, e, entry_point, gx, gy, gz, bx, by, bz, shmem, stream, params,
                                   extra);
        count_launch(e, entry_point);
    } else {
        o = &g_cfg.on_error;
    }
    g->entry = e;
    /* A process of a priority class takes the out-of-line path (clc_gate_setup) */
    if (likely(o->action == CLC_ACTION_ALLOW && o->flags == 0 && !g_hot.priority)) return 0;
    return clc_gate_setup(g, o, entry_point, gx, gy, gz, bx, by, bz, shmem, stream, 0);
}

/* A launch the driver refused: counted apart, so that `launches - denied - failed` is what
 * the GPU was given. */
static inline CUresult count_failure(const gate *g, CUresult result) {
    if (unlikely(result != CUDA_SUCCESS) && g->entry)
        atomic_fetch_add_explicit(&g->entry->failed, 1, memory_order_relaxed);
    return result;
}

#endif /* CLC_GATE_H */
