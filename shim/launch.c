/* SPDX-License-Identifier: Apache-2.0
 *
 * launch.c: the launch gate (gate.h) and the launch entry points that go through it:
 * cuLaunchKernel, cuLaunchKernelEx, the cooperative launches (one device or several) and their
 * _ptsz variants. A launch's outcome comes from the decision cache; a miss is a first sight
 * (decide.c).
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "gate.h"

/* ---- the launch gate ------------------------------------------------------------------------- */

static _Atomic uint64_t g_seq;

#define CLC_LAUNCH_INFO(entry_point)                                                          \
    {                                                                                        \
        .entry_point = entry_point, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shmem = shmem, \
        .stream = stream, .params = params, .extra = extra                                    \
    }

/* A kernel's first launch in this context: the exit work is registered (process.c; once, at the
 * first CUDA activity), then decide.c asks for the decision. */
__attribute__((noinline)) clc_entry *clc_first_sight(gate *g, uint64_t f, uint64_t ctx,
                                                     uint32_t entry_point, unsigned gx, unsigned gy,
                                                     unsigned gz, unsigned bx, unsigned by,
                                                     unsigned bz, unsigned shmem, CUstream stream,
                                                     void **params, void **extra) {
    clc_launch_info l = CLC_LAUNCH_INFO(entry_point);
    t_in_clc = 1;
    clc_ensure_exit_handler();
    clc_entry *e = clc_cache_decide(f, ctx, &l, &g->scratch);
    t_in_clc = 0;
    return e;
}

/* A launch made inside clc's own work on this thread (see gate.h): its kernel's cached
 * decision, or on_error; nothing that takes a lock. */
__attribute__((noinline)) int clc_gate_reentrant(gate *g, CUfunction f, CUcontext ctx,
                                                 uint32_t entry_point, unsigned gx, unsigned gy,
                                                 unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                 unsigned shmem, CUstream stream, void **params,
                                                 void **extra) {
    clc_launch_info l = CLC_LAUNCH_INFO(entry_point);
    const clc_outcome *o = NULL;
    clc_entry *e = NULL;
    g->entry = NULL;
    if (!clc_driver_ready()) {
        clc_capture_undecided();
    } else {
        if (!ctx) ctx = current_ctx();
        e = clc_cache_find((uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)ctx);
    }
    if (e) {
        if (e->shaped == 0)
            o = &e->fallback;
        else if (e->mode == CLC_MODE_CACHED)
            o = clc_outcome_for(e, &l, &g->scratch);
        else if (e->mode == CLC_MODE_PER_SHAPE)
            o = clc_find_shape(e, &l);
        count_launch(e, entry_point);
    }
    if (!o) {
        o = &g_cfg.on_error;
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "a launch made while clc was deciding on the same thread (in a signal "
                    "handler, or a Python hook's own) is of a kernel not decided yet: it gets "
                    "on_error=%s",
                    o->action == CLC_ACTION_DENY ? "deny" : "allow");
    } else if (o->action == CLC_ACTION_CONFINE) {
        /* The partition's streams are taken under locks the interrupted code may hold. */
        int deny = (o->replacement & CLC_CONFINE_DENY) != 0;
        g->scratch = *o;
        g->scratch.action = deny ? CLC_ACTION_DENY : CLC_ACTION_ALLOW;
        g->scratch.error = CUDA_ERROR_NOT_PERMITTED;
        g->scratch.replacement = 0;
        o = &g->scratch;
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "sm_share: a launch made while clc was deciding on the same thread (in a "
                    "signal handler) cannot be confined: it gets its rule's on_unwrappable");
    }
    g->entry = e;
    if (o->action == CLC_ACTION_ALLOW && o->flags == 0) return 0;
    return clc_gate_setup(g, o, entry_point, gx, gy, gz, bx, by, bz, shmem, stream, 1);
}

/* No driver placed: on_error, said once (clc_start_driver), counted. */
__attribute__((noinline)) int clc_gate_unplaced(gate *g, uint32_t entry_point, unsigned gx,
                                                unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                                unsigned bz, unsigned shmem, CUstream stream) {
    clc_capture_undecided();
    return clc_gate_setup(g, &g_cfg.on_error, entry_point, gx, gy, gz, bx, by, bz, shmem, stream,
                          0);
}

