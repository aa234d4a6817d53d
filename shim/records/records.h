/* SPDX-License-Identifier: Apache-2.0
 *
 * records.h: the records layer of stage 1 (shim/records/: decision_cache.c capture.c cupti.c
 * timing.c): a launch (clc_launch), a kernel at its first sight (clc_kernel), the decision cache,
 * the capture, GPU timing, the per-rule counts.
 */
#ifndef CLC_RECORDS_H
#define CLC_RECORDS_H

#include "core/core.h"

/* A launch as the program made it, or a graph kernel node as it made or changed it, beyond the
 * kernel: built once by the hook and passed by pointer to the gate (gate.h), the decision
 * (decide.c) and the replace path (replace.c). */
typedef struct {
    uint32_t entry_point; /* CLC_ENTRY_* */
    uint32_t grid[3], block[3], shmem;
    CUstream stream;
    void **params, **extra;
    const CUlaunchConfig *config; /* cuLaunchKernelEx's (its attributes), else NULL */
} clc_launch;

/* A kernel in a context, as its first sight found it: built once (decide.c), passed by pointer
 * to the engine's question and to the decision cache, whose entry then owns the layout. The
 * engine's later questions about its launches read it back from the entry. */
typedef struct {
    uint64_t handle; /* CUfunction or CUkernel, as the program passed it */
    uint64_t ctx;
    uint64_t owner;  /* the CUlibrary or CUmodule it came from; 0: unknown */
    uint64_t epoch;  /* clc_cache_epoch() before it was named (see clc_cache_insert) */
    uint32_t kernel_id;
    int device;             /* of ctx; -1 when unknown */
    const char *name;       /* the driver's; NULL when it could not say */
    const clc_param_info *layout; /* malloc'd, n_params of them; NULL when unknown */
    uint32_t n_params, args_end;  /* args_end: the parameter block's size in bytes */
} clc_kernel;

/* ---- the decision cache ------------------------------------------------------------------ */
typedef struct clc_entry {
    /* The first cache line holds all that a plain launch reads and writes. */
    uint64_t handle;
    uint64_t ctx;
    _Atomic uint32_t ready; /* 0 until every other field is written */
    union {
        struct {
            uint16_t n_clauses; /* shape clauses (mode CLC_MODE_CACHED) */
            uint16_t mode;      /* CLC_MODE_* */
        };
        uint32_t shaped; /* 0: `fallback` decides every launch, the fast path's one test */
    };
    clc_outcome fallback;
    _Atomic uint64_t launches;
    uint32_t kernel_id;
    int32_t device;
    /* The rest: shape rules, and counts kept by the slower paths. */
    clc_clause *clauses;                /* n_clauses of them, or NULL */
    struct clc_shape_cache *_Atomic shapes; /* mode CLC_MODE_PER_SHAPE: answers so far */
    const clc_param_info *layout;       /* the parameters (n_params), or NULL when unknown */
    uint32_t n_params, args_end;        /* args_end: the parameter block's size in bytes */
    _Atomic uint64_t denied, failed, recorded, timed, graph_nodes, gpu_ns; /* CLC_KERNEL_COUNTERS
                                                                           but launches */
    _Atomic uint32_t confined_sms; /* the SMs its confined launches last ran on (green.c) */
    uint64_t owner;         /* the CUlibrary or CUmodule the kernel came from; 0: unknown */
    uint64_t snapshot_sum;  /* its counts' sum when the capture last wrote them (under the
                               table's lock) */
    struct clc_entry *prev; /* the same kernel's entry in the table this one was copied from
                               (launches in flight then may still count there): counted too */
} __attribute__((aligned(64))) clc_entry;

#define CLC_CACHE_BITS 16
#define CLC_CACHE_SIZE (1u << CLC_CACHE_BITS)

static inline uint32_t clc_bucket_of(uint64_t handle, uint64_t ctx) {
    uint64_t h = (handle ^ (ctx * 0xff51afd7ed558ccdull)) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> (64 - CLC_CACHE_BITS));
}

