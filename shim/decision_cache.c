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

/* The largest parameter block a kernel may have (CUDA 12.1+: 32764 bytes), and the most
 * parameters asked of the driver. */
#define ARGS_MAX 32768u
#define PARAMS_MAX 32768u

/* A kernel's parameter layout from the driver (cudart hands CUkernels, everything else
 * CUfunctions; each getter refuses the other), malloc'd; NULL and *n = 0 when unknown. */
static clc_param_info *query_layout(uint64_t handle, uint32_t *n, uint32_t *end) {
    *n = *end = 0;
    CUresult (*getters[2])(void *, size_t, size_t *, size_t *) = {
        (CUresult(*)(void *, size_t, size_t *, size_t *))g_drv.kernel_get_param_info,
        (CUresult(*)(void *, size_t, size_t *, size_t *))g_drv.func_get_param_info};
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

/* Copies a launch's arguments into dst (room for `end` bytes), laid out as the kernel's
 * parameter block; *size gets the bytes copied. Returns CLC_ARGS_*. */
static uint32_t pack_args(unsigned char *dst, const clc_param_info *layout, uint32_t n,
                          uint32_t end, void **params, void **extra, uint32_t *size) {
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
    const void *buffer = NULL;
    size_t have = 0;
    int k = 0;
    for (; k < 128 && extra[k] != CU_LAUNCH_PARAM_END; k += 2) {
        if (extra[k] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buffer = extra[k + 1];
        else if (extra[k] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[k + 1])
            have = *(const size_t *)extra[k + 1];
        else
            return CLC_ARGS_BAD_EXTRA;
    }
    if (k >= 128 || !buffer) return CLC_ARGS_BAD_EXTRA;
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

static clc_kernel_query *fill_query(query_buf *b, const clc_entry *e, uint64_t handle,
                                    uint64_t ctx, int device, const clc_launch_info *l,
                                    const char *name, const clc_param_info *layout,
                                    uint32_t n_params, uint32_t end) {
    b->heap = NULL;
    clc_kernel_query *q = &b->small.q;
    int no_memory = 0;
    if (end > sizeof b->small.bytes - sizeof *q) {
        q = b->heap = malloc(sizeof *q + end);
        if (!q) {
            q = &b->small.q;
            no_memory = 1;
        }
    }
    *q = (clc_kernel_query){.handle = handle, .ctx = ctx, .device = device,
                            .entry = l->entry_point, .kernel_id = e ? e->kernel_id : 0,
                            .name = name, .grid = {l->grid[0], l->grid[1], l->grid[2]},
                            .block = {l->block[0], l->block[1], l->block[2]},
                            .shared_mem = l->shmem, .tid = clc_tid(),
                            .stream = (uint64_t)(uintptr_t)l->stream, .params = l->params,
                            .extra = l->extra, .layout = layout, .n_params = n_params};
    if (no_memory)
        q->args_status = CLC_ARGS_NO_MEMORY;
    else
        q->args_status = pack_args((unsigned char *)(q + 1), layout, n_params, end, l->params,
                                   l->extra, &q->args_size);
    return b->q = q;
}

static void free_query(query_buf *b) { free(b->heap); }

/* Asks the engine about one launch; the policy's on_error when it cannot answer. */
static void ask(clc_entry *e, const clc_launch_info *l, clc_outcome *out) {
    query_buf b;
    clc_kernel_query *q =
        fill_query(&b, e, e->handle, e->ctx, e->device, l, "", e->layout, e->n_params,
                   e->args_end);
    t_in_clc = 1;
    if (clc_bridge_launch(q, out) != 0) *out = g_cfg.on_error;
    t_in_clc = 0;
    free_query(&b);
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

void clc_entry_outcomes(clc_entry *e, void (*fn)(const clc_outcome *, void *), void *arg) {
    fn(&e->fallback, arg);
    for (uint32_t i = 0; i < e->n_clauses; i++) fn(&e->clauses[i].outcome, arg);
    struct clc_shape_cache *c = atomic_load_explicit(&e->shapes, memory_order_acquire);
    uint32_t n = c ? atomic_load_explicit(&c->count, memory_order_acquire) : 0;
    for (uint32_t i = 0; i < n; i++) fn(&c->slots[i].outcome, arg);
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
    uint32_t n_params, end;
    clc_param_info *layout = query_layout(handle, &n_params, &end);
    clc_decision d;
    memset(&d, 0, sizeof d);
    query_buf b;
    clc_kernel_query *q = fill_query(&b, NULL, handle, ctx, device, l,
                                     name ? name : "<unnamed>", layout, n_params, end);
    if (clc_bridge_decide(q, &d) != 0 || d.n_clauses > CLC_MAX_CLAUSES ||
        d.mode > CLC_MODE_EVERY_LAUNCH) {
        memset(&d, 0, sizeof d);
        d.fallback = g_cfg.on_error;
    }
    free_query(&b);
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
        e->layout = layout;
        e->n_params = n_params;
        e->args_end = end;
        layout = NULL; /* the entry's now */
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
    free(layout); /* another thread's entry won, or the table is full */
    /* The engine answered for this launch: in mode PER_SHAPE that is this shape's answer. */
    if (e && e->mode == CLC_MODE_PER_SHAPE) add_shape(e, l, &d.fallback);
    return e;
}

/* A destroyed context's entries keep their counts but no longer match a launch: their ctx
 * gets CLC_CTX_DESTROYED (probe chains stay whole; a new context at the same address makes
 * new entries after them). Returns how many. */
unsigned clc_cache_forget_context(uint64_t ctx) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    unsigned n = 0;
    if (!t || !ctx) return 0;
    pthread_mutex_lock(&g_insert_lock);
    for (uint32_t i = 0; i < CLC_CACHE_SIZE; i++)
        if (atomic_load_explicit(&t[i].ready, memory_order_acquire) && t[i].ctx == ctx) {
            __atomic_store_n(&t[i].ctx, ctx | CLC_CTX_DESTROYED, __ATOMIC_RELEASE);
            n++;
        }
    pthread_mutex_unlock(&g_insert_lock);
    return n;
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
