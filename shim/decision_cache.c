/* SPDX-License-Identifier: Apache-2.0
 *
 * decision_cache.c: one entry per (kernel handle, context), found without a lock.
 *
 * Readers probe an open-addressing table (clc_cache_find, inline in shim.h) and trust an entry
 * once its `ready` flag is set and its context matches (acquire); writers fill every field
 * first and publish the key last (release). Inserting takes a mutex, but only on the slow path
 * of a kernel's first launch, and never while Python runs: a thread holding the GIL may be
 * waiting to launch, so the engine is asked with no lock held.
 *
 * A decision belongs to its kernel, not to its handle: the driver gives an unloaded kernel's
 * handle to the next kernel it loads. So each entry knows the library or module its kernel came
 * from, and is forgotten when that is unloaded or its context destroyed (a tombstone that a
 * later insert reuses, its counts archived for the exit statistics). The table never stops
 * deciding: when tombstones fill it, the live entries move to a new table; when live kernels
 * fill it, new kernels are decided at each launch instead of cached.
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
            if (CLC_FIRST_TIME())
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

static clc_entry *new_table(void) {
    /* Anonymous pages are zero and touched only as entries land in them. */
    void *p = mmap(NULL, sizeof(clc_entry) * CLC_CACHE_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static clc_entry *table(void) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (t || !(t = new_table())) return t;
    atomic_store_explicit(&g_hot.table, t, memory_order_release);
    return t;
}

/* ---- forgotten entries ------------------------------------------------------------------------
 * A forgotten entry's counts move to the archive (reported at exit under its kernel id) and
 * its slot becomes a tombstone. When live entries and tombstones fill the table, the live ones
 * are copied into a new table (tombstones left behind); the old table is never unmapped, since
 * a launch in flight may still read it, and its entries keep counting: each copy points to its
 * original (prev), and counts are summed along that chain. All under g_insert_lock. */

static uint32_t g_tombstones;
static clc_kernel_counts *g_archive;
static size_t g_archived, g_archive_cap;
static _Atomic uint32_t g_next_id;

static void entry_counts(const clc_entry *e, clc_kernel_counts *c) {
    *c = (clc_kernel_counts){.kernel_id = e->kernel_id, .device = e->device, .handle = e->handle,
                             .ctx = e->ctx};
    for (; e; e = e->prev) {
        c->launches += atomic_load(&e->launches);
        c->denied += atomic_load(&e->denied);
        c->failed += atomic_load(&e->failed);
        c->recorded += atomic_load(&e->recorded);
        c->timed += atomic_load(&e->timed);
        c->graph_nodes += atomic_load(&e->graph_nodes);
        c->gpu_ns += atomic_load(&e->gpu_ns);
    }
}

/* A forgotten entry whose counts found no room in the archive: said once (its counts are then
 * missing from the exit statistics, never its decision from a later launch). */
static void archive(const clc_entry *e) {
    if (g_archived == g_archive_cap) {
        size_t cap = g_archive_cap ? g_archive_cap * 2 : 64;
        clc_kernel_counts *grown = realloc(g_archive, cap * sizeof *grown);
        if (!grown) {
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING, "out of memory: the counts of unloaded kernels are "
                                         "missing from the exit statistics");
            return;
        }
        g_archive = grown;
        g_archive_cap = cap;
    }
    entry_counts(e, &g_archive[g_archived]);
    g_archived++;
}

typedef struct {
    uint64_t handle, ctx;
    uint32_t kernel_id;
} forgotten;

/* Archives e and makes its slot a tombstone; its own allocations stay (a launch in flight may
 * still read them). */
static void forget_entry(clc_entry *e, forgotten *out) {
    *out = (forgotten){e->handle, e->ctx, e->kernel_id};
    archive(e);
    __atomic_store_n(&e->ctx, (uint64_t)CLC_CTX_DESTROYED, __ATOMIC_RELEASE);
    g_tombstones++;
}

/* Tells the engine, with no lock held (it may wait for the GIL). */
static void tell_engine(const forgotten *f, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        clc_module_event ev = {.api = CLC_LOAD_KERNEL_FORGOTTEN, .handle = f[i].handle,
                               .ctx = f[i].ctx, .kernel_id = f[i].kernel_id};
        clc_bridge_module(&ev);
    }
}

