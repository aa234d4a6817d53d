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

/* A kernel's first launch in this context: the exit work is registered (process.c; once, at the
 * first CUDA activity), then decide.c asks for the decision, with the program's signals held
 * (core.h): a handler's launch runs after it, decided, rather than inside it as on_error. */
__attribute__((noinline)) clc_entry *clc_first_sight(gate *g, uint64_t f, uint64_t ctx,
                                                     const clc_launch *l) {
    sigset_t held;
    clc_signals_hold(&held);
    t_in_clc = 1;
    clc_ensure_exit_handler();
    clc_entry *e = clc_cache_decide(f, ctx, l, &g->scratch);
    t_in_clc = 0;
    clc_signals_release(&held);
    return e;
}

/* A launch made inside clc's own work on this thread (see gate.h): its kernel's cached
 * decision, or on_error; nothing that takes a lock. */
__attribute__((noinline)) int clc_gate_reentrant(gate *g, CUfunction f, CUcontext ctx,
                                                 const clc_launch *l) {
    const clc_outcome *o = NULL;
    clc_entry *e = NULL;
    g->entry = NULL;
    if (clc_driver_ready()) {
        if (!ctx) ctx = current_ctx();
        e = clc_cache_find((uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)ctx);
    }
    if (e) {
        if (e->shaped == 0)
            o = &e->fallback;
        else if (e->mode == CLC_MODE_CACHED)
            o = clc_outcome_for(e, l, &g->scratch);
        else if (e->mode == CLC_MODE_PER_SHAPE)
            o = clc_find_shape(e, l);
        count_launch(e, l->entry_point);
    }
    if (!o) {
        /* With no entry, its record cannot be written (it names the kernel): counted apart, one
         * by one (an atomic add, safe in a signal handler), so that the capture's on_error count
         * holds every such launch. */
        if (!e) clc_capture_undecided();
        o = &g_cfg.on_error;
        CLC_WARN_ONCE("a launch made while clc was deciding on the same thread (in a signal "
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
        CLC_WARN_ONCE("sm_share: a launch made while clc was deciding on the same thread (in a "
                      "signal handler) cannot be confined: it gets its rule's on_unwrappable");
    }
    g->entry = e;
    /* A priority class's work is not done inside clc (clc_gate_setup): its flag alone does not
     * send the launch on. */
    if (o->action == CLC_ACTION_ALLOW && (o->flags & ~(uint32_t)CLC_FLAG_PRIORITY) == 0) return 0;
    return clc_gate_setup(g, o, l, 1);
}

/* No driver placed: on_error, said once (clc_start_driver), counted. */
__attribute__((noinline)) int clc_gate_unplaced(gate *g, const clc_launch *l) {
    clc_capture_undecided();
    return clc_gate_setup(g, &g_cfg.on_error, l, 0);
}

__attribute__((noinline)) int clc_gate_decide(gate *g, CUfunction f, CUcontext ctx,
                                              const clc_launch *l) {
    if (g->outcome) return clc_gate_setup(g, g->outcome, l, 0); /* counted by gate_enter */
    if (g->unplaced) return clc_gate_unplaced(g, l);
    clc_entry *e = g->entry; /* NULL: not in the cache when gate_enter looked */
    int first = 0;
    if (!e) {
        e = clc_first_sight(g, (uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)ctx, l);
        first = 1;
    }
    const clc_outcome *o;
    if (likely(e != NULL)) {
        /* At first sight the engine has just answered for this very launch (in the cached
         * mode the entry's answer holds for every launch, whichever thread made it). */
        if (e->shaped == 0)
            o = &e->fallback;
        else if (first && e->mode != CLC_MODE_CACHED)
            o = &g->scratch;
        else
            o = clc_outcome_for(e, l, &g->scratch); /* shape clauses, or the engine's hooks */
        count_launch(e, l->entry_point);
    } else {
        clc_capture_undecided(); /* no memory for an entry: nothing else would count it */
        o = &g_cfg.on_error;
    }
    g->entry = e;
    if (o->action == CLC_ACTION_ALLOW && o->flags == 0) return 0;
    return clc_gate_setup(g, o, l, 0);
}

/* A launch of a process in a priority class: a latency-critical one marks its GPU busy, a
 * best-effort one may wait, or (held_share) be confined: then the CLC_ACTION_CONFINE word it is
 * to run under is returned. Graph nodes made or changed are not launches. */
static uint64_t gate_priority(const clc_entry *e, const clc_launch *l) {
    uint32_t entry_point = l->entry_point;
    CUstream stream = l->stream;
    if ((entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) >= CLC_ENTRY_GRAPH_ADD_NODE) return 0;
    if (g_hot.priority == CLC_PRIORITY_LC) {
        clc_priority_lc_launch(e->device, stream, (entry_point & CLC_ENTRY_PTSZ) != 0);
        return 0;
    }
    return clc_priority_be_launch(e->device, (CUcontext)(uintptr_t)e->ctx, stream,
                                  (entry_point & CLC_ENTRY_PTSZ) != 0);
}

/* clc-run's --launch-skip and --launch-count: of the launches the policy records or times,
 * the process writes the records of the skip-th on (from 0), `count` of them (every one when
 * it is 0), as ncu's -s and -c do; every launch is counted all the same. The settings are read
 * at the first such launch (a plain read of the sealed copy: safe from any thread or handler). */
static _Atomic uint64_t g_recordable, g_window_skip, g_window_end;
static _Atomic int g_window_read;

static int in_launch_window(void) {
    if (!atomic_load_explicit(&g_window_read, memory_order_acquire)) {
        const char *skip = clc_setting("CLC_LAUNCH_SKIP"), *count = clc_setting("CLC_LAUNCH_COUNT");
        uint64_t s = skip ? strtoull(skip, NULL, 10) : 0, c = count ? strtoull(count, NULL, 10) : 0;
        atomic_store_explicit(&g_window_skip, s, memory_order_relaxed);
        atomic_store_explicit(&g_window_end, c ? s + c : 0, memory_order_relaxed);
        atomic_store_explicit(&g_window_read, 1, memory_order_release);
    }
    uint64_t skip = atomic_load_explicit(&g_window_skip, memory_order_relaxed);
    uint64_t end = atomic_load_explicit(&g_window_end, memory_order_relaxed);
    if (!skip && !end) return 1;
    uint64_t n = atomic_fetch_add_explicit(&g_recordable, 1, memory_order_relaxed);
    return n >= skip && (!end || n < end);
}

/* Everything a launch that is not a plain allow needs: kept out of the inlined fast path. */
__attribute__((noinline)) int clc_gate_setup(gate *g, const clc_outcome *o, const clc_launch *l,
                                             int reentrant) {
    clc_entry *e = g->entry;
    uint32_t entry_point = l->entry_point;
    if ((o->flags & CLC_FLAG_PRIORITY) && !reentrant && e && o->action != CLC_ACTION_DENY) {
        uint64_t held = gate_priority(e, l);
        if (held && o->action == CLC_ACTION_ALLOW) {
            /* held to a share: confined as an sm_share rule would (a launch that cannot be
             * confined runs as it was made, said once) */
            g->scratch = *o;
            g->scratch.action = CLC_ACTION_CONFINE;
            g->scratch.replacement = held;
            o = &g->scratch;
        } else if (o->action == CLC_ACTION_ALLOW && o->flags == CLC_FLAG_PRIORITY) {
            return 0;
        }
    }
    g->outcome = o;
    g->launch = l;
    g->reentrant = reentrant;
    g->refused = 0;
    g->timing = NULL;
    g->seq = atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed);
    g->record = (o->flags & CLC_FLAG_RECORD) != 0;
    int timed = (o->flags & CLC_FLAG_TIME) != 0;
    if ((g->record || timed) && o->action != CLC_ACTION_DENY && !in_launch_window())
        g->record = timed = 0;
    if (o->action == CLC_ACTION_DENY) {
        clc_count_denied_by(o->rule);
        if (e &&
            atomic_fetch_add_explicit(&e->denied, 1, memory_order_relaxed) < CLC_DENIED_RECORDED)
            g->record = 1;
    }
    g->t_ns = g->record ? clc_launch_time_ns() : 0;
    /* Timing takes the thread's event pool: not from inside clc's own work. */
    if (timed && o->action != CLC_ACTION_DENY && e && !reentrant &&
        (entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) < CLC_ENTRY_GRAPH_ADD_NODE) {
        t_in_clc = 1;
        clc_timing_begin(&g->timing, l->stream, (entry_point & CLC_ENTRY_PTSZ) != 0, e, g->seq);
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
    const clc_launch *l = g->launch;
    int denied = o->action == CLC_ACTION_DENY || g->refused;
    if (!denied) count_failure(g, result);
    int was = t_in_clc;
    t_in_clc = 1;
    if (g->timing) {
        if (result == CUDA_SUCCESS)
            clc_timing_end(g->timing, l->stream, (l->entry_point & CLC_ENTRY_PTSZ) != 0, e, g->seq);
        else
            clc_timing_end(g->timing, NULL, 0, NULL, 0);
    }
    clc_rec_launch *r;
    if (g->record && e && clc_capture_enabled() &&
        (r = clc_capture_begin(CLC_REC_LAUNCH, sizeof *r)) != NULL) {
        *r = (clc_rec_launch){
            .seq = g->seq,
            .t_ns = g->t_ns,
            .stream = (uint64_t)(uintptr_t)l->stream,
            .kernel_id = e->kernel_id,
            .entry = l->entry_point,
            .grid = {l->grid[0], l->grid[1], l->grid[2]},
            .block = {l->block[0], l->block[1], l->block[2]},
            .shared_mem = l->shmem,
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
    CLC_WARN_ONCE("more than %d kernel nodes and captured launches of wrapped kernels in one "
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
__attribute__((noinline)) static int replace_begin(gate *g, clc_replaced *r) {
    const clc_replacement *rep = (const clc_replacement *)(uintptr_t)g->outcome->replacement;
    const clc_launch *l = g->launch;
    int ptsz = (l->entry_point & CLC_ENTRY_PTSZ) != 0;
    int graph = rep && (rep->flags & CLC_REPLACE_SLOT) && stream_captured(l->stream, ptsz);
    CUresult e = rep ? clc_replace_begin(r, rep, l, graph) : CUDA_ERROR_INVALID_HANDLE;
    if (e == CUDA_SUCCESS && graph) {
        CUresult (*zero)(CUdeviceptr, unsigned char, size_t, CUstream) =
            ptsz ? g_drv.memset_d8_async_ptsz : g_drv.memset_d8_async;
        e = zero ? zero((CUdeviceptr)r->arg.slot, 0, CLC_SLOT_BYTES, l->stream)
                 : CUDA_ERROR_NOT_FOUND;
        if (e != CUDA_SUCCESS) clc_replace_end(r);
    }
    if (e == CUDA_SUCCESS) return 1;
    if (e == CLC_NO_GRAPH_SLOT) {
        clc_graph_slots_used_up();
        return 0;
    }
    CLC_WARN_ONCE("a wrapped kernel's launch could not be rewritten (CUresult %d): "
                  "it runs unwrapped",
                  (int)e);
    return 0;
}

/* The driver refused the wrapped kernel's launch (a cooperative grid sized for the original,
 * a resource limit the wrapper crosses): the original is launched instead, said once. */
__attribute__((noinline)) static void replaced_launch_failed(CUresult e) {
    CLC_WARN_ONCE("the driver refused a wrapped kernel's launch (CUresult %d): "
                  "the original kernel was launched instead",
                  (int)e);
}

/* The SMs a kernel's confined launches ran on, for its counts (clc_rec_kernel_stats). */
static inline void confined_on(const gate *g, unsigned sms) {
    if (g->entry && atomic_load_explicit(&g->entry->confined_sms, memory_order_relaxed) != sms)
        atomic_store_explicit(&g->entry->confined_sms, sms, memory_order_relaxed);
}

/* How an entry point's driver function is called for the launch `l` of kernel `f` on `stream`:
 * the program's launch, a rewritten one (replace path) or one moved to a green context's
 * stream (confined). */
typedef CUresult (*launch_call)(void *real, CUfunction f, const clc_launch *l, CUstream stream);

static CUresult call_kernel(void *real, CUfunction f, const clc_launch *l, CUstream stream) {
    return ((pfn_cuLaunchKernel)real)(f, l->grid[0], l->grid[1], l->grid[2], l->block[0],
                                      l->block[1], l->block[2], l->shmem, stream, l->params,
                                      l->extra);
}

static CUresult call_cooperative(void *real, CUfunction f, const clc_launch *l, CUstream stream) {
    return ((pfn_cuLaunchCooperativeKernel)real)(f, l->grid[0], l->grid[1], l->grid[2], l->block[0],
                                                 l->block[1], l->block[2], l->shmem, stream,
                                                 l->params);
}

/* cuLaunchKernelEx: the program's configuration (its attributes), with the launch's grid and
 * stream. */
static CUresult call_ex(void *real, CUfunction f, const clc_launch *l, CUstream stream) {
    CUlaunchConfig c = *l->config;
    c.gridDimX = l->grid[0], c.gridDimY = l->grid[1], c.gridDimZ = l->grid[2];
    c.hStream = stream;
    return ((pfn_cuLaunchKernelEx)real)(&c, f, l->params, l->extra);
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

/* Whether the launch's grid must be resident at once (a cooperative launch). */
static int launch_is_cooperative(const clc_launch *l) {
    if ((l->entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) == CLC_ENTRY_LAUNCH_COOPERATIVE) return 1;
    const CUlaunchConfig *c = l->config;
    const launch_attribute *a = c ? c->attrs : NULL;
    for (unsigned i = 0; a && i < c->numAttrs; i++)
        if (a[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && a[i].value.cooperative) return 1;
    return 0;
}

/* A wrapped kernel's launch: the wrapped kernel with its grid and arguments; the original when
 * it cannot be rewritten (replace_begin says why, once) or the driver refuses the rewrite. Out
 * of line: the rewritten arguments live in this frame, not in the hook's. A cooperative launch
 * without kernelParams has nothing to rewrite. */
__attribute__((noinline)) static CUresult launch_replaced(gate *g, void *real, launch_call call,
                                                          CUfunction f) {
    const clc_launch *l = g->launch;
    clc_replaced r;
    int cooperative = (l->entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) == CLC_ENTRY_LAUNCH_COOPERATIVE;
    if ((cooperative && !l->params) || !replace_begin(g, &r)) return call(real, f, l, l->stream);
    clc_launch w = *l;
    w.grid[0] = r.grid[0], w.grid[1] = r.grid[1], w.grid[2] = r.grid[2];
    w.params = r.params;
    w.extra = r.extra;
    CUresult res = call(real, r.f, &w, l->stream);
    clc_replace_end(&r);
    if (unlikely(res != CUDA_SUCCESS)) {
        replaced_launch_failed(res);
        res = call(real, f, l, l->stream);
    }
    return res;
}

/* A confined launch: on the green stream, in the program's stream order. One that cannot be
 * confined, or that the driver refuses there, gets its rule's on_unwrappable: launched as the
 * program made it, or refused (counted and recorded as denied by the rule; a launch the driver
 * refused keeps the driver's error). A launch captured into a conditional node's body is not
 * confined: the driver requires the body's kernels to be in the conditional node's context.
 * The partition's stream is held under a lock from begin to end: inside clc's own work for this
 * thread, so that a signal handler's launch there does not wait for it. */
__attribute__((noinline)) static CUresult launch_confined(gate *g, void *real, launch_call call,
                                                          CUfunction f) {
    const clc_launch *l = g->launch;
    CUstream stream = l->stream;
    clc_green_launch gl;
    int was = t_in_clc;
    int ptsz = (l->entry_point & CLC_ENTRY_PTSZ) != 0;
    t_in_clc = 1;
    if (clc_green_capturing_into_body(stream, ptsz)) {
        t_in_clc = was;
        if (clc_green_unconfined(g->outcome->replacement, CUDA_ERROR_NOT_SUPPORTED,
                                 CLC_UNCONFINED_CONDITIONAL))
            return clc_gate_refuse(g);
        return call(real, f, l, stream);
    }
    CUresult why = clc_green_begin(&gl, g->outcome->replacement, stream, ptsz);
    if (why != CUDA_SUCCESS) {
        t_in_clc = was;
        if (clc_green_unconfined(g->outcome->replacement, why, CLC_UNCONFINED_NO_PARTITION))
            return clc_gate_refuse(g);
        return call(real, f, l, stream);
    }
    CUresult res = call(real, f, l, gl.stream);
    clc_green_end(&gl, res);
    t_in_clc = was;
    if (res == CUDA_SUCCESS) {
        confined_on(g, gl.sms);
    } else if (gl.entry) { /* not when it ran as it was made (a program context) */
        int reason = CLC_UNCONFINED_REFUSED;
        if (launch_is_cooperative(l) && res == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) {
            int per_sm = 0;
            if (g_drv.occupancy)
                g_drv.occupancy(&per_sm, f, (int)(l->block[0] * l->block[1] * l->block[2]),
                                l->shmem);
            clc_green_cooperative_too_large(l->grid[0] * l->grid[1] * l->grid[2], gl.sms,
                                            per_sm > 0 ? (unsigned)per_sm : 0);
            reason = CLC_UNCONFINED_COOPERATIVE;
        }
        if (clc_green_unconfined(g->outcome->replacement, res, reason))
            clc_gate_refuse(g);
        else
            res = call(real, f, l, stream);
    }
    return res;
}

/* A launch the gate did not let through as it was made: denied, wrapped or confined (any other
 * is made as `call` makes it). */
__attribute__((noinline)) static CUresult launch_gated(gate *g, void *real, launch_call call,
                                                       CUfunction f) {
    switch (g->outcome->action) {
    case CLC_ACTION_DENY: return g->outcome->error;
    case CLC_ACTION_REPLACE: return launch_replaced(g, real, call, f);
    case CLC_ACTION_CONFINE: return launch_confined(g, real, call, f);
    default: return call(real, f, g->launch, g->launch->stream);
    }
}

/* The launch entry points. The fast path (gate_enter's plain allow) calls the driver with the
 * program's own arguments (`original`); any other launch goes out of line to name_gated, which
 * builds the launch's clc_launch (`launch`) for the rest of the gate. A launch let through as
 * it was made (recorded, timed, or a plain allow after all) is made with `original` too; the
 * rest (denied, wrapped, confined) goes through launch_gated with the entry point's `call`.
 * `precheck` runs first (a NULL cuLaunchKernelEx configuration goes to the driver as it is). */
#define CLC_UNPAREN(...) __VA_ARGS__
#define CLC_LAUNCH_HOOK(name, entry, params_, precheck, launch, call, original)                 \
    __attribute__((noinline)) static CUresult name##_gated(gate *g, pfn_##name real,             \
                                                           CUcontext ctx, CLC_UNPAREN params_) { \
        const clc_launch l = launch(entry);                                                      \
        int gated = unlikely(t_in_clc) ? clc_gate_reentrant(g, f, NULL, &l)                      \
                                       : clc_gate_decide(g, f, ctx, &l);                         \
        if (!gated) return count_failure(g, real original);                                      \
        if (g->outcome->action == CLC_ACTION_ALLOW) /* recorded or timed: as the program made it */ \
            return clc_gate_exit(g, real original);                                              \
        return clc_gate_exit(g, launch_gated(g, (void *)real, call, f));                         \
    }                                                                                            \
    CLC_EXPORT CUresult name params_ {                                                           \
        pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        precheck;                                                                                \
        gate g;                                                                                  \
        CUcontext ctx = NULL;                                                                    \
        if (likely(!t_in_clc) && likely(!gate_enter(&g, f, &ctx, entry)))                        \
            return count_failure(&g, real original);                                             \
        return name##_gated(&g, real, ctx, CLC_UNPAREN original);                                \
    }
#define CLC_KERNEL_LAUNCH(entry)                                                                 \
    {.entry_point = (entry), .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shmem = shmem,        \
     .stream = stream, .params = params, .extra = extra}
#define CLC_COOP_LAUNCH(entry)                                                                   \
    {.entry_point = (entry), .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shmem = shmem,        \
     .stream = stream, .params = params}
#define CLC_EX_LAUNCH(entry)                                                                     \
    {.entry_point = (entry),                                                                     \
     .grid = {config->gridDimX, config->gridDimY, config->gridDimZ},                             \
     .block = {config->blockDimX, config->blockDimY, config->blockDimZ},                         \
     .shmem = config->sharedMemBytes,                                                            \
     .stream = config->hStream,                                                                  \
     .params = params,                                                                           \
     .extra = extra,                                                                             \
     .config = config}
#define CLC_EX_PRECHECK                                                                          \
    if (unlikely(!config)) return real(config, f, params, extra)

CLC_LAUNCH_HOOK(cuLaunchKernel, CLC_ENTRY_LAUNCH, CLC_LAUNCH_PARAMS, (void)0, CLC_KERNEL_LAUNCH,
                call_kernel, (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra))
CLC_LAUNCH_HOOK(cuLaunchKernel_ptsz, CLC_ENTRY_LAUNCH | CLC_ENTRY_PTSZ, CLC_LAUNCH_PARAMS, (void)0,
                CLC_KERNEL_LAUNCH, call_kernel,
                (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra))
CLC_LAUNCH_HOOK(cuLaunchCooperativeKernel, CLC_ENTRY_LAUNCH_COOPERATIVE, CLC_COOP_PARAMS, (void)0,
                CLC_COOP_LAUNCH, call_cooperative,
                (f, gx, gy, gz, bx, by, bz, shmem, stream, params))
CLC_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, CLC_ENTRY_LAUNCH_COOPERATIVE | CLC_ENTRY_PTSZ,
                CLC_COOP_PARAMS, (void)0, CLC_COOP_LAUNCH, call_cooperative,
                (f, gx, gy, gz, bx, by, bz, shmem, stream, params))
CLC_LAUNCH_HOOK(cuLaunchKernelEx, CLC_ENTRY_LAUNCH_EX, CLC_LAUNCH_EX_PARAMS, CLC_EX_PRECHECK,
                CLC_EX_LAUNCH, call_ex, (config, f, params, extra))
CLC_LAUNCH_HOOK(cuLaunchKernelEx_ptsz, CLC_ENTRY_LAUNCH_EX | CLC_ENTRY_PTSZ, CLC_LAUNCH_EX_PARAMS,
                CLC_EX_PRECHECK, CLC_EX_LAUNCH, call_ex, (config, f, params, extra))

/* A multi-device call's launch belongs to its stream's context, which one thread launching on
 * every device has current for one of them at most: that context is made current around the
 * launch's gate, so that the launch is decided, said and timed (its events made and recorded)
 * in its own context. Returns the context pushed; NULL when none was needed or none could be. */
static CUcontext push_stream_ctx(CUstream stream) {
    CUcontext own = NULL, current = NULL;
    if (CLC_DEFAULT_STREAM(stream) || !g_drv.stream_get_ctx || !g_drv.ctx_push || !g_drv.ctx_pop)
        return NULL;
    if (g_drv.stream_get_ctx(stream, &own) != CUDA_SUCCESS || !own) return NULL;
    if (g_drv.ctx_get_current(&current) == CUDA_SUCCESS && current == own) return NULL;
    return g_drv.ctx_push(own) == CUDA_SUCCESS ? own : NULL;
}

static void pop_stream_ctx(CUcontext pushed) {
    CUcontext popped;
    if (pushed) g_drv.ctx_pop(&popped);
}

/* Several devices' cooperative launches at once: each decided as a cooperative launch in its
 * stream's context; when one is denied, none is launched (the call is all or nothing, as the
 * driver's is). Wrapped kernels run unwrapped here (said once): their replacement is made for
 * one context. */
CLC_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(clc_launch_params *list, unsigned int n,
                                                         unsigned int flags) {
    pfn_cuLaunchCooperativeKernelMultiDevice real =
        (pfn_cuLaunchCooperativeKernelMultiDevice)clc_real(
            CLC_SYM_cuLaunchCooperativeKernelMultiDevice);
    if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;
    if (!list || n == 0) return real(list, n, flags);
    if (!clc_driver_ready()) clc_driver_load(); /* for push_stream_ctx, before the first gate */
    gate small[8], *g = n <= 8 ? small : malloc(n * sizeof *g);
    clc_launch small_launches[8], *l = n <= 8 ? small_launches : malloc(n * sizeof *l);
    unsigned char small_gated[8], *gated = n <= 8 ? small_gated : malloc(n);
    if (!g || !l || !gated) {
        if (g != small) free(g);
        if (l != small_launches) free(l);
        if (gated != small_gated) free(gated);
        return g_cfg.on_error.action == CLC_ACTION_DENY ? g_cfg.on_error.error
                                                        : real(list, n, flags);
    }
    CUresult refused = CUDA_SUCCESS;
    clc_timing_events_only(1);
    for (unsigned i = 0; i < n; i++) {
        const clc_launch_params *p = &list[i];
        l[i] = (clc_launch){.entry_point = CLC_ENTRY_LAUNCH_COOPERATIVE,
                            .grid = {p->gridDimX, p->gridDimY, p->gridDimZ},
                            .block = {p->blockDimX, p->blockDimY, p->blockDimZ},
                            .shmem = p->sharedMemBytes,
                            .stream = p->hStream,
                            .params = p->kernelParams};
        CUcontext pushed = push_stream_ctx(p->hStream);
        gated[i] = (unsigned char)(t_in_clc ? clc_gate_reentrant(&g[i], p->function, NULL, &l[i])
                                            : gate_launch(&g[i], p->function, NULL, &l[i]));
        pop_stream_ctx(pushed);
        if (!gated[i]) continue;
        if (g[i].outcome->action == CLC_ACTION_DENY && refused == CUDA_SUCCESS)
            refused = g[i].outcome->error;
        if (g[i].outcome->action == CLC_ACTION_REPLACE) {
            CLC_WARN_ONCE("a wrapped kernel launched with "
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
        if (!gated[i]) {
            count_failure(&g[i], r);
            continue;
        }
        CUcontext pushed = push_stream_ctx(list[i].hStream);
        clc_gate_exit(&g[i], g[i].outcome->action == CLC_ACTION_DENY ? g[i].outcome->error
                             : g[i].refused                          ? CUDA_ERROR_NOT_PERMITTED
                                                                     : r);
        pop_stream_ctx(pushed);
    }
    if (g != small) free(g);
    if (l != small_launches) free(l);
    if (gated != small_gated) free(gated);
    return r;
}