/* An entry whose outcome depends on the launch: shape clauses, or the engine's hooks. */
__attribute__((noinline)) const clc_outcome *clc_shaped_outcome(
    gate *g, clc_entry *e, uint32_t entry_point, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
    unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params, void **extra) {
    clc_launch_info l = CLC_LAUNCH_INFO(entry_point);
    return clc_outcome_for(e, &l, &g->scratch);
}

/* A launch of a process in a priority class: a latency-critical one marks its GPU busy, a
 * best-effort one may wait, or (held_share) be confined: then the CLC_ACTION_CONFINE word it is
 * to run under is returned. Graph nodes made or changed are not launches. */
static uint64_t gate_priority(const clc_entry *e, uint32_t entry_point, CUstream stream) {
    if ((entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) >= CLC_ENTRY_GRAPH_ADD_NODE) return 0;
    if (g_hot.priority == CLC_PRIORITY_LC) {
        clc_priority_lc_launch(e->device, stream, (entry_point & CLC_ENTRY_PTSZ) != 0);
        return 0;
    }
    return clc_priority_be_launch(e->device, (CUcontext)(uintptr_t)e->ctx, stream,
                                  (entry_point & CLC_ENTRY_PTSZ) != 0);
}

/* Everything a launch that is not a plain allow needs: kept out of the inlined fast path. */
__attribute__((noinline)) int clc_gate_setup(gate *g, const clc_outcome *o, uint32_t entry_point,
                                             unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shmem,
                                             CUstream stream, int reentrant) {
    clc_entry *e = g->entry;
    if (g_hot.priority && !reentrant && e && o->action != CLC_ACTION_DENY) {
        uint64_t held = gate_priority(e, entry_point, stream);
        if (held && o->action == CLC_ACTION_ALLOW) {
            /* held to a share: confined as an sm_share rule would (a launch that cannot be
             * confined runs as it was made, said once) */
            g->scratch = *o;
            g->scratch.action = CLC_ACTION_CONFINE;
            g->scratch.replacement = held;
            o = &g->scratch;
        } else if (o->action == CLC_ACTION_ALLOW && o->flags == 0) {
            return 0;
        }
    }
    g->outcome = o;
    g->reentrant = reentrant;
    g->refused = 0;
    g->entry_point = entry_point;
    g->grid[0] = gx, g->grid[1] = gy, g->grid[2] = gz;
    g->block[0] = bx, g->block[1] = by, g->block[2] = bz;
    g->shmem = shmem;
    g->stream = stream;
    g->timing = NULL;
    g->seq = atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed);
    g->record = (o->flags & CLC_FLAG_RECORD) != 0;
    if (o->action == CLC_ACTION_DENY) {
        clc_count_denied_by(o->rule);
        if (e &&
            atomic_fetch_add_explicit(&e->denied, 1, memory_order_relaxed) < CLC_DENIED_RECORDED)
            g->record = 1;
    }
    g->t_ns = g->record ? clc_launch_time_ns() : 0;
    /* Timing takes the thread's event pool: not from inside clc's own work. */
    if ((o->flags & CLC_FLAG_TIME) && o->action != CLC_ACTION_DENY && e && !reentrant &&
        (entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) < CLC_ENTRY_GRAPH_ADD_NODE) {
        t_in_clc = 1;
        clc_timing_begin(&g->timing, stream, (entry_point & CLC_ENTRY_PTSZ) != 0, e, g->seq);
        t_in_clc = 0;
    }
    return 1;
}

CUresult clc_gate_refuse(gate *g) {
    g->refused = 1;
    clc_count_denied_by(g->outcome->rule);
    if (g->entry &&
        atomic_fetch_add_explicit(&g->entry->denied, 1, memory_order_relaxed) < CLC_DENIED_RECORDED)
        g->record = 1;
    if (g->record && !g->t_ns) g->t_ns = clc_launch_time_ns();
    return CUDA_ERROR_NOT_PERMITTED;
}

