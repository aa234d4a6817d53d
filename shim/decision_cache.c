/* SPDX-License-Identifier: Apache-2.0
 *
 * decision_cache.c: one entry per (kernel handle, context), found without a lock.
 *
 * Readers probe an open-addressing table (clc_cache_find, inline in shim.h) and trust an entry
 * once its `ready` flag is set (acquire); writers fill every field first and set `ready` last
 * (release). Inserting takes a
 * mutex, but only on the slow path of a kernel's first launch, and never while Python runs: a
 * thread holding the GIL may be waiting to launch, so the engine is asked with no lock held.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "shim.h"

#define CACHE_MAX_FILL (CLC_CACHE_SIZE / 4 * 3)

clc_hot g_hot;
static pthread_mutex_t g_insert_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_count;

#define SHAPES_MAX 64

typedef struct {
    uint32_t grid[3], block[3], shmem;
    clc_outcome outcome;
} clc_shape;

struct clc_shape_cache {
    _Atomic uint32_t count; /* slots [0, count) are written */
    clc_shape slots[SHAPES_MAX];
};

static inline int in_range(const clc_range *r, uint64_t v) { return v >= r->lo && v <= r->hi; }

static void fill_query(clc_kernel_query *q, const clc_entry *e, uint64_t handle, uint64_t ctx,
                       int device, const clc_launch_info *l, const char *name) {
    *q = (clc_kernel_query){.handle = handle, .ctx = ctx, .device = device,
                            .entry = l->entry_point, .kernel_id = e ? e->kernel_id : 0,
                            .name = name, .grid = {l->grid[0], l->grid[1], l->grid[2]},
                            .block = {l->block[0], l->block[1], l->block[2]},
                            .shared_mem = l->shmem, .tid = clc_tid(),
                            .stream = (uint64_t)(uintptr_t)l->stream, .params = l->params,
                            .extra = l->extra};
}

/* Asks the engine about one launch; the policy's on_error when it cannot answer. */
static void ask(clc_entry *e, const clc_launch_info *l, clc_outcome *out) {
    clc_kernel_query q;
    fill_query(&q, e, e->handle, e->ctx, e->device, l, "");
    t_in_clc = 1;
    if (clc_bridge_launch(&q, out) != 0) *out = g_cfg.on_error;
    t_in_clc = 0;
}

static int same_shape(const clc_shape *s, const clc_launch_info *l) {
    return s->shmem == l->shmem && s->grid[0] == l->grid[0] && s->grid[1] == l->grid[1] &&
           s->grid[2] == l->grid[2] && s->block[0] == l->block[0] &&
           s->block[1] == l->block[1] && s->block[2] == l->block[2];
}

static const clc_outcome *find_shape(clc_entry *e, const clc_launch_info *l) {
    struct clc_shape_cache *c = atomic_load_explicit(&e->shapes, memory_order_acquire);
    uint32_t n = c ? atomic_load_explicit(&c->count, memory_order_acquire) : 0;
    for (uint32_t i = 0; i < n; i++)
        if (same_shape(&c->slots[i], l)) return &c->slots[i].outcome;
    return NULL;
}

/* Keeps the engine's answer for this shape; NULL when the kernel has too many shapes. */
static const clc_outcome *add_shape(clc_entry *e, const clc_launch_info *l,
                                    const clc_outcome *o) {
    const clc_outcome *kept = NULL;
    pthread_mutex_lock(&g_insert_lock);
    struct clc_shape_cache *c = atomic_load_explicit(&e->shapes, memory_order_relaxed);
    if (!c && (c = calloc(1, sizeof *c)) != NULL)
        atomic_store_explicit(&e->shapes, c, memory_order_release);
    if ((kept = find_shape(e, l)) == NULL && c) {
        uint32_t n = atomic_load_explicit(&c->count, memory_order_relaxed);
        if (n < SHAPES_MAX) {
            clc_shape *s = &c->slots[n];
            memcpy(s->grid, l->grid, sizeof s->grid);
            memcpy(s->block, l->block, sizeof s->block);
            s->shmem = l->shmem;
            s->outcome = *o;
            atomic_store_explicit(&c->count, n + 1, memory_order_release);
            kept = &s->outcome;
        } else {
            static int said;
            if (!said++)
                clc_log(CLC_MSG_WARNING,
                        "a kernel has more than %d launch shapes: its per_shape hook is asked "
                        "at every launch from here on",
                        SHAPES_MAX);
        }
    }
    pthread_mutex_unlock(&g_insert_lock);
    return kept;
}

