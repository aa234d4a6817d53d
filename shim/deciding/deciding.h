/* SPDX-License-Identifier: Apache-2.0
 *
 * deciding.h: the deciding layer of stage 1 (shim/deciding/: decide.c decider.c bridge_loader.c
 * replace.c): first sights decided, the bridge to Python, clc-run's decider, wrapped kernels'
 * launches.
 */
#ifndef CLC_DECIDING_H
#define CLC_DECIDING_H

#include "priority/priority.h"

/* A wrapped kernel's launch (replace.c): the function, grid and arguments to give the driver
 * instead of the program's. clc_replace_begin returns CUDA_SUCCESS, or an error for a launch
 * it cannot rewrite (the caller then applies on_error); clc_replace_end frees what it made.
 * `graph`: the launch is being captured into a CUDA graph (it gets a graph slot, see
 * CLC_GRAPH_SLOTS, which the caller zeroes in the stream before the launch). */
typedef struct {
    CUfunction f;
    unsigned grid[3];
    void **params;
    void **extra;
    void *heap;
    clc_launch_arg arg;
    size_t extra_size;
    void *extra_pairs[5];
    void *small[33];
} clc_replaced;
CUresult clc_replace_begin(clc_replaced *r, const clc_replacement *rep, const clc_launch *l,
                           int graph);
/* clc_replace_begin's answer when a captured launch finds the context's graph slots used up. */
#define CLC_NO_GRAPH_SLOT CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
/* An attribute the program set on a kernel (cuFuncSetAttribute / cuKernelSetAttribute) after
 * its launches in the current context were wrapped: set on the replacements too. */
void clc_replace_set_attribute(uint64_t handle, int attrib, int value, int device);
static inline void clc_replace_end(clc_replaced *r) {
    if (r->heap) free(r->heap);
}

/* ---- first sights (decide.c) ------------------------------------------------------------- */
/* Asks the engine about a new (kernel, context) and publishes its entry; `answer` gets the
 * engine's outcome for this very launch (another thread's entry may have won the insert).
 * decide.c, as is clc_outcome_for. */
clc_entry *clc_cache_decide(uint64_t handle, uint64_t ctx, const clc_launch *l,
                            clc_outcome *answer);
/* The outcome of a launch of an entry whose `shaped` is not 0: shape clauses, or the engine
 * asked per shape (answers cached here) or at every launch (answer in *scratch). */
const clc_outcome *clc_outcome_for(clc_entry *e, const clc_launch *l, clc_outcome *scratch);
/* ---- the bridge to Python (stage 2) ------------------------------------------------------ */
int clc_bridge_decide(const clc_kernel_query *q, clc_decision *out); /* 0: decided */
int clc_bridge_launch(const clc_kernel_query *q, clc_outcome *out);  /* 0: decided */
void clc_bridge_module(const clc_module_event *ev);
void clc_bridge_exit(void); /* the engine's exit work (on_exit hooks), if Python still runs */
void clc_bridge_after_fork_child(void);

/* ---- the decider: clc-run answers first sights for policies without Python hooks ---------- */
int clc_decider_configured(void);
/* CLC_DECIDE_OK with `out` filled; CLC_DECIDE_ENGINE (the program's engine must decide: a wrap),
 * `out` then what to do without that engine (wraps as their on_unwrappable) when *substitute;
 * or CLC_DECIDE_FAILED (said once; the program's engine decides). */
int clc_decider_decide(const clc_kernel_query *q, clc_decision *out, int *substitute);
/* Whether the process's user or groups changed since the last call (the first call notes
 * them): then the connection to clc-run is dropped, to be made again with the new
 * credentials (decider.c). */
int clc_identity_changed(void);
/* After a change of user or groups, every decision is forgotten (decide.c). */
void clc_identity_follow(void);
/* Whether the process is confined program-wide on `device` (scope: program), and by which
 * CLC_ACTION_CONFINE word (less CLC_CONFINE_DENY): asked once per device (decide.c). */
int clc_program_scope(int device, uint64_t *word);
void clc_decider_after_fork_child(void);

#endif /* CLC_DECIDING_H */