/* Forgets every live entry `match` accepts; returns how many. */
static unsigned forget_where(int (*match)(const clc_entry *, const void *), const void *arg) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (!t) return 0;
    forgotten small[64], *f = small;
    size_t cap = 64, n = 0;
    pthread_mutex_lock(&g_insert_lock);
    for (uint32_t i = 0; i < CLC_CACHE_SIZE; i++) {
        clc_entry *e = &t[i];
        if (!atomic_load_explicit(&e->ready, memory_order_acquire) ||
            (e->ctx & CLC_CTX_DESTROYED) || !match(e, arg))
            continue;
        if (n == cap) {
            forgotten *grown = malloc(cap * 2 * sizeof *grown);
            if (!grown) {
                forget_entry(e, &small[0]); /* forgotten all the same, the engine not told */
                continue;
            }
            memcpy(grown, f, n * sizeof *f);
            if (f != small) free(f);
            f = grown;
            cap *= 2;
        }
        forget_entry(e, &f[n++]);
    }
    pthread_mutex_unlock(&g_insert_lock);
    tell_engine(f, (unsigned)n);
    if (f != small) free(f);
    return (unsigned)n;
}

typedef struct {
    const uint64_t *owners;
    unsigned n;
} owner_set;

static int owned_by(const clc_entry *e, const void *arg) {
    const owner_set *s = arg;
    if (!e->owner) return 1; /* the driver could not say: forgotten at any unload */
    for (unsigned i = 0; i < s->n; i++)
        if (e->owner == s->owners[i]) return 1;
    return 0;
}

unsigned clc_cache_forget_owners(const uint64_t *owners, unsigned n) {
    owner_set s = {owners, n};
    return forget_where(owned_by, &s);
}

static int in_context(const clc_entry *e, const void *arg) {
    return e->ctx == *(const uint64_t *)arg;
}

unsigned clc_cache_forget_context(uint64_t ctx) {
    return ctx ? forget_where(in_context, &ctx) : 0;
}

unsigned clc_cache_library_modules(uint64_t lib, uint64_t *out, unsigned max) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (!t || !g_drv.library_get_module || !g_drv.ctx_get_current || !g_drv.ctx_set_current)
        return 0;
    uint64_t seen[64];
    unsigned n_seen = 0, n = 0;
    CUcontext cur = NULL;
    g_drv.ctx_get_current(&cur);
    for (uint32_t i = 0; i < CLC_CACHE_SIZE && n < max && n_seen < 64; i++) {
        if (!atomic_load_explicit(&t[i].ready, memory_order_acquire)) continue;
        uint64_t ctx = __atomic_load_n(&t[i].ctx, __ATOMIC_ACQUIRE);
        if (!ctx || (ctx & CLC_CTX_DESTROYED)) continue;
        unsigned k = 0;
        while (k < n_seen && seen[k] != ctx) k++;
        if (k < n_seen) continue;
        seen[n_seen++] = ctx;
        CUmodule mod = NULL;
        if (g_drv.ctx_set_current((CUcontext)(uintptr_t)ctx) == CUDA_SUCCESS &&
            g_drv.library_get_module(&mod, (CUlibrary)(uintptr_t)lib) == CUDA_SUCCESS && mod)
            out[n++] = (uint64_t)(uintptr_t)mod;
    }
    g_drv.ctx_set_current(cur);
    return n;
}

/* The live entries of the current table copied into a new one, tombstones left behind (called
 * with g_insert_lock held). 0 when no table could be made. */
static int rebuild(void) {
    clc_entry *old = atomic_load_explicit(&g_hot.table, memory_order_relaxed);
    clc_entry *t = new_table();
    if (!t) return 0;
    uint32_t live = 0;
    for (uint32_t i = 0; i < CLC_CACHE_SIZE; i++) {
        clc_entry *e = &old[i];
        if (!atomic_load_explicit(&e->ready, memory_order_relaxed) || (e->ctx & CLC_CTX_DESTROYED))
            continue;
        uint32_t j = clc_slot_of(e->handle, e->ctx);
        while (t[j].ready) j = (j + 1) & (CLC_CACHE_SIZE - 1);
        clc_entry *c = &t[j];
        memcpy(c, e, sizeof *c);
        atomic_store(&c->launches, 0);
        atomic_store(&c->denied, 0);
        atomic_store(&c->recorded, 0);
        atomic_store(&c->timed, 0);
        atomic_store(&c->graph_nodes, 0);
        atomic_store(&c->gpu_ns, 0);
        atomic_store(&c->failed, 0);
        c->prev = e;
        live++;
    }
    atomic_store_explicit(&g_hot.table, t, memory_order_release);
    g_count = live;
    g_tombstones = 0;
    clc_debug("decision table rebuilt: %u live kernels kept, forgotten ones dropped", live);
    return 1;
}

