/* SPDX-License-Identifier: Apache-2.0
 *
 * decide.c: asking for decisions. A kernel's first launch in a context (a miss of the decision
 * cache) names the kernel, reads its parameter layout and asks clc-run (decider.c) or the
 * program's engine (bridge_loader.c), with no lock held, then publishes the answer into the
 * cache. An entry whose outcome depends on the launch is asked about again per shape or at each
 * launch.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "deciding.h"

static _Atomic uint32_t g_next_id;

static inline int in_range(const clc_range *r, uint64_t v) { return v >= r->lo && v <= r->hi; }

/* The largest parameter block a kernel may have (CUDA 12.1+: 32764 bytes), and the most
 * parameters asked of the driver. */
#define ARGS_MAX 32768u
#define PARAMS_MAX 32768u

/* A kernel's parameter layout from the driver (cudart hands CUkernels, everything else
 * CUfunctions; each getter refuses the other), malloc'd; NULL and *n = 0 when unknown. */
static clc_param_info *query_layout(uint64_t handle, uint32_t *n, uint32_t *end) {
    *n = *end = 0;
    CUresult (*getters[2])(void *, size_t, size_t *, size_t *) = {
        (CUresult (*)(void *, size_t, size_t *, size_t *))g_drv.kernel_get_param_info,
        (CUresult (*)(void *, size_t, size_t *, size_t *))g_drv.func_get_param_info};
    for (int g = 0; g < 2; g++) {
        if (!getters[g]) continue;
        size_t offset, size;
        uint32_t count = 0, cap = 0;
        clc_param_info *layout = NULL;
        while (count < PARAMS_MAX &&
               getters[g]((void *)(uintptr_t)handle, count, &offset, &size) == CUDA_SUCCESS) {
            if (offset + size > ARGS_MAX) break; /* not a layout a launch can have */
            if (count == cap) {
                cap = cap ? cap * 2 : 16;
                clc_param_info *grown = realloc(layout, cap * sizeof *layout);
                if (!grown) break;
                layout = grown;
            }
            layout[count++] = (clc_param_info){(uint32_t)offset, (uint32_t)size};
            if (offset + size > *end) *end = (uint32_t)(offset + size);
        }
        if (count) {
            *n = count;
            return layout;
        }
        free(layout);
        *end = 0;
    }
    return NULL;
}

/* Copies launch l's arguments into dst (room for k's args_end bytes), laid out as kernel k's
 * parameter block; *size gets the bytes copied. Returns CLC_ARGS_*. */
static uint32_t pack_args(unsigned char *dst, const clc_kernel *k, const clc_launch *l,
                          uint32_t *size) {
    const clc_param_info *layout = k->layout;
    uint32_t n = k->n_params, end = k->args_end;
    void **params = l->params, **extra = l->extra;
    *size = 0;
    if (params) {
        if (!layout) return CLC_ARGS_NO_LAYOUT;
        memset(dst, 0, end);
        for (uint32_t i = 0; i < n; i++) {
            if (!params[i]) return CLC_ARGS_NULL_ENTRY;
            memcpy(dst + layout[i].offset, params[i], layout[i].size);
        }
        *size = end;
        return CLC_ARGS_OK;
    }
    if (!extra) return CLC_ARGS_NONE;
    if (!layout) return CLC_ARGS_NO_LAYOUT;
    void *buffer;
    size_t have;
    if (clc_parse_extra(extra, &buffer, &have) != 0 || !buffer) return CLC_ARGS_BAD_EXTRA;
    *size = (uint32_t)(have < end ? have : end);
    memcpy(dst, buffer, *size);
    return CLC_ARGS_OK;
}

/* A query and the launch's arguments after it, as the engine reads them. Small blocks live in
 * the caller's frame (the out-of-line slow path's), larger ones on the heap. */
typedef struct {
    clc_kernel_query *q;
    void *heap;
    union {
        clc_kernel_query q;
        unsigned char bytes[sizeof(clc_kernel_query) + 512];
    } small;
} query_buf;

