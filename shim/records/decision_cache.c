/* SPDX-License-Identifier: Apache-2.0
 *
 * decision_cache.c: one entry per (kernel handle, context), found without a lock.
 *
 * Readers probe an open-addressing table (clc_cache_find, inline in records.h) and trust an entry
 * once its `ready` flag is set and its context matches (acquire); writers fill every field
 * first and publish the key last (release). Inserting takes a mutex, but only on the slow path
 * of a kernel's first launch, and never while Python runs: a thread holding the GIL may be
 * waiting to launch, so the engine is asked (decide.c) before the insert, with no lock held.
 *
 * A decision belongs to its kernel, not to its handle: the driver gives an unloaded kernel's
 * handle to the next kernel it loads. So each entry knows the library or module its kernel came
 * from, and is forgotten when that is unloaded or its context destroyed (a tombstone that a
 * later insert reuses, its counts archived for the exit statistics). The table never stops
 * deciding: when tombstones fill it, the live entries move to a new table; when live kernels
 * fill it, new kernels are decided at each launch instead of cached.
 *
 * An unload and a load can race: the driver may give the unloaded kernel's handle to another
 * thread's new kernel before the unload's entries are forgotten. So entries are forgotten
 * before the driver unloads, and no entry is published while an unload is under way, nor by a
 * first sight that began before an unload began or ended (its name may be the old kernel's):
 * such launches are decided for themselves, as when the table is full.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "records.h"

#define CACHE_MAX_FILL (CLC_CACHE_SIZE / 4 * 3)

static pthread_mutex_t g_insert_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_count;

#define SHAPES_MAX 64

typedef struct {
    uint32_t grid[3], block[3], shmem;
    clc_outcome outcome;
} clc_shape;

struct clc_shape_cache {
    _Atomic uint32_t count; /* shapes [0, count) are written */
    clc_shape shapes[SHAPES_MAX];
};

static int same_shape(const clc_shape *s, const clc_launch *l) {
    return s->shmem == l->shmem && s->grid[0] == l->grid[0] && s->grid[1] == l->grid[1] &&
           s->grid[2] == l->grid[2] && s->block[0] == l->block[0] && s->block[1] == l->block[1] &&
           s->block[2] == l->block[2];
}

const clc_outcome *clc_find_shape(clc_entry *e, const clc_launch *l) {
    struct clc_shape_cache *c = atomic_load_explicit(&e->shapes, memory_order_acquire);
    uint32_t n = c ? atomic_load_explicit(&c->count, memory_order_acquire) : 0;
    for (uint32_t i = 0; i < n; i++)
        if (same_shape(&c->shapes[i], l)) return &c->shapes[i].outcome;
    return NULL;
}

/* Keeps the engine's answer for this shape; NULL when the kernel has too many shapes. */
const clc_outcome *clc_add_shape(clc_entry *e, const clc_launch *l, const clc_outcome *o) {
    const clc_outcome *kept = NULL;
    pthread_mutex_lock(&g_insert_lock);
    struct clc_shape_cache *c = atomic_load_explicit(&e->shapes, memory_order_relaxed);
    if (!c && (c = calloc(1, sizeof *c)) != NULL)
        atomic_store_explicit(&e->shapes, c, memory_order_release);
    if ((kept = clc_find_shape(e, l)) == NULL && c) {
        uint32_t n = atomic_load_explicit(&c->count, memory_order_relaxed);
        if (n < SHAPES_MAX) {
            clc_shape *s = &c->shapes[n];
            memcpy(s->grid, l->grid, sizeof s->grid);
            memcpy(s->block, l->block, sizeof s->block);
            s->shmem = l->shmem;
            s->outcome = *o;
            atomic_store_explicit(&c->count, n + 1, memory_order_release);
            kept = &s->outcome;
        } else {
            CLC_WARN_ONCE("a kernel has more than %d launch shapes: its per_shape hook is asked "
                          "at every launch from here on",
                          SHAPES_MAX);
        }
    }
    pthread_mutex_unlock(&g_insert_lock);
    return kept;
}