CUresult clc_gate_exit(gate *g, CUresult result) {
    clc_entry *e = g->entry;
    const clc_outcome *o = g->outcome;
    int denied = o->action == CLC_ACTION_DENY || g->refused;
    if (!denied) count_failure(g, result);
    int was = t_in_clc;
    t_in_clc = 1;
    if (g->timing) {
        if (result == CUDA_SUCCESS)
            clc_timing_end(g->timing, g->stream, (g->entry_point & CLC_ENTRY_PTSZ) != 0, e, g->seq);
        else
            clc_timing_end(g->timing, NULL, 0, NULL, 0);
    }
    clc_rec_launch *r;
    if (g->record && e && clc_capture_enabled() &&
        (r = clc_capture_begin(CLC_REC_LAUNCH, sizeof *r)) != NULL) {
        *r = (clc_rec_launch){
            .seq = g->seq,
            .t_ns = g->t_ns,
            .stream = (uint64_t)(uintptr_t)g->stream,
            .kernel_id = e->kernel_id,
            .entry = g->entry_point,
            .grid = {g->grid[0], g->grid[1], g->grid[2]},
            .block = {g->block[0], g->block[1], g->block[2]},
            .shared_mem = g->shmem,
            .tid = clc_tid(),
            .action = denied ? CLC_ACTION_DENY : o->action,
            .rule = o->rule,
            .result = result,
            .flags = g->timing && result == CUDA_SUCCESS ? CLC_LAUNCH_TIMED : 0,
        };
        clc_capture_commit();
        atomic_fetch_add_explicit(&e->recorded, 1, memory_order_relaxed);
    }
    t_in_clc = was;
    if (unlikely(atomic_load_explicit(&clc_late, memory_order_relaxed))) clc_late_launch();
    return result;
}

void clc_graph_slots_used_up(void) {
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "more than %d kernel nodes and captured launches of wrapped kernels in one "
                "context: later ones run unwrapped",
                CLC_GRAPH_SLOTS);
}

/* Whether the launch on `stream` is being captured into a CUDA graph (stream capture). An
 * invalidated capture counts as one: the launch fails either way, and must not take a ring
 * slot that a replay would reuse. */
static int stream_captured(CUstream stream, int ptsz) {
    int status;
    CUresult r = clc_stream_capture_status(stream, ptsz, &status);
    return r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
           (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE);
}

/* A wrapped kernel's launch that cannot be rewritten runs the original: said once. A kernel
 * that uses its slot, launched into a graph under stream capture, gets a graph slot, zeroed
 * by a memset captured just before it (so each replay starts afresh). */
__attribute__((noinline)) static int replace_begin(gate *g, clc_replaced *r, unsigned gx,
                                                   unsigned gy, unsigned gz, unsigned bx,
                                                   unsigned by, unsigned bz, unsigned shmem,
                                                   void **params, void **extra) {
    const clc_replacement *rep = (const clc_replacement *)(uintptr_t)g->outcome->replacement;
    int ptsz = (g->entry_point & CLC_ENTRY_PTSZ) != 0;
    int graph = rep && (rep->flags & CLC_REPLACE_SLOT) && stream_captured(g->stream, ptsz);
    CUresult e =
        rep ? clc_replace_begin(r, rep, gx, gy, gz, bx, by, bz, shmem, params, extra, graph)
            : CUDA_ERROR_INVALID_HANDLE;
    if (e == CUDA_SUCCESS && graph) {
        CUresult (*zero)(CUdeviceptr, unsigned char, size_t, CUstream) =
            ptsz ? g_drv.memset_d8_async_ptsz : g_drv.memset_d8_async;
        e = zero ? zero((CUdeviceptr)r->arg.slot, 0, CLC_SLOT_BYTES, g->stream)
                 : CUDA_ERROR_NOT_FOUND;
        if (e != CUDA_SUCCESS) clc_replace_end(r);
    }
    if (e == CUDA_SUCCESS) return 1;
    if (e == CLC_NO_GRAPH_SLOT) {
        clc_graph_slots_used_up();
        return 0;
    }
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "a wrapped kernel's launch could not be rewritten (CUresult %d): "
                "it runs unwrapped",
                (int)e);
    return 0;
}

/* The driver refused the wrapped kernel's launch (a cooperative grid sized for the original,
 * a resource limit the wrapper crosses): the original is launched instead, said once. */
__attribute__((noinline)) static void replaced_launch_failed(CUresult e) {
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "the driver refused a wrapped kernel's launch (CUresult %d): "
                "the original kernel was launched instead",
                (int)e);
}

/* The SMs a kernel's confined launches ran on, for its counts (clc_rec_kernel_stats). */
static inline void confined_on(const gate *g, unsigned sms) {
    if (g->entry && atomic_load_explicit(&g->entry->confined_sms, memory_order_relaxed) != sms)
        atomic_store_explicit(&g->entry->confined_sms, sms, memory_order_relaxed);
}