/* The question about kernel k's launch l, the kernel told as `name`. */
static clc_kernel_query *fill_query(query_buf *b, const clc_kernel *k, const clc_launch *l,
                                    const char *name) {
    b->heap = NULL;
    clc_kernel_query *q = &b->small.q;
    int no_memory = 0;
    if (k->args_end > sizeof b->small.bytes - sizeof *q) {
        q = b->heap = malloc(sizeof *q + k->args_end);
        if (!q) {
            q = &b->small.q;
            no_memory = 1;
        }
    }
    *q = (clc_kernel_query){.handle = k->handle,
                            .ctx = k->ctx,
                            .device = k->device,
                            .entry = l->entry_point,
                            .kernel_id = k->kernel_id,
                            .name = name,
                            .grid = {l->grid[0], l->grid[1], l->grid[2]},
                            .block = {l->block[0], l->block[1], l->block[2]},
                            .shared_mem = l->shmem,
                            .tid = clc_tid(),
                            .stream = (uint64_t)(uintptr_t)l->stream,
                            .params = l->params,
                            .extra = l->extra,
                            .layout = k->layout,
                            .n_params = k->n_params};
    if (no_memory)
        q->args_status = CLC_ARGS_NO_MEMORY;
    else
        q->args_status = pack_args((unsigned char *)(q + 1), k, l, &q->args_size);
    return b->q = q;
}

static void free_query(query_buf *b) { free(b->heap); }

/* CLC_FLAG_PRIORITY is the shim's alone: on every outcome of a process in a priority class
 * (set once at start, for the life of the process image), so that the gate's fast path sends
 * its launches on with its one test of the outcome; on no other, whatever the engine said. */
static void mark_priority(clc_outcome *o) {
    o->flags = (o->flags & ~(uint32_t)CLC_FLAG_PRIORITY) | (g_hot.priority ? CLC_FLAG_PRIORITY : 0);
}

/* Asks the engine about one launch; the policy's on_error when it cannot answer. */
static void ask(clc_entry *e, const clc_launch *l, clc_outcome *out) {
    query_buf b;
    const clc_kernel k = {.handle = e->handle,
                          .ctx = e->ctx,
                          .owner = e->owner,
                          .kernel_id = e->kernel_id,
                          .device = e->device,
                          .layout = e->layout,
                          .n_params = e->n_params,
                          .args_end = e->args_end};
    /* The engine knows the kernel by its id since its first sight: not named again. */
    clc_kernel_query *q = fill_query(&b, &k, l, "");
    t_in_clc = 1;
    if (clc_bridge_launch(q, out) != 0) *out = g_cfg.on_error;
    t_in_clc = 0;
    mark_priority(out);
    free_query(&b);
}

const clc_outcome *clc_outcome_for(clc_entry *e, const clc_launch *l, clc_outcome *scratch) {
    if (e->mode == CLC_MODE_CACHED) {
        uint64_t blocks = (uint64_t)l->grid[0] * l->grid[1] * l->grid[2];
        uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
        for (uint32_t i = 0; i < e->n_clauses; i++) {
            const clc_clause *c = &e->clauses[i];
            if (in_range(&c->grid_blocks, blocks) && in_range(&c->block_threads, threads) &&
                in_range(&c->shared_mem, l->shmem))
                return &c->outcome;
        }
        return &e->fallback;
    }
    if (e->mode == CLC_MODE_PER_SHAPE) {
        const clc_outcome *o = clc_find_shape(e, l);
        if (o) return o;
        ask(e, l, scratch);
        o = clc_add_shape(e, l, scratch);
        return o ? o : scratch;
    }
    ask(e, l, scratch);
    return scratch;
}

static int ctx_device(uint64_t ctx) {
    CUdevice dev = -1;
    if (!g_drv.ctx_get_device) return -1;
    CUcontext cur = NULL;
    if (g_drv.ctx_get_current) g_drv.ctx_get_current(&cur);
    if ((uint64_t)(uintptr_t)cur == ctx || !g_drv.ctx_set_current) {
        if (g_drv.ctx_get_device(&dev) != 0) dev = -1;
        return dev;
    }
    /* A graph node may name another context: ask it, then put the caller's back. */
    if (g_drv.ctx_set_current((CUcontext)(uintptr_t)ctx) == 0) {
        if (g_drv.ctx_get_device(&dev) != 0) dev = -1;
        g_drv.ctx_set_current(cur);
    }
    return dev;
}

