/* SPDX-License-Identifier: Apache-2.0
 *
 * gate.h: the launch gate, shared by the launch entry points (launch.c, which holds its
 * out-of-line parts) and the graph kernel-node entry points (graph.c). Its fast path is inlined
 * into each hook.
 */
#ifndef CLC_GATE_H
#define CLC_GATE_H

#include "hooks.h"

typedef struct {
    clc_entry *entry;
    const clc_outcome *outcome;
    const clc_launch *launch; /* the hook's, for as long as the gate (set by clc_gate_setup) */
    uint64_t t_ns, seq;
    clc_timing *timing;
    int record; /* write a LAUNCH record: the outcome asks, or one of a kernel's first denies */
    int reentrant; /* made while this thread was inside clc (a signal handler's): no locks */
    int refused; /* refused by its rule's on_unwrappable: counted and recorded as denied */
    int unplaced; /* gate_enter found no driver placed (read only when it found no outcome) */
    clc_outcome scratch; /* the engine's answer for this launch (modes other than cached) */
} gate;

/* The gate's out-of-line parts (launch.c): a first sight, everything a launch that is not a
 * plain allow needs (an outcome with CLC_FLAG_PRIORITY too: clc_gate_setup returns 0 for it
 * when it is a plain allow after all), and what follows the call. `l` lives in the
 * hook's frame until clc_gate_exit. */
clc_entry *clc_first_sight(gate *g, uint64_t f, uint64_t ctx, const clc_launch *l);
int clc_gate_setup(gate *g, const clc_outcome *o, const clc_launch *l, int reentrant);
CUresult clc_gate_exit(gate *g, CUresult result);
/* A launch its rule's on_unwrappable refuses (it cannot be confined): counted and recorded as
 * denied by the rule; returns CUDA_ERROR_NOT_PERMITTED. */
CUresult clc_gate_refuse(gate *g);
/* The gate of a launch made while the thread is inside clc: a signal handler that interrupted
 * clc's own work, or a Python hook's own launch. It is decided all the same, from the decision
 * cache alone (a first sight would wait for locks the interrupted code may hold): a kernel not
 * decided yet gets on_error, a confine the rule's on_unwrappable, said once. */
int clc_gate_reentrant(gate *g, CUfunction f, CUcontext ctx, const clc_launch *l);
/* No driver could be placed: the launch gets on_error, counted in the capture's END record. */
int clc_gate_unplaced(gate *g, const clc_launch *l);
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

/* The fast path, inlined into each hook, in two steps so that the hook builds its clc_launch
 * only when the gate needs it. gate_enter finds the (kernel, context) entry and, for a kernel
 * whose outcome does not depend on the launch, counts the launch and picks its outcome: 0 when
 * the launch is a plain allow with nothing to record, the common case (it then touches one
 * cache line of the table and one of g_hot, and the launch is counted to g->entry); 1 when
 * clc_gate_decide is to finish the work with the launch (a first sight, an outcome that depends
 * on the launch, anything but a plain allow, no driver placed). *ctx is the launch's context
 * (NULL: the current one, looked up here). */
static inline __attribute__((always_inline)) int gate_enter(gate *g, CUfunction f, CUcontext *ctx,
                                                            uint32_t entry_point) {
    g->outcome = NULL;
    if (unlikely(!clc_hook_ready())) {
        g->entry = NULL;
        g->unplaced = 1;
        return 1;
    }
    if (!*ctx) *ctx = current_ctx();
    clc_entry *e = clc_cache_find((uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)*ctx);
    g->entry = e;
    if (unlikely(!e || e->shaped)) {
        g->unplaced = 0;
        return 1;
    }
    count_launch(e, entry_point);
    const clc_outcome *o = &e->fallback;
    /* CLC_FLAG_PRIORITY (a process in a priority class) takes the out-of-line path too. */
    if (likely(o->action == CLC_ACTION_ALLOW && o->flags == 0)) return 0;
    g->outcome = o;
    return 1;
}

/* The rest of the gate, for a launch gate_enter returned 1 for, with the launch `l`: the same
 * answer (0 for a plain allow after all). */
int clc_gate_decide(gate *g, CUfunction f, CUcontext ctx, const clc_launch *l);

/* Both steps, for callers that have built the launch anyway (graph nodes, several devices'
 * cooperative launches). */
static inline int gate_launch(gate *g, CUfunction f, CUcontext ctx, const clc_launch *l) {
    return gate_enter(g, f, &ctx, l->entry_point) && clc_gate_decide(g, f, ctx, l);
}

/* A launch the driver refused: counted apart, so that `launches - denied - failed` is what
 * the GPU was given. */
static inline CUresult count_failure(const gate *g, CUresult result) {
    if (unlikely(result != CUDA_SUCCESS) && g->entry)
        atomic_fetch_add_explicit(&g->entry->failed, 1, memory_order_relaxed);
    return result;
}

#endif /* CLC_GATE_H */