const clc_outcome *clc_outcome_for(clc_entry *e, const clc_launch_info *l, clc_outcome *scratch) {
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
        const clc_outcome *o = find_shape(e, l);
        if (o) return o;
        ask(e, l, scratch);
        o = add_shape(e, l, scratch);
        return o ? o : scratch;
    }
    ask(e, l, scratch);
    return scratch;
}

const char *clc_kernel_name(uint64_t handle) {
    const char *name = NULL;
    /* cudart hands CUkernels, everything else CUfunctions; each getter refuses the other. */
    if (g_drv.kernel_get_name && g_drv.kernel_get_name(&name, (CUkernel)(uintptr_t)handle) == 0 &&
        name)
        return name;
    name = NULL;
    if (g_drv.func_get_name && g_drv.func_get_name(&name, (CUfunction)(uintptr_t)handle) == 0 &&
        name)
        return name;
    return NULL;
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

static clc_entry *table(void) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (t) return t;
    /* Anonymous pages are zero and touched only as entries land in them. */
    void *p = mmap(NULL, sizeof(clc_entry) * CLC_CACHE_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    atomic_store_explicit(&g_hot.table, (clc_entry *)p, memory_order_release);
    return p;
}

/* The slow path, once per (kernel, context): name the kernel, ask the engine, publish. */
clc_entry *clc_cache_decide(uint64_t handle, uint64_t ctx, const clc_launch_info *l,
                            clc_outcome *answer) {
    clc_ensure_exit_handler();
    const char *name = clc_kernel_name(handle);
    int device = ctx_device(ctx);
    clc_decision d;
    memset(&d, 0, sizeof d);
    clc_kernel_query q;
    fill_query(&q, NULL, handle, ctx, device, l, name ? name : "<unnamed>");
    if (clc_bridge_decide(&q, &d) != 0 || d.n_clauses > CLC_MAX_CLAUSES ||
        d.mode > CLC_MODE_EVERY_LAUNCH) {
        memset(&d, 0, sizeof d);
        d.fallback = g_cfg.on_error;
    }
    *answer = d.fallback;

    pthread_mutex_lock(&g_insert_lock);
    clc_entry *e = clc_cache_find(handle, ctx);
    clc_entry *t = e ? NULL : table();
    if (!e && t && g_count < CACHE_MAX_FILL) {
        uint32_t i = clc_slot_of(handle, ctx);
        while (atomic_load_explicit(&t[i].ready, memory_order_relaxed))
            i = (i + 1) & (CLC_CACHE_SIZE - 1);
        e = &t[i];
        e->kernel_id = g_count++;
        e->handle = handle;
        e->ctx = ctx;
        e->device = device;
        e->fallback = d.fallback;
        e->n_clauses = 0;
        e->mode = (uint16_t)d.mode;
        if (d.n_clauses && d.mode == CLC_MODE_CACHED) {
            e->clauses = malloc(sizeof(clc_clause) * d.n_clauses);
            if (e->clauses) {
                memcpy(e->clauses, d.clauses, sizeof(clc_clause) * d.n_clauses);
                e->n_clauses = (uint16_t)d.n_clauses;
            }
        }
        atomic_store_explicit(&e->ready, 1, memory_order_release);
        clc_capture_kernel(e, name ? name : "<unnamed>");
    } else if (!e) {
        static int reported;
        if (!reported++)
            clc_log(CLC_MSG_ERROR, "decision table full (%u kernels): new kernels get on_error",
                    g_count);
    }
    pthread_mutex_unlock(&g_insert_lock);
    /* The engine answered for this launch: in mode PER_SHAPE that is this shape's answer. */
    if (e && e->mode == CLC_MODE_PER_SHAPE) add_shape(e, l, &d.fallback);
    return e;
}

void clc_cache_each(clc_entry_fn fn, void *arg) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (!t) return;
    for (uint32_t i = 0; i < CLC_CACHE_SIZE; i++)
        if (atomic_load_explicit(&t[i].ready, memory_order_acquire)) fn(&t[i], arg);
}

static void reset_counts(clc_entry *e, void *arg) {
    (void)arg;
    atomic_store(&e->launches, 0);
    atomic_store(&e->denied, 0);
    atomic_store(&e->recorded, 0);
    atomic_store(&e->timed, 0);
    atomic_store(&e->graph_nodes, 0);
    atomic_store(&e->gpu_ns, 0);
    atomic_store(&e->failed, 0);
}

/* The decisions stay valid in a forked child; the counts are the parent's and are not. */
void clc_cache_after_fork_child(void) {
    pthread_mutex_init(&g_insert_lock, NULL);
    clc_cache_each(reset_counts, NULL);
}