/* A slot for a new entry of (handle, ctx), NULL when the table is full of live entries
 * (called with g_insert_lock held, the key known absent): the probe's first tombstone, else the
 * empty slot that ends it. */
static clc_entry *free_slot(uint64_t handle, uint64_t ctx, int *reused) {
    clc_entry *t = table();
    if (!t) return NULL;
    if (g_count >= CACHE_MAX_FILL && (g_tombstones < CLC_CACHE_SIZE / 8 || !rebuild()))
        return NULL;
    t = atomic_load_explicit(&g_hot.table, memory_order_relaxed);
    uint32_t i = clc_slot_of(handle, ctx);
    while (atomic_load_explicit(&t[i].ready, memory_order_relaxed)) {
        if (t[i].ctx & CLC_CTX_DESTROYED) {
            *reused = 1;
            return &t[i];
        }
        i = (i + 1) & (CLC_CACHE_SIZE - 1);
    }
    *reused = 0;
    return &t[i];
}

/* A launch decided without a cache entry (the table is full of live kernels): the thread's
 * own, remade at each such launch, whose counts are not kept. */
static CLC_TLS clc_entry t_uncached;
static CLC_TLS clc_clause t_uncached_clauses[CLC_MAX_CLAUSES];

static clc_entry *uncached(uint64_t handle, uint64_t ctx, int device, const clc_decision *d,
                           const clc_param_info *layout, uint32_t n_params, uint32_t end) {
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "the decision table is full (%u live kernels): launches of kernels new from "
                "here on are decided by the engine at each launch (slower), not cached",
                g_count);
    clc_entry *e = &t_uncached;
    free((void *)e->layout);
    memset(e, 0, sizeof *e);
    e->handle = handle;
    e->ctx = ctx;
    e->kernel_id = CLC_KERNEL_UNCACHED;
    e->device = device;
    e->fallback = d->fallback;
    e->mode = (uint16_t)d->mode;
    e->layout = layout;
    e->n_params = n_params;
    e->args_end = end;
    if (d->n_clauses && d->mode == CLC_MODE_CACHED) {
        memcpy(t_uncached_clauses, d->clauses, sizeof(clc_clause) * d->n_clauses);
        e->clauses = t_uncached_clauses;
        e->n_clauses = (uint16_t)d->n_clauses;
    }
    atomic_store(&e->ready, 1);
    return e;
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