/* Lock-free: a bucket is used once `ready` is set (acquire) and never becomes empty again, so
 * the probe for a key ends at the first bucket that is not ready. A forgotten entry (its kernel's
 * module unloaded, its context destroyed) stays as a tombstone whose ctx has CLC_CTX_DESTROYED,
 * which no launch's context has; an insert may reuse it, writing its handle first and its ctx
 * last (release), so a reader that sees the new ctx (acquire) sees the whole new entry. */
static inline clc_entry *clc_cache_find(uint64_t handle, uint64_t ctx) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (unlikely(!t)) return NULL;
    for (uint32_t i = clc_bucket_of(handle, ctx), n = 0; n < CLC_CACHE_SIZE;
         i = (i + 1) & (CLC_CACHE_SIZE - 1), n++) {
        clc_entry *e = &t[i];
        if (!atomic_load_explicit(&e->ready, memory_order_acquire)) return NULL;
        if (likely(__atomic_load_n(&e->ctx, __ATOMIC_ACQUIRE) == ctx && e->handle == handle))
            return e;
    }
    return NULL;
}
/* The kernel's mangled name from the driver, whether the handle is a CUkernel or a
 * CUfunction; NULL when neither getter knows it. */
const char *clc_kernel_name(uint64_t handle);

/* Publishes the entry of a first sight decided `d` (the decision cache's insert, under its lock;
 * `published` is called there with each new entry and its name); an entry of another thread
 * may have won. When the table is full, or an unload began or ended since k->epoch, the
 * launch is decided alone, in an entry of the thread's (kernel id CLC_KERNEL_UNCACHED). NULL
 * only without memory. */
clc_entry *clc_cache_insert(const clc_kernel *k, const clc_decision *d, const clc_launch *l,
                            void (*published)(const clc_entry *, const char *));
/* Unloads and context teardowns: between begin and end no entry is published (see
 * decision_cache.c); the epoch tells a first sight whether one began or ended meanwhile. */
uint64_t clc_cache_epoch(void);
void clc_cache_unload_begin(void);
void clc_cache_unload_end(void);
/* Whether the table filled with live kernels (said once). */
int clc_cache_table_full(void);
/* An entry's answers per launch shape (mode CLC_MODE_PER_SHAPE): the one for l's shape, or
 * NULL; the engine's answer `o` kept for it (NULL when the kernel has too many shapes). */
const clc_outcome *clc_find_shape(clc_entry *e, const clc_launch *l);
const clc_outcome *clc_add_shape(clc_entry *e, const clc_launch *l, const clc_outcome *o);
/* Each outcome an entry holds (fallback, shape clauses, per-shape answers). */
void clc_entry_outcomes(clc_entry *e, void (*fn)(const clc_outcome *, void *), void *arg);
typedef void (*clc_entry_fn)(clc_entry *, void *);
/* How the engine hears of each forgotten kernel (CLC_LOAD_KERNEL_FORGOTTEN): clc_bridge_module. */
typedef void (*clc_forget_fn)(const clc_module_event *ev);
/* A context was destroyed: its entries are forgotten (see CLC_CTX_DESTROYED), and `tell` told. */
unsigned clc_cache_forget_context(uint64_t ctx, clc_forget_fn tell);
/* Modules or libraries were unloaded: the entries of their kernels (and of kernels whose owner
 * the driver could not say) are forgotten, and `tell` told. */
unsigned clc_cache_forget_owners(const uint64_t *owners, unsigned n, clc_forget_fn tell);
/* The modules that stand for library `lib` in each context holding entries (the driver's
 * cuLibraryGetModule, asked with each such context current): up to max, into out. */