/* The library or module the kernel came from, as the driver says. */
static uint64_t kernel_owner(uint64_t handle) {
    CUlibrary lib = NULL;
    CUmodule mod = NULL;
    if (g_drv.kernel_get_library &&
        g_drv.kernel_get_library(&lib, (CUkernel)(uintptr_t)handle) == CUDA_SUCCESS && lib)
        return (uint64_t)(uintptr_t)lib;
    if (g_drv.func_get_module &&
        g_drv.func_get_module(&mod, (CUfunction)(uintptr_t)handle) == CUDA_SUCCESS && mod)
        return (uint64_t)(uintptr_t)mod;
    return 0;
}

/* Asks for q's decision (into *d, zeroed): clc-run first, when it decides; the program's
 * engine for a wrap, and when clc-run cannot be asked (gone while a descendant runs on,
 * another user's process, ...). CLC_DECIDE_OK when *d holds the answer. */
static int ask_decision(const clc_kernel_query *q, clc_decision *d) {
    int substitute = 0;
    int asked =
        clc_decider_configured() ? clc_decider_decide(q, d, &substitute) : CLC_DECIDE_ENGINE;
    if (asked != CLC_DECIDE_OK) {
        clc_decision without_engine = *d;
        memset(d, 0, sizeof *d);
        if (clc_bridge_decide(q, d) == 0) {
            asked = CLC_DECIDE_OK;
        } else if (substitute) {
            /* No engine to build a wrapped kernel here: the rest of the policy still holds. */
            CLC_WARN_ONCE("wrapped kernels cannot be built in this process: the "
                          "kernels of wrap rules get their on_unwrappable");
            *d = without_engine;
            asked = CLC_DECIDE_OK;
        }
    }
    return asked;
}

/* A confine in a program context (scope: program) is a plain launch: the context already holds
 * the kernel to the process's partition, and a kernel rule's other share is not applied inside
 * it (said once). Returns whether the kernel may run (its outcomes are not all denies). */
static int launched_as_is(clc_decision *d, uint64_t program_word) {
    int runs = 0;
    for (uint32_t i = 0; i <= d->n_clauses; i++) {
        clc_outcome *o = i < d->n_clauses ? &d->clauses[i].outcome : &d->fallback;
        if (o->action == CLC_ACTION_CONFINE) {
            if ((o->replacement & ~(uint64_t)CLC_CONFINE_DENY) != program_word)
                CLC_WARN_ONCE(
                    "sm_share: a rule confines a kernel of a process confined program-wide "
                    "(scope: program) to another share: it runs on the process's partition");
            o->action = CLC_ACTION_ALLOW;
            o->replacement = 0;
        }
        if (o->action != CLC_ACTION_DENY) runs = 1;
    }
    return runs;
}

/* Kernel `handle` in context `ctx` as its first sight finds it, from the driver: its name,
 * device, library or module and parameter layout; a new kernel id. */
static void first_sight(clc_kernel *k, uint64_t handle, uint64_t ctx) {
    *k = (clc_kernel){.handle = handle, .ctx = ctx};
    k->epoch = clc_cache_epoch(); /* before the kernel is named: see clc_cache_insert */
    k->name = clc_kernel_name(handle);
    k->device = ctx_device(ctx);
    k->owner = kernel_owner(handle);
    k->layout = query_layout(handle, &k->n_params, &k->args_end);
    k->kernel_id = atomic_fetch_add(&g_next_id, 1);
}

/* The slow path, once per (kernel, context): name the kernel, ask the engine, publish (the
 * capture gets the new kernel's record). */