/* The slow path, once per (kernel, context): name the kernel, ask the engine, publish. */
clc_entry *clc_cache_decide(uint64_t handle, uint64_t ctx, const clc_launch_info *l,
                            clc_outcome *answer) {
    clc_ensure_exit_handler();
    const char *name = clc_kernel_name(handle);
    int device = ctx_device(ctx);
    uint64_t owner = kernel_owner(handle);
    uint32_t n_params, end;
    clc_param_info *layout = query_layout(handle, &n_params, &end);
    clc_decision d;
    memset(&d, 0, sizeof d);
    query_buf b;
    clc_entry id_only = {.kernel_id = atomic_fetch_add(&g_next_id, 1)};
    clc_kernel_query *q = fill_query(&b, &id_only, handle, ctx, device, l,
                                     name ? name : "<unnamed>", layout, n_params, end);
    /* clc-run first, when it decides; the program's engine for a wrap, and when clc-run cannot
     * be asked (gone while a descendant runs on, another user's process, ...). */
    int substitute = 0;
    int asked = clc_decider_configured() ? clc_decider_decide(q->name, device, &d, &substitute)
                                         : CLC_DECIDE_ENGINE;
    if (asked != CLC_DECIDE_OK) {
        clc_decision without_engine = d;
        memset(&d, 0, sizeof d);
        if (clc_bridge_decide(q, &d) == 0) {
            asked = CLC_DECIDE_OK;
        } else if (substitute) {
            /* No engine to build a wrapped kernel here: the rest of the policy still holds. */
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING, "wrapped kernels cannot be built in this process: the "
                                         "kernels of wrap rules get their on_unwrappable");
            d = without_engine;
            asked = CLC_DECIDE_OK;
        }
    }
    if (asked != CLC_DECIDE_OK || d.n_clauses > CLC_MAX_CLAUSES ||
        d.mode > CLC_MODE_EVERY_LAUNCH) {
        memset(&d, 0, sizeof d);
        d.fallback = g_cfg.on_error;
    }
    free_query(&b);
    *answer = d.fallback;

    pthread_mutex_lock(&g_insert_lock);
    clc_entry *e = clc_cache_find(handle, ctx);
    int reused = 0;
    clc_entry *slot = e ? NULL : free_slot(handle, ctx, &reused);
    if (slot) {
        e = slot;
        if (reused) g_tombstones--;
        else g_count++;
        e->kernel_id = id_only.kernel_id;
        e->device = device;
        e->fallback = d.fallback;
        e->n_clauses = 0;
        e->mode = (uint16_t)d.mode;
        e->layout = layout;
        e->n_params = n_params;
        e->args_end = end;
        e->owner = owner;
        e->prev = NULL;
        e->clauses = NULL;
        atomic_store_explicit(&e->shapes, NULL, memory_order_relaxed);
        atomic_store(&e->launches, 0);
        atomic_store(&e->denied, 0);
        atomic_store(&e->recorded, 0);
        atomic_store(&e->timed, 0);
        atomic_store(&e->graph_nodes, 0);
        atomic_store(&e->gpu_ns, 0);
        atomic_store(&e->failed, 0);
        layout = NULL; /* the entry's now */
        if (d.n_clauses && d.mode == CLC_MODE_CACHED) {
            clc_clause *clauses = malloc(sizeof(clc_clause) * d.n_clauses);
            if (clauses) {
                memcpy(clauses, d.clauses, sizeof(clc_clause) * d.n_clauses);
                e->clauses = clauses;
                e->n_clauses = (uint16_t)d.n_clauses;
            }
        }
        /* The key last, its context with release: see clc_cache_find. */
        __atomic_store_n(&e->handle, handle, __ATOMIC_RELAXED);
        __atomic_store_n(&e->ctx, ctx, __ATOMIC_RELEASE);
        atomic_store_explicit(&e->ready, 1, memory_order_release);
        clc_capture_kernel(e, name ? name : "<unnamed>");
    } else if (!e) {
        e = uncached(handle, ctx, device, &d, layout, n_params, end);
        layout = NULL;
    }
    pthread_mutex_unlock(&g_insert_lock);
    free(layout); /* another thread's entry won */
    /* The engine answered for this launch: in mode PER_SHAPE that is this shape's answer. */
    if (e->mode == CLC_MODE_PER_SHAPE && e->kernel_id != CLC_KERNEL_UNCACHED)
        add_shape(e, l, &d.fallback);
    return e;
}

void clc_cache_each(clc_entry_fn fn, void *arg) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (!t) return;
    for (uint32_t i = 0; i < CLC_CACHE_SIZE; i++)
        if (atomic_load_explicit(&t[i].ready, memory_order_acquire) &&
            !(__atomic_load_n(&t[i].ctx, __ATOMIC_ACQUIRE) & CLC_CTX_DESTROYED))
            fn(&t[i], arg);
}

void clc_cache_counts(void (*fn)(const clc_kernel_counts *, void *), void *arg) {
    pthread_mutex_lock(&g_insert_lock);
    for (size_t i = 0; i < g_archived; i++) fn(&g_archive[i], arg);
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    for (uint32_t i = 0; t && i < CLC_CACHE_SIZE; i++) {
        clc_entry *e = &t[i];
        if (!atomic_load_explicit(&e->ready, memory_order_acquire) || (e->ctx & CLC_CTX_DESTROYED))
            continue;
        clc_kernel_counts c;
        entry_counts(e, &c);
        fn(&c, arg);
    }
    pthread_mutex_unlock(&g_insert_lock);
}

static void reset_counts(clc_entry *e, void *arg) {
    (void)arg;
    for (; e; e = e->prev) {
        atomic_store(&e->launches, 0);
        atomic_store(&e->denied, 0);
        atomic_store(&e->recorded, 0);
        atomic_store(&e->timed, 0);
        atomic_store(&e->graph_nodes, 0);
        atomic_store(&e->gpu_ns, 0);
        atomic_store(&e->failed, 0);
    }
}

/* The decisions stay valid in a forked child; the counts are the parent's and are not. */
void clc_cache_after_fork_child(void) {
    pthread_mutex_init(&g_insert_lock, NULL);
    clc_cache_each(reset_counts, NULL);
    g_archived = 0;
}