unsigned clc_cache_library_modules(uint64_t lib, uint64_t *out, unsigned max);
/* Every entry forgotten (the process changed its user or groups). */
unsigned clc_cache_forget_all(clc_forget_fn tell);
void clc_cache_each(clc_entry_fn fn, void *arg);
/* Each kernel's counts, forgotten entries included (live entries summed with their copies, the
 * launches decided alone as one kernel, CLC_KERNEL_UNCACHED); `changed_only`: those whose
 * counts changed since the last such walk. With try_ms > 0 the table's lock is waited for at
 * most that long (a fatal signal's handler), then the live entries are read without it. */
void clc_cache_counts(void (*fn)(const clc_kernel_counts *, void *), void *arg, int changed_only,
                      int try_ms);
void clc_cache_after_fork_child(void);

/* ---- the capture ------------------------------------------------------------------------- */
uint64_t clc_now_ns(void);       /* CLOCK_MONOTONIC */
uint64_t clc_launch_time_ns(void); /* the same clock, cheaper: from the TSC once calibrated */
uint32_t clc_tid(void);
int clc_capture_enabled(void);
void clc_capture_write(uint16_t type, const void *body, size_t body_size, const char *text,
                       size_t text_len);
void *clc_capture_begin(uint16_t type, size_t body_size); /* a record's body, filled in place */
void clc_capture_commit(void);                            /* publishes it */
void clc_capture_message(int level, const char *text, size_t len); /* a MESSAGE record */
void clc_capture_kernel(const clc_entry *e, const char *name);
/* A timed launch's GPU time (CLC_TIMING_* source): added to its kernel's counts, and its TIMING
 * record written. */
void clc_capture_gpu_time(clc_entry *e, uint64_t seq, uint64_t gpu_ns, uint32_t source);
/* The counts (KERNEL_STATS, RULE_STATS) and an END record (CLC_END_* `how`, `status`), written
 * to the file at once; again at each call (the last one holds). `in_signal`: from a fatal
 * signal's handler (locks waited for a bounded time). */
void clc_capture_finish(uint32_t how, int32_t status, int in_signal);
/* A launch that no kernel entry could hold (the driver could not be placed, a signal handler's
 * launch of a kernel not decided yet): counted in END. Async-signal-safe. */
void clc_capture_undecided(void);
void clc_capture_after_fork_child(void);

/* ---- GPU timing: CUPTI's kernel records where it is present, else events --------------------- */
typedef struct clc_timing clc_timing;
int clc_timing_begin(clc_timing **out, CUstream stream, int ptsz, clc_entry *e, uint64_t seq);
void clc_timing_end(clc_timing *t, CUstream stream, int ptsz, clc_entry *e, uint64_t seq);
void clc_timing_drain_all(void);
/* cupti.c: whether CUPTI times launches (started on the first call); a timed launch between
 * begin and end; the records of all launches so far read */
int clc_cupti_on(void);
void clc_cupti_begin(clc_entry *e, uint64_t seq);
void clc_cupti_end(int launched);
void clc_cupti_drain(void);
void clc_cupti_after_fork_child(void);
/* timing.c: launches of this thread between on and off are timed by events (the several launches
 * of one multi-device call, which CUPTI's launch callbacks do not tell apart) */
void clc_timing_events_only(int on);

/* ---- denied launches per deciding rule (decision_cache.c), counted by the launch gate ------ */
#define CLC_RULE_COUNTERS 4096
extern CLC_HIDDEN _Atomic uint64_t clc_rule_denied[CLC_RULE_COUNTERS];
static inline void clc_count_denied_by(int32_t rule) {
    int64_t i = (int64_t)rule + 2;
    if (i < 0 || i >= CLC_RULE_COUNTERS) i = CLC_RULE_COUNTERS - 1;
    atomic_fetch_add_explicit(&clc_rule_denied[i], 1, memory_order_relaxed);
}
void clc_reset_rule_counts(void);
/* Denied launches per rule so far: fn(rule, count) for each rule that denied any (rule as in
 * clc_outcome.rule; INT32_MAX sums rules past the counters' end). */
void clc_rule_stats(void (*fn)(int32_t rule, uint64_t denied, void *), void *arg);

#endif /* CLC_RECORDS_H */