clc_entry *clc_cache_decide(uint64_t handle, uint64_t ctx, const clc_launch *l,
                            clc_outcome *answer) {
    clc_identity_follow();
    clc_kernel k;
    first_sight(&k, handle, ctx);
    clc_decision d;
    memset(&d, 0, sizeof d);
    query_buf b;
    clc_kernel_query *q = fill_query(&b, &k, l, k.name && *k.name ? k.name : "<unnamed>");
    /* A kernel the driver cannot name (its module unloaded under it, the driver shutting down at
     * exit, a child forked after the driver started) cannot be matched by any rule: clc could
     * not decide it. */
    int asked = k.name ? ask_decision(q, &d) : CLC_DECIDE_FAILED;
    if (!k.name)
        CLC_WARN_ONCE(
            "the driver could not name a launched kernel (its module unloaded, the driver "
            "shutting down, or a process forked after the driver started, where the driver "
            "runs nothing): its launches get on_error=%s",
            g_cfg.on_error.action == CLC_ACTION_DENY ? "deny" : "allow");
    if (asked != CLC_DECIDE_OK || d.n_clauses > CLC_MAX_CLAUSES || d.mode > CLC_MODE_EVERY_LAUNCH) {
        memset(&d, 0, sizeof d);
        d.fallback = g_cfg.on_error;
    }
    free_query(&b);
    /* In a program context of scope: program the context confines every kernel: the rule's
     * own outcome (the same partition) is a plain launch there, with nothing per launch. */
    uint64_t program_word = 0;
    unsigned program_sms = clc_green_program_sms((CUcontext)(uintptr_t)ctx, &program_word);
    if (program_sms && !launched_as_is(&d, program_word)) program_sms = 0; /* never runs */
    uint64_t scope_word;
    if (!program_sms && d.fallback.action == CLC_ACTION_CONFINE && clc_policy_program_wide() &&
        clc_program_scope(k.device, &scope_word))
        CLC_WARN_ONCE(
            "sm_share (scope: program): a kernel of this process launched in a context clc "
            "did not hand it (the CUDA runtime's own, which libcudart takes through a "
            "private path of the driver's, or one reached past clc's lookups) is confined "
            "one launch at a time, where the driver allows it");
    for (uint32_t i = 0; i < d.n_clauses; i++) mark_priority(&d.clauses[i].outcome);
    mark_priority(&d.fallback);
    *answer = d.fallback;
    clc_entry *e = clc_cache_insert(&k, &d, l, clc_capture_kernel);
    if (e && program_sms)
        atomic_store_explicit(&e->confined_sms, program_sms, memory_order_relaxed);
    return e;
}

/* A process that changed its user or groups (setuid, setgroups, ...) is decided anew: the rules
 * that match who it is may answer otherwise now. Its decisions are forgotten, and the next
 * question to clc-run goes over a new connection, whose peer credentials are the new ones. */
void clc_identity_follow(void) {
    if (!clc_identity_changed()) return;
    unsigned n = clc_cache_forget_all(clc_bridge_module);
    clc_debug("the process changed its user or groups: %u decisions forgotten", n);
}

/* Whether this process is confined program-wide on `device` (a rule with scope: program), with
 * the rule's outcome word: asked once per device of clc-run, else of the program's engine, as
 * a question about the program (CLC_ASK_PROGRAM). */
int clc_program_scope(int device, uint64_t *word) {
    /* Per device: 0 not asked yet; 1 not confined; else the word with bit 63 set. */
    static _Atomic uint64_t answers[64];
    if (device < 0 || device >= 64) return 0;
    uint64_t a = atomic_load(&answers[device]);
    if (!a) {
        clc_decision d;
        memset(&d, 0, sizeof d);
        clc_launch l = {.entry_point = CLC_ENTRY_LAUNCH};
        /* about the program: no kernel, and an empty name */
        const clc_kernel none = {.kernel_id = CLC_KERNEL_UNCACHED, .device = device};
        query_buf b;
        clc_kernel_query *q = fill_query(&b, &none, &l, "");
        q->question = CLC_ASK_PROGRAM;
        int asked = ask_decision(q, &d);
        free_query(&b);
        if (asked != CLC_DECIDE_OK)
            CLC_WARN_ONCE("sm_share: cannot ask whether the process is confined "
                          "program-wide (scope: program): it is not; the rule's "
                          "kernels are confined one launch at a time");
        a = asked == CLC_DECIDE_OK && d.fallback.action == CLC_ACTION_CONFINE
                ? (d.fallback.replacement & ~(uint64_t)CLC_CONFINE_DENY) | 1ull << 63
                : 1;
        atomic_store(&answers[device], a);
    }
    if (a == 1) return 0;
    *word = a & ~(1ull << 63);
    return 1;
}