/* A confined launch: on the green stream, in the program's stream order. One that cannot be
 * confined, or that the driver refuses there, gets its rule's on_unwrappable: launched as the
 * program made it, or refused (counted and recorded as denied by the rule; a launch the driver
 * refused keeps the driver's error). A launch captured into a conditional node's body is not
 * confined: the driver requires the body's kernels to be in the conditional node's context.
 * `launch_on` makes the program's launch of `f` (`cooperative`: a grid that must be resident at
 * once) on a given stream. The partition's stream is
 * held under a lock from begin to end: inside clc's own work for this thread, so that a signal
 * handler's launch there does not wait for it. */
typedef CUresult (*launch_on_fn)(const void *launch, CUstream stream);
__attribute__((noinline)) static CUresult confined_launch(gate *g, CUfunction f, CUstream stream,
                                                          int cooperative, launch_on_fn launch_on,
                                                          const void *launch) {
    clc_green_launch gl;
    int was = t_in_clc;
    int ptsz = (g->entry_point & CLC_ENTRY_PTSZ) != 0;
    t_in_clc = 1;
    if (clc_green_capturing_into_body(stream, ptsz)) {
        t_in_clc = was;
        if (clc_green_unconfined(g->outcome->replacement, CUDA_ERROR_NOT_SUPPORTED,
                                 CLC_UNCONFINED_CONDITIONAL))
            return clc_gate_refuse(g);
        return launch_on(launch, stream);
    }
    CUresult why = clc_green_begin(&gl, g->outcome->replacement, stream, ptsz);
    if (why != CUDA_SUCCESS) {
        t_in_clc = was;
        if (clc_green_unconfined(g->outcome->replacement, why, CLC_UNCONFINED_NO_PARTITION))
            return clc_gate_refuse(g);
        return launch_on(launch, stream);
    }
    CUresult res = launch_on(launch, gl.stream);
    clc_green_end(&gl, res);
    t_in_clc = was;
    if (res == CUDA_SUCCESS) {
        confined_on(g, gl.sms);
    } else if (gl.entry) { /* not when it ran as it was made (a program context) */
        int reason = CLC_UNCONFINED_REFUSED;
        if (cooperative && res == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) {
            int per_sm = 0;
            if (g_drv.occupancy)
                g_drv.occupancy(&per_sm, f, (int)(g->block[0] * g->block[1] * g->block[2]),
                                g->shmem);
            clc_green_cooperative_too_large(g->grid[0] * g->grid[1] * g->grid[2], gl.sms,
                                            per_sm > 0 ? (unsigned)per_sm : 0);
            reason = CLC_UNCONFINED_COOPERATIVE;
        }
        if (clc_green_unconfined(g->outcome->replacement, res, reason))
            clc_gate_refuse(g);
        else
            res = launch_on(launch, stream);
    }
    return res;
}

/* CUlaunchAttribute: an id, then a 64-byte value whose first int is `cooperative` for
 * CU_LAUNCH_ATTRIBUTE_COOPERATIVE (cuda.h 13.0). */
typedef struct {
    int id;
    int pad;
    union {
        int cooperative;
        unsigned char bytes[64];
    } value;
} launch_attribute;
_Static_assert(sizeof(launch_attribute) == 72, "CUlaunchAttribute is 72 bytes (cuda.h 13.0)");
#define CU_LAUNCH_ATTRIBUTE_COOPERATIVE 2