void clc_entry_outcomes(clc_entry *e, void (*fn)(const clc_outcome *, void *), void *arg) {
    fn(&e->fallback, arg);
    for (uint32_t i = 0; i < e->n_clauses; i++) fn(&e->clauses[i].outcome, arg);
    struct clc_shape_cache *c = atomic_load_explicit(&e->shapes, memory_order_acquire);
    uint32_t n = c ? atomic_load_explicit(&c->count, memory_order_acquire) : 0;
    for (uint32_t i = 0; i < n; i++) fn(&c->shapes[i].outcome, arg);
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
 * its bucket becomes a tombstone. When live entries and tombstones fill the table, the live ones
 * are copied into a new table (tombstones left behind); the old table is never unmapped, since
 * a launch in flight may still read it, and its entries keep counting: each copy points to its
 * original (prev), and counts are summed along that chain. All under g_insert_lock. */

static uint32_t g_tombstones;
static clc_kernel_counts *g_archive;
static size_t g_archived, g_archive_cap;
static size_t g_archive_snapped; /* archived counts before this index are in a snapshot */

/* An entry's counters set to 0 (confined_sms is not a counter: what it says still holds). */
static void zero_counters(clc_entry *e) {
#define ZERO(name) atomic_store(&e->name, 0);
    CLC_KERNEL_COUNTERS(ZERO)
#undef ZERO
}

/* A launch is counted before its deny or failure, so denied and failed are read first: the counts
 * read never say more launches denied or failed than launched, and a launch in flight while they
 * are read (one per launching thread at most) is counted as launched only. */
static void add_counts_of(const clc_entry *e, clc_kernel_counts *c) {
    uint64_t denied = atomic_load(&e->denied), failed = atomic_load(&e->failed);
#define ADD(name)                                \
    c->name += &e->name == &e->denied   ? denied \
               : &e->name == &e->failed ? failed \
                                        : atomic_load(&e->name);
    CLC_KERNEL_COUNTERS(ADD)
#undef ADD
    uint32_t sms = atomic_load(&e->confined_sms);
    if (sms > c->confined_sms) c->confined_sms = sms;
}

static void entry_counts(const clc_entry *e, clc_kernel_counts *c) {
    *c = (clc_kernel_counts){
        .kernel_id = e->kernel_id, .device = e->device, .handle = e->handle, .ctx = e->ctx};
    for (; e; e = e->prev) add_counts_of(e, c);
}

/* What tells one snapshot's counts from the next: every count only grows. */
static uint64_t counts_sum(const clc_kernel_counts *c) {
    uint64_t sum = c->confined_sms;
#define SUM(name) sum += c->name;
    CLC_KERNEL_COUNTERS(SUM)
#undef SUM
    return sum;
}

/* A forgotten entry whose counts found no room in the archive: said once (its counts are then
 * missing from the exit statistics, never its decision from a later launch). */
static void archive(const clc_entry *e) {
    if (g_archived == g_archive_cap) {
        size_t cap = g_archive_cap ? g_archive_cap * 2 : 64;
        clc_kernel_counts *grown = realloc(g_archive, cap * sizeof *grown);
        if (!grown) {
            CLC_WARN_ONCE("out of memory: the counts of unloaded kernels are "
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

/* Archives e and makes its bucket a tombstone; its own allocations stay (a launch in flight may
 * still read them). */
static void forget_entry(clc_entry *e, forgotten *out) {
    *out = (forgotten){e->handle, e->ctx, e->kernel_id};
    archive(e);
    __atomic_store_n(&e->ctx, (uint64_t)CLC_CTX_DESTROYED, __ATOMIC_RELEASE);
    g_tombstones++;
}

/* Tells the engine through `tell`, with no lock held (it may wait for the GIL). */
static void tell_engine(const forgotten *f, unsigned n, clc_forget_fn tell) {
    for (unsigned i = 0; i < n; i++) {
        clc_module_event ev = {.api = CLC_LOAD_KERNEL_FORGOTTEN,
                               .handle = f[i].handle,
                               .ctx = f[i].ctx,
                               .kernel_id = f[i].kernel_id};
        tell(&ev);
    }
}

/* Forgets every live entry `match` accepts; returns how many. */
static unsigned forget_where(int (*match)(const clc_entry *, const void *), const void *arg,
                             clc_forget_fn tell) {
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
    tell_engine(f, (unsigned)n, tell);
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

unsigned clc_cache_forget_owners(const uint64_t *owners, unsigned n, clc_forget_fn tell) {
    owner_set s = {owners, n};
    return forget_where(owned_by, &s, tell);
}

static int in_context(const clc_entry *e, const void *arg) {
    return e->ctx == *(const uint64_t *)arg;
}

unsigned clc_cache_forget_context(uint64_t ctx, clc_forget_fn tell) {
    return ctx ? forget_where(in_context, &ctx, tell) : 0;
}

static int any_entry(const clc_entry *e, const void *arg) { return e && !arg; }

unsigned clc_cache_forget_all(clc_forget_fn tell) { return forget_where(any_entry, NULL, tell); }

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
        uint32_t j = clc_bucket_of(e->handle, e->ctx);
        while (t[j].ready) j = (j + 1) & (CLC_CACHE_SIZE - 1);
        clc_entry *c = &t[j];
        memcpy(c, e, sizeof *c);
        zero_counters(c);
        c->prev = e;
        live++;
    }
    atomic_store_explicit(&g_hot.table, t, memory_order_release);
    g_count = live;
    g_tombstones = 0;
    clc_debug("decision table rebuilt: %u live kernels kept, forgotten ones dropped", live);
    return 1;
}

/* A bucket for a new entry of (handle, ctx), NULL when the table is full of live entries
 * (called with g_insert_lock held, the key known absent): the probe's first tombstone, else the
 * empty bucket that ends it. */
static clc_entry *free_bucket(uint64_t handle, uint64_t ctx, int *reused) {
    clc_entry *t = table();
    if (!t) return NULL;
    if (g_count >= CACHE_MAX_FILL && (g_tombstones < CLC_CACHE_SIZE / 8 || !rebuild())) return NULL;
    t = atomic_load_explicit(&g_hot.table, memory_order_relaxed);
    uint32_t i = clc_bucket_of(handle, ctx);
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

/* ---- launches decided without a cache entry -------------------------------------------------
 * When the table is full of live kernels, or an unload is under way, a first sight is decided
 * for its own launch alone, in an entry of the launching thread's, remade at each such launch.
 * Those entries live as long as the process (a list the counts walk reads) and keep counting
 * across launches: together they are the one kernel CLC_KERNEL_UNCACHED of the counts. */
typedef struct loose_entry {
    clc_entry e;
    clc_clause clauses[CLC_MAX_CLAUSES];
    struct loose_entry *next;
} loose_entry;

static loose_entry *_Atomic g_loose;
static CLC_TLS loose_entry *t_loose;
static _Atomic int g_table_full;   /* said, and flagged in the capture's END record */
static int g_loose_published;     /* its KERNEL record written (under g_insert_lock) */
static uint64_t g_loose_snapped;  /* its counts' sum at the last snapshot */

int clc_cache_table_full(void) { return atomic_load_explicit(&g_table_full, memory_order_relaxed); }

/* The pseudo-entry that names the CLC_KERNEL_UNCACHED kernel in the capture. */
static const clc_entry g_loose_name = {.kernel_id = CLC_KERNEL_UNCACHED, .device = -1};
#define LOOSE_NAME "<kernels decided without the decision table>"

/* Called with g_insert_lock held. NULL when no memory: the caller then has no entry (else the
 * entry owns k's layout). */
static clc_entry *loose(const clc_kernel *k, const clc_decision *d,
                        void (*published)(const clc_entry *, const char *)) {
    loose_entry *x = t_loose;
    if (!x) {
        if (!(x = aligned_alloc(64, sizeof *x))) return NULL;
        memset(x, 0, sizeof *x);
        x->e.kernel_id = CLC_KERNEL_UNCACHED;
        x->next = atomic_load(&g_loose);
        atomic_store(&g_loose, x);
        t_loose = x;
    }
    if (!g_loose_published) {
        g_loose_published = 1;
        published(&g_loose_name, LOOSE_NAME);
    }
    clc_entry *e = &x->e;
    free((void *)e->layout);
    e->handle = k->handle;
    e->ctx = k->ctx;
    e->device = k->device;
    e->fallback = d->fallback;
    e->mode = (uint16_t)d->mode;
    e->n_clauses = 0;
    e->clauses = NULL;
    e->layout = k->layout;
    e->n_params = k->n_params;
    e->args_end = k->args_end;
    atomic_store_explicit(&e->shapes, NULL, memory_order_relaxed);
    if (d->n_clauses && d->mode == CLC_MODE_CACHED) {
        memcpy(x->clauses, d->clauses, sizeof(clc_clause) * d->n_clauses);
        e->clauses = x->clauses;
        e->n_clauses = (uint16_t)d->n_clauses;
    }
    atomic_store(&e->ready, 1);
    return e;
}

/* ---- unloads under way ------------------------------------------------------------------------
 */
static _Atomic uint32_t g_unloads;     /* unloads and context teardowns between begin and end */
static _Atomic uint64_t g_unload_epoch; /* one more at each begin and each end */

uint64_t clc_cache_epoch(void) {
    return atomic_load_explicit(&g_unload_epoch, memory_order_acquire);
}

void clc_cache_unload_begin(void) {
    atomic_fetch_add(&g_unloads, 1);
    atomic_fetch_add(&g_unload_epoch, 1);
}

void clc_cache_unload_end(void) {
    atomic_fetch_add(&g_unload_epoch, 1);
    atomic_fetch_sub(&g_unloads, 1);
}

/* A first sight's kernel published (decide.c): its entry; the thread's own when the table is
 * full of live kernels, or when an unload began or ended since the first sight named the kernel
 * (k->epoch); NULL only when there is no memory for either. */
clc_entry *clc_cache_insert(const clc_kernel *k, const clc_decision *d, const clc_launch *l,
                            void (*published)(const clc_entry *, const char *)) {
    uint64_t handle = k->handle, ctx = k->ctx;
    const clc_param_info *layout = k->layout;
    pthread_mutex_lock(&g_insert_lock);
    int settled = atomic_load(&g_unloads) == 0 && atomic_load(&g_unload_epoch) == k->epoch;
    clc_entry *e = settled ? clc_cache_find(handle, ctx) : NULL;
    int reused = 0;
    clc_entry *bucket = e || !settled ? NULL : free_bucket(handle, ctx, &reused);
    if (bucket) {
        e = bucket;
        if (reused)
            g_tombstones--;
        else
            g_count++;
        e->kernel_id = k->kernel_id;
        e->device = k->device;
        e->fallback = d->fallback;
        e->n_clauses = 0;
        e->mode = (uint16_t)d->mode;
        e->layout = layout;
        e->n_params = k->n_params;
        e->args_end = k->args_end;
        e->owner = k->owner;
        e->prev = NULL;
        e->clauses = NULL;
        e->snapshot_sum = 0;
        atomic_store_explicit(&e->shapes, NULL, memory_order_relaxed);
        zero_counters(e);
        atomic_store(&e->confined_sms, 0);
        layout = NULL; /* the entry's now */
        if (d->n_clauses && d->mode == CLC_MODE_CACHED) {
            clc_clause *clauses = malloc(sizeof(clc_clause) * d->n_clauses);
            if (clauses) {
                memcpy(clauses, d->clauses, sizeof(clc_clause) * d->n_clauses);
                e->clauses = clauses;
                e->n_clauses = (uint16_t)d->n_clauses;
            }
        }
        /* The key last, its context with release: see clc_cache_find. */
        __atomic_store_n(&e->handle, handle, __ATOMIC_RELAXED);
        __atomic_store_n(&e->ctx, ctx, __ATOMIC_RELEASE);
        atomic_store_explicit(&e->ready, 1, memory_order_release);
        published(e, k->name ? k->name : "<unnamed>");
    } else if (!e) {
        if (settled && !atomic_exchange(&g_table_full, 1))
            clc_log(CLC_MSG_WARNING,
                    "the decision table is full (%u live kernels): launches of kernels new from "
                    "here on are decided at each launch (slower), not cached",
                    g_count);
        e = loose(k, d, published);
        if (e) layout = NULL;
    }
    pthread_mutex_unlock(&g_insert_lock);
    free((void *)layout); /* another thread's entry won */
    /* The engine answered for this launch: in mode PER_SHAPE that is this shape's answer. */
    if (e && e->mode == CLC_MODE_PER_SHAPE && e->kernel_id != CLC_KERNEL_UNCACHED)
        clc_add_shape(e, l, &d->fallback);
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

void clc_cache_counts(void (*fn)(const clc_kernel_counts *, void *), void *arg, int changed_only,
                      int try_ms) {
    int locked = clc_lock_within(&g_insert_lock, try_ms);
    /* Without the lock the archive may be moving (realloc): only the live entries are read. */
    /* Every walk under the lock notes what it gave: a snapshot after a full walk (the capture's
     * END) gives only what changed since. */
    for (size_t i = locked && changed_only ? g_archive_snapped : 0; locked && i < g_archived; i++)
        fn(&g_archive[i], arg);
    if (locked) g_archive_snapped = g_archived;
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    for (uint32_t i = 0; t && i < CLC_CACHE_SIZE; i++) {
        clc_entry *e = &t[i];
        if (!atomic_load_explicit(&e->ready, memory_order_acquire) || (e->ctx & CLC_CTX_DESTROYED))
            continue;
        clc_kernel_counts c;
        entry_counts(e, &c);
        uint64_t sum = counts_sum(&c);
        if (changed_only && sum == e->snapshot_sum) continue;
        if (locked) e->snapshot_sum = sum;
        fn(&c, arg);
    }
    loose_entry *x = atomic_load(&g_loose);
    if (x) {
        clc_kernel_counts c = {.kernel_id = CLC_KERNEL_UNCACHED, .device = -1};
        for (; x; x = x->next) add_counts_of(&x->e, &c);
        uint64_t sum = counts_sum(&c);
        if (!changed_only || sum != g_loose_snapped) fn(&c, arg);
        if (locked) g_loose_snapped = sum;
    }
    if (locked) pthread_mutex_unlock(&g_insert_lock);
}

static void reset_counts(clc_entry *e, void *arg) {
    (void)arg;
    e->snapshot_sum = 0;
    for (; e; e = e->prev) zero_counters(e);
}

/* The decisions stay valid in a forked child; the counts are the parent's and are not. */
void clc_cache_after_fork_child(void) {
    pthread_mutex_init(&g_insert_lock, NULL);
    clc_cache_each(reset_counts, NULL);
    for (loose_entry *x = atomic_load(&g_loose); x; x = x->next) reset_counts(&x->e, NULL);
    g_archived = g_archive_snapped = 0;
    g_loose_published = 0;
    g_loose_snapped = 0;
    atomic_store(&g_table_full, 0);
}

/* ---- denied launches per rule ---------------------------------------------------------------- */

/* Denied launches per deciding rule (clc_outcome.rule + 2; the last counts every rule past the
 * table's end), written into the capture at exit (CLC_REC_RULE_STATS). */
_Atomic uint64_t clc_rule_denied[CLC_RULE_COUNTERS];

void clc_reset_rule_counts(void) {
    for (int i = 0; i < CLC_RULE_COUNTERS; i++) atomic_store(&clc_rule_denied[i], 0);
}

void clc_rule_stats(void (*fn)(int32_t rule, uint64_t denied, void *), void *arg) {
    for (int i = 0; i < CLC_RULE_COUNTERS; i++) {
        uint64_t n = atomic_load_explicit(&clc_rule_denied[i], memory_order_relaxed);
        if (n) fn(i == CLC_RULE_COUNTERS - 1 ? INT32_MAX : i - 2, n, arg);
    }
}

/* ---- for the engine: counts so far ----------------------------------------------------------- */

typedef struct {
    clc_kernel_counts *out;
    int max, n;
} counts_walk;

static void add_counts(const clc_kernel_counts *c, void *arg) {
    counts_walk *w = arg;
    if (w->n < w->max) w->out[w->n++] = *c;
}

/* Fills up to `max` rows; returns how many were written. */
CLC_EXPORT int clc_shim_kernel_counts(clc_kernel_counts *out, int max) {
    counts_walk w = {out, max, 0};
    clc_cache_counts(add_counts, &w, 0, 0);
    return w.n;
}