static int launch_is_cooperative(const CUlaunchConfig *c) {
    const launch_attribute *a = c->attrs;
    for (unsigned i = 0; a && i < c->numAttrs; i++)
        if (a[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && a[i].value.cooperative) return 1;
    return 0;
}

/* The replace path of each launch entry point has a function of its own, out of line: its
 * rewritten arguments live in that function's frame, not in the hook's fast path. */
#define CLC_LAUNCH_HOOK(name, entry_point)                                                       \
    __attribute__((noinline)) static CUresult name##_replaced(                                  \
        gate *g, pfn_##name real, CUfunction f, unsigned gx, unsigned gy, unsigned gz,           \
        unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params,   \
        void **extra) {                                                                          \
        clc_replaced r;                                                                          \
        if (!replace_begin(g, &r, gx, gy, gz, bx, by, bz, shmem, params, extra))                 \
            return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                \
        CUresult res = real(r.f, r.grid[0], r.grid[1], r.grid[2], bx, by, bz, shmem, stream,     \
                            r.params, r.extra);                                                  \
        clc_replace_end(&r);                                                                     \
        if (unlikely(res != CUDA_SUCCESS)) {                                                     \
            replaced_launch_failed(res);                                                         \
            res = real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                 \
        }                                                                                        \
        return res;                                                                              \
    }                                                                                            \
    typedef struct {                                                                             \
        pfn_##name real;                                                                         \
        CUfunction f;                                                                            \
        unsigned grid[3], block[3], shmem;                                                       \
        void **params, **extra;                                                                  \
    } name##_launch;                                                                             \
    static CUresult name##_on(const void *launch, CUstream stream) {                             \
        const name##_launch *l = launch;                                                         \
        return l->real(l->f, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],       \
                       l->block[2], l->shmem, stream, l->params, l->extra);                      \
    }                                                                                            \
    __attribute__((noinline)) static CUresult name##_confined(                                  \
        gate *g, pfn_##name real, CUfunction f, unsigned gx, unsigned gy, unsigned gz,           \
        unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params,   \
        void **extra) {                                                                          \
        name##_launch l = {real, f, {gx, gy, gz}, {bx, by, bz}, shmem, params, extra};           \
        return confined_launch(g, f, stream, 0, name##_on, &l);                                  \
    }                                                                                            \
    CLC_EXPORT CUresult name CLC_LAUNCH_PARAMS {                                                 \
        pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        if (likely(!(unlikely(t_in_clc)                                                          \
                         ? clc_gate_reentrant(&g, f, NULL, entry_point, gx, gy, gz, bx, by, bz,  \
                                              shmem, stream, params, extra)                      \
                         : gate_enter(&g, f, NULL, entry_point, gx, gy, gz, bx, by, bz, shmem,   \
                                      stream, params, extra))))                                  \
            return count_failure(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)); \
        if (g.outcome->action == CLC_ACTION_DENY) return clc_gate_exit(&g, g.outcome->error);    \
        if (g.outcome->action == CLC_ACTION_REPLACE)                                             \
            return clc_gate_exit(&g, name##_replaced(&g, real, f, gx, gy, gz, bx, by, bz, shmem, \
                                                     stream, params, extra));                    \
        if (g.outcome->action == CLC_ACTION_CONFINE)                                             \
            return clc_gate_exit(&g, name##_confined(&g, real, f, gx, gy, gz, bx, by, bz, shmem, \
                                                     stream, params, extra));                    \
        return clc_gate_exit(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)); \
    }
CLC_LAUNCH_HOOK(cuLaunchKernel, CLC_ENTRY_LAUNCH)
CLC_LAUNCH_HOOK(cuLaunchKernel_ptsz, CLC_ENTRY_LAUNCH | CLC_ENTRY_PTSZ)

#define CLC_COOP_HOOK(name, entry_point)                                                         \
    __attribute__((noinline)) static CUresult name##_replaced(                                  \
        gate *g, pfn_##name real, CUfunction f, unsigned gx, unsigned gy, unsigned gz,           \
        unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params) { \
        clc_replaced r;                                                                          \
        if (!params || !replace_begin(g, &r, gx, gy, gz, bx, by, bz, shmem, params, NULL))       \
            return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                       \
        CUresult res = real(r.f, r.grid[0], r.grid[1], r.grid[2], bx, by, bz, shmem, stream,     \
                            r.params);                                                           \
        clc_replace_end(&r);                                                                     \
        if (unlikely(res != CUDA_SUCCESS)) {                                                     \
            replaced_launch_failed(res);                                                         \
            res = real(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                        \
        }                                                                                        \
        return res;                                                                              \
    }                                                                                            \
    typedef struct {                                                                             \
        pfn_##name real;                                                                         \
        CUfunction f;                                                                            \
        unsigned grid[3], block[3], shmem;                                                       \
        void **params;                                                                           \
    } name##_launch;                                                                             \
    static CUresult name##_on(const void *launch, CUstream stream) {                             \
        const name##_launch *l = launch;                                                         \
        return l->real(l->f, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],       \
                       l->block[2], l->shmem, stream, l->params);                                \
    }                                                                                            \
    __attribute__((noinline)) static CUresult name##_confined(                                  \
        gate *g, pfn_##name real, CUfunction f, unsigned gx, unsigned gy, unsigned gz,           \
        unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params) { \
        name##_launch l = {real, f, {gx, gy, gz}, {bx, by, bz}, shmem, params};                  \
        return confined_launch(g, f, stream, 1, name##_on, &l);                                  \
    }                                                                                            \
    CLC_EXPORT CUresult name CLC_COOP_PARAMS {                                                   \
        pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        if (likely(!(unlikely(t_in_clc)                                                          \
                         ? clc_gate_reentrant(&g, f, NULL, entry_point, gx, gy, gz, bx, by, bz,  \
                                              shmem, stream, params, NULL)                       \
                         : gate_enter(&g, f, NULL, entry_point, gx, gy, gz, bx, by, bz, shmem,   \
                                      stream, params, NULL))))                                   \
            return count_failure(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params));    \
        if (g.outcome->action == CLC_ACTION_DENY) return clc_gate_exit(&g, g.outcome->error);    \
        if (g.outcome->action == CLC_ACTION_REPLACE)                                             \
            return clc_gate_exit(&g, name##_replaced(&g, real, f, gx, gy, gz, bx, by, bz, shmem, \
                                                     stream, params));                           \
        if (g.outcome->action == CLC_ACTION_CONFINE)                                             \
            return clc_gate_exit(&g, name##_confined(&g, real, f, gx, gy, gz, bx, by, bz, shmem, \
                                                     stream, params));                           \
        return clc_gate_exit(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params));        \
    }
CLC_COOP_HOOK(cuLaunchCooperativeKernel, CLC_ENTRY_LAUNCH_COOPERATIVE)
CLC_COOP_HOOK(cuLaunchCooperativeKernel_ptsz, CLC_ENTRY_LAUNCH_COOPERATIVE | CLC_ENTRY_PTSZ)

/* Several devices' cooperative launches at once: each decided as a cooperative launch; when one
 * is denied, none is launched (the call is all or nothing, as the driver's is). Wrapped kernels
 * run unwrapped here (said once): their replacement is made for one context. */
CLC_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(clc_launch_params *list, unsigned int n,
                                                         unsigned int flags) {
    pfn_cuLaunchCooperativeKernelMultiDevice real =
        (pfn_cuLaunchCooperativeKernelMultiDevice)clc_real(
            CLC_SYM_cuLaunchCooperativeKernelMultiDevice);
    if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;
    if (!list || n == 0) return real(list, n, flags);
    gate small[8], *g = n <= 8 ? small : malloc(n * sizeof *g);
    unsigned char small_gated[8], *gated = n <= 8 ? small_gated : malloc(n);
    if (!g || !gated) {
        if (g != small) free(g);
        if (gated != small_gated) free(gated);
        return g_cfg.on_error.action == CLC_ACTION_DENY ? g_cfg.on_error.error
                                                        : real(list, n, flags);
    }
    CUresult refused = CUDA_SUCCESS;
    clc_timing_events_only(1);
    for (unsigned i = 0; i < n; i++) {
        const clc_launch_params *p = &list[i];
        gated[i] = (unsigned char)(t_in_clc ? clc_gate_reentrant : gate_enter)(
            &g[i], p->function, NULL, CLC_ENTRY_LAUNCH_COOPERATIVE, p->gridDimX, p->gridDimY,
            p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->hStream,
            p->kernelParams, NULL);
        if (!gated[i]) continue;
        if (g[i].outcome->action == CLC_ACTION_DENY && refused == CUDA_SUCCESS)
            refused = g[i].outcome->error;
        if (g[i].outcome->action == CLC_ACTION_REPLACE) {
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING, "a wrapped kernel launched with "
                                         "cuLaunchCooperativeKernelMultiDevice runs unwrapped");
        }
        if (g[i].outcome->action == CLC_ACTION_CONFINE &&
            clc_green_unconfined(g[i].outcome->replacement, CUDA_ERROR_NOT_SUPPORTED,
                                 CLC_UNCONFINED_MULTI_DEVICE) &&
            clc_gate_refuse(&g[i]) && refused == CUDA_SUCCESS)
            refused = CUDA_ERROR_NOT_PERMITTED;
    }
    clc_timing_events_only(0);
    CUresult r = refused != CUDA_SUCCESS ? refused : real(list, n, flags);
    for (unsigned i = 0; i < n; i++) {
        if (!gated[i])
            count_failure(&g[i], r);
        else
            clc_gate_exit(&g[i], g[i].outcome->action == CLC_ACTION_DENY ? g[i].outcome->error
                                 : g[i].refused                          ? CUDA_ERROR_NOT_PERMITTED
                                                                         : r);
    }
    if (g != small) free(g);
    if (gated != small_gated) free(gated);
    return r;
}

#define CLC_LAUNCH_EX_HOOK(name, entry_point)                                                    \
    __attribute__((noinline)) static CUresult name##_replaced(                                  \
        gate *g, pfn_##name real, const CUlaunchConfig *config, CUfunction f, void **params,     \
        void **extra) {                                                                          \
        clc_replaced r;                                                                          \
        if (!replace_begin(g, &r, config->gridDimX, config->gridDimY, config->gridDimZ,          \
                           config->blockDimX, config->blockDimY, config->blockDimZ,              \
                           config->sharedMemBytes, params, extra))                               \
            return real(config, f, params, extra);                                               \
        CUlaunchConfig c = *config;                                                              \
        c.gridDimX = r.grid[0], c.gridDimY = r.grid[1], c.gridDimZ = r.grid[2];                  \
        CUresult res = real(&c, r.f, r.params, r.extra);                                         \
        clc_replace_end(&r);                                                                     \
        if (unlikely(res != CUDA_SUCCESS)) {                                                     \
            replaced_launch_failed(res);                                                         \
            res = real(config, f, params, extra);                                                \
        }                                                                                        \
        return res;                                                                              \
    }                                                                                            \
    typedef struct {                                                                             \
        pfn_##name real;                                                                         \
        const CUlaunchConfig *config;                                                            \
        CUfunction f;                                                                            \
        void **params, **extra;                                                                  \
    } name##_launch;                                                                             \
    static CUresult name##_on(const void *launch, CUstream stream) {                             \
        const name##_launch *l = launch;                                                         \
        CUlaunchConfig c = *l->config;                                                           \
        c.hStream = stream;                                                                      \
        return l->real(&c, l->f, l->params, l->extra);                                           \
    }                                                                                            \
    __attribute__((noinline)) static CUresult name##_confined(                                  \
        gate *g, pfn_##name real, const CUlaunchConfig *config, CUfunction f, void **params,     \
        void **extra) {                                                                          \
        name##_launch l = {real, config, f, params, extra};                                      \
        return confined_launch(g, f, config->hStream, launch_is_cooperative(config), name##_on,  \
                               &l);                                                              \
    }                                                                                            \
    CLC_EXPORT CUresult name CLC_LAUNCH_EX_PARAMS {                                              \
        pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        if (unlikely(!config)) return real(config, f, params, extra);                            \
        if (likely(!(unlikely(t_in_clc)                                                          \
                         ? clc_gate_reentrant(&g, f, NULL, entry_point, config->gridDimX,        \
                                              config->gridDimY, config->gridDimZ,                \
                                              config->blockDimX, config->blockDimY,              \
                                              config->blockDimZ, config->sharedMemBytes,         \
                                              config->hStream, params, extra)                    \
                         : gate_enter(&g, f, NULL, entry_point, config->gridDimX,                \
                                      config->gridDimY, config->gridDimZ, config->blockDimX,     \
                                      config->blockDimY, config->blockDimZ,                      \
                                      config->sharedMemBytes, config->hStream, params, extra)))) \
            return count_failure(&g, real(config, f, params, extra));                            \
        if (g.outcome->action == CLC_ACTION_DENY) return clc_gate_exit(&g, g.outcome->error);    \
        if (g.outcome->action == CLC_ACTION_REPLACE)                                             \
            return clc_gate_exit(&g, name##_replaced(&g, real, config, f, params, extra));       \
        if (g.outcome->action == CLC_ACTION_CONFINE)                                             \
            return clc_gate_exit(&g, name##_confined(&g, real, config, f, params, extra));       \
        return clc_gate_exit(&g, real(config, f, params, extra));                                \
    }
CLC_LAUNCH_EX_HOOK(cuLaunchKernelEx, CLC_ENTRY_LAUNCH_EX)
CLC_LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz, CLC_ENTRY_LAUNCH_EX | CLC_ENTRY_PTSZ)
