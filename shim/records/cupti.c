/* SPDX-License-Identifier: Apache-2.0
 *
 * cupti.c: GPU time of timed launches from CUPTI's kernel activity records: NVIDIA's own
 * start and end of each kernel on the GPU, gathered in buffers off the launch path.
 *
 * clc subscribes to CUPTI's callbacks of the launch entry points (driver and runtime). A timed
 * launch sets its number in a thread-local before the real call; CUPTI calls back inside that
 * call with the API call's correlation id, which the kernel's activity record will carry, and
 * the pair goes into a table. The kernel records come back in buffers, on CUPTI's own thread
 * (every FLUSH_MS or when a buffer fills) or at a flush; each one found in the table makes one
 * TIMING record and adds to its kernel's counts, as timing.c's events do. A launch made through
 * cudart carries the runtime call's id or the driver call's: both are entered. Untimed launches
 * pass CUPTI's callback too (a thread-local read) and CUPTI traces their kernels (its cost,
 * docs/performance.md), but nothing of clc's.
 *
 * CUPTI has room for one client. clc takes it only when nobody holds it (cuptiSubscribe says
 * so); a program that comes for it later (torch.profiler, Nsight Systems' injection) calls
 * cuptiSubscribe or cuptiActivityRegisterCallbacks through the exports below, and clc gives
 * CUPTI up to it, as the program would have found it without clc: later timed launches are
 * timed by timing.c's events. So are they where libcupti is missing or refuses (said once), in
 * a forked child (CUPTI does not follow a fork), and once CUPTI has been read for the last time
 * at exit (before libcupti's own exit handlers run).
 *
 * No lock is waited for on the launch path: a launch that finds CUPTI being started by another
 * thread is timed by events (its start loads libcupti, and a library's constructor launching
 * from inside the loader must not wait for it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cupti_abi.h"
#include "records.h"

#define FLUSH_MS 200
#define BUFFER_BYTES (4u << 20)
/* How long a drain waits for the records of timed launches still running, at most. */
#define DRAIN_WAIT_NS 2000000000ull
#define N_OF(a) (sizeof(a) / sizeof *(a))

typedef clc_cupti_result result_t;
typedef void (*requested_fn)(uint8_t **, size_t *, size_t *);
typedef void (*completed_fn)(CUcontext, uint32_t, uint8_t *, size_t, size_t);
typedef void (*callback_fn)(void *, uint32_t, uint32_t, const void *);

static struct {
    result_t (*subscribe)(void **, callback_fn, void *);
    result_t (*unsubscribe)(void *);
    result_t (*enable_callback)(uint32_t, void *, uint32_t, uint32_t);
    result_t (*register_callbacks)(requested_fn, completed_fn);
    result_t (*enable)(uint32_t);
    result_t (*disable)(uint32_t);
    result_t (*flush_all)(uint32_t);
    result_t (*flush_period)(uint32_t);
    result_t (*next_record)(uint8_t *, size_t, clc_cupti_activity **);
    result_t (*dropped)(CUcontext, uint32_t, size_t *);
} cupti;
static void *g_subscriber, *g_own; /* clc's subscriber; the libcupti clc loaded itself */

enum { OFF = -1, GIVEN_UP = -2, FINISHED = -3, ON = 1 };
/* 0: not tried; ON; or why not: OFF (missing, refused, events asked for, a forked child),
 * GIVEN_UP to the program, FINISHED at exit */
static _Atomic int g_state;
static pthread_mutex_t g_state_lock = PTHREAD_MUTEX_INITIALIZER;

/* Each timed launch's kernel by its number: written before the launch, read when its record
 * comes back, valid in the drain's generation it was written in (a drain forgets what it did
 * not see come back: the kernel's entry may go after it). A slot taken again before then (more
 * timed launches in flight than slots) loses the older one's time, counted. */
#define LAUNCH_SLOTS (1u << 18)
typedef struct {
    _Atomic uint64_t seq; /* seq + 1; 0: being written */
    _Atomic uint32_t generation;
    clc_entry *_Atomic entry;
} launch_slot;
static launch_slot *g_launches;
static _Atomic uint32_t g_generation;

/* CUPTI's correlation id of each timed launch's API call with the low half of its seq + 1, in
 * one word (read whole, never torn), direct-mapped: a slot is taken again only after
 * CORRELATION_SLOTS more API calls of the process. */
#define CORRELATION_SLOTS (1u << 18)
static _Atomic uint64_t *g_correlations;

/* The timed launches this thread is inside, innermost last (a signal handler's launch inside a
 * launch), seq + 1 each; and the runtime call it is inside (restored on its exit from the
 * callback's own per-call word). */
#define NESTED 8
static CLC_TLS uint64_t t_timed[NESTED];
static CLC_TLS uint32_t t_depth;
static CLC_TLS uint32_t t_runtime_correlation;

/* timed launches made and timed since the last drain; all timed */
static _Atomic uint64_t g_launched, g_timed, g_timed_all;

static void deliver(uint32_t seq1_low, uint64_t gpu_ns) {
    launch_slot *s = &g_launches[(seq1_low - 1) & (LAUNCH_SLOTS - 1)];
    /* read between two reads of its seq: a slot being taken again is seen as changed */
    uint64_t seq1 = atomic_load_explicit(&s->seq, memory_order_acquire);
    uint32_t generation = atomic_load_explicit(&s->generation, memory_order_relaxed);
    clc_entry *e = atomic_load_explicit(&s->entry, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if ((uint32_t)seq1 != seq1_low || atomic_load_explicit(&s->seq, memory_order_relaxed) != seq1 ||
        generation != atomic_load_explicit(&g_generation, memory_order_acquire) || !e)
        return;
    atomic_fetch_add_explicit(&g_timed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_timed_all, 1, memory_order_relaxed);
    clc_capture_gpu_time(e, seq1 - 1, gpu_ns, CLC_TIMING_CUPTI);
}

static void correlate(uint32_t correlation, uint64_t seq1) {
    atomic_store_explicit(&g_correlations[correlation & (CORRELATION_SLOTS - 1)],
                          (uint64_t)correlation << 32 | (uint32_t)seq1, memory_order_release);
}

/* CUPTI's callback, inside each launch call of the program (and of clc's own replacements). */
static void on_launch(void *userdata, uint32_t domain, uint32_t cbid, const void *data) {
    const clc_cupti_callback_data *d = data;
    if (domain == CLC_CUPTI_DOMAIN_RUNTIME) {
        if (d->site == CLC_CUPTI_API_ENTER) {
            if (d->correlation_data) *d->correlation_data = t_runtime_correlation;
            t_runtime_correlation = d->correlation;
        } else {
            t_runtime_correlation = d->correlation_data ? (uint32_t)*d->correlation_data : 0;
        }
        return;
    }
    uint32_t depth = t_depth;
    uint64_t seq1 = depth && depth <= NESTED ? t_timed[depth - 1] : 0;
    if (!seq1 || d->site != CLC_CUPTI_API_ENTER) return;
    correlate(d->correlation, seq1);
    if (t_runtime_correlation) correlate(t_runtime_correlation, seq1);
}

static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                             size_t valid) {
    clc_cupti_activity *r = NULL;
    while (buffer && cupti.next_record(buffer, valid, &r) == CLC_CUPTI_SUCCESS) {
        if (r->kind != CLC_CUPTI_KIND_CONCURRENT_KERNEL) continue;
        const clc_cupti_kernel *k = (const clc_cupti_kernel *)r;
        /* a record without timestamps (CUPTI could not take them) times nothing */
        if (!k->correlation || !k->start || k->end < k->start) continue;
        _Atomic uint64_t *c = &g_correlations[k->correlation & (CORRELATION_SLOTS - 1)];
        uint64_t word = atomic_load_explicit(c, memory_order_acquire);
        /* each launch's time once, even were a record handed over twice */
        if ((uint32_t)(word >> 32) == k->correlation && atomic_compare_exchange_strong(c, &word, 0))
            deliver((uint32_t)word, k->end - k->start);
    }
    free(buffer);
}

/* ---- libcupti ----------------------------------------------------------------------------- */

typedef struct {
    char path[4096];
    const void *skip; /* an object's base address not to take (clc's own libcupti), or NULL */
} found_object;

/* No loader call from inside dl_iterate_phdr (it holds a loader lock another thread's dlopen
 * may wait behind): the path is copied, and opened after. */
static int find_loaded(struct dl_phdr_info *info, size_t size, void *arg) {
    found_object *f = arg;
    const char *base = strrchr(info->dlpi_name, '/');
    if (!strstr(base ? base : info->dlpi_name, "libcupti.so") ||
        (f->skip && (const void *)info->dlpi_addr == f->skip))
        return 0;
    snprintf(f->path, sizeof f->path, "%s", info->dlpi_name);
    return 1;
}

static const void *base_of(void *handle) {
    struct link_map *map = NULL;
    return handle && dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map ? (void *)map->l_addr : NULL;
}

/* A libcupti the process has loaded (in any scope: Python loads extensions' libraries
 * locally), other than `skip`'s when there is another, or NULL. */
static void *loaded_cupti(void *skip) {
    found_object f = {.skip = base_of(skip)};
    dl_iterate_phdr(find_loaded, &f);
    if (!f.path[0] && skip) return skip;
    return f.path[0] ? clc_libc_dlopen(f.path, RTLD_NOW | RTLD_NOLOAD) : NULL;
}

/* One the program loaded already, else the one clc-run found (CLC_CUPTI), else the loader's. */
static void *open_cupti(const char **why) {
    void *h = loaded_cupti(NULL);
    const char *path = clc_setting("CLC_CUPTI");
    if (!h && path && *path) h = g_own = clc_libc_dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = g_own = clc_libc_dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = g_own = clc_libc_dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) *why = "libcupti not found";
    return h;
}

static void finish_at_exit(void);

/* Why CUPTI said no, in words an administrator can act on; `what` where its code says no more. */
static const char *refusal(result_t r, const char *what) {
    switch (r) {
    case CLC_CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        return "another tool holds CUPTI (it takes one subscriber at a time)";
    case CLC_CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CLC_CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
        return "the driver lets only administrators trace GPU work here "
               "(NVreg_RestrictProfilingToAdminUsers)";
    case CLC_CUPTI_ERROR_NOT_INITIALIZED:
    case CLC_CUPTI_ERROR_NOT_COMPATIBLE:
        return "libcupti does not work with this driver (a libcupti of another CUDA version?)";
    case CLC_CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
    case CLC_CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED:
    case CLC_CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED:
    case CLC_CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED:
    case CLC_CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED:
    case CLC_CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED:
    case CLC_CUPTI_ERROR_NOT_SUPPORTED:
        return "CUPTI cannot trace this device (a virtual GPU, a MIG instance, confidential "
               "computing, WSL)";
    default: return what;
    }
}

static int start(void) {
    const char *mode = clc_setting("CLC_TIMING"), *why = NULL;
    result_t r = CLC_CUPTI_SUCCESS;
    void *h;
    if (mode && strcmp(mode, "events") == 0) return OFF;
    if ((h = open_cupti(&why)) != NULL) {
        cupti.subscribe = clc_libc_dlsym(h, "cuptiSubscribe");
        cupti.unsubscribe = clc_libc_dlsym(h, "cuptiUnsubscribe");
        cupti.enable_callback = clc_libc_dlsym(h, "cuptiEnableCallback");
        cupti.register_callbacks = clc_libc_dlsym(h, "cuptiActivityRegisterCallbacks");
        cupti.enable = clc_libc_dlsym(h, "cuptiActivityEnable");
        cupti.disable = clc_libc_dlsym(h, "cuptiActivityDisable");
        cupti.flush_all = clc_libc_dlsym(h, "cuptiActivityFlushAll");
        cupti.flush_period = clc_libc_dlsym(h, "cuptiActivityFlushPeriod");
        cupti.next_record = clc_libc_dlsym(h, "cuptiActivityGetNextRecord");
        cupti.dropped = clc_libc_dlsym(h, "cuptiActivityGetNumDroppedRecords");
        if (!cupti.subscribe || !cupti.unsubscribe || !cupti.enable_callback ||
            !cupti.register_callbacks || !cupti.enable || !cupti.disable || !cupti.flush_all ||
            !cupti.next_record)
            why = "libcupti lacks the callback or activity API";
    }
    if (!why && !g_launches) {
        g_launches = calloc(LAUNCH_SLOTS, sizeof *g_launches);
        g_correlations = calloc(CORRELATION_SLOTS, sizeof *g_correlations);
        if (!g_launches || !g_correlations) why = "no memory";
    }
    /* CUPTI's rule: a client subscribes first, and gives way when another did */
    if (!why && (r = cupti.subscribe(&g_subscriber, on_launch, NULL)) != CLC_CUPTI_SUCCESS)
        why = refusal(r, "CUPTI refused clc as a subscriber");
    for (size_t i = 0; !why && i < N_OF(CLC_CUPTI_DRIVER_LAUNCHES); i++)
        if ((r = cupti.enable_callback(1, g_subscriber, CLC_CUPTI_DOMAIN_DRIVER,
                                       CLC_CUPTI_DRIVER_LAUNCHES[i])) != CLC_CUPTI_SUCCESS)
            why = refusal(r, "CUPTI refused the launch callbacks");
    for (size_t i = 0; !why && i < N_OF(CLC_CUPTI_RUNTIME_LAUNCHES); i++)
        cupti.enable_callback(1, g_subscriber, CLC_CUPTI_DOMAIN_RUNTIME,
                              CLC_CUPTI_RUNTIME_LAUNCHES[i]);
    if (!why &&
        ((r = cupti.register_callbacks(buffer_requested, buffer_completed)) != CLC_CUPTI_SUCCESS ||
         (r = cupti.enable(CLC_CUPTI_KIND_CONCURRENT_KERNEL)) != CLC_CUPTI_SUCCESS))
        why = refusal(r, "CUPTI refused kernel records");
    if (why) {
        if (g_subscriber) cupti.unsubscribe(g_subscriber);
        g_subscriber = NULL;
        char code[32] = "";
        if (r != CLC_CUPTI_SUCCESS) snprintf(code, sizeof code, " (CUptiResult %d)", r);
        if (mode && strcmp(mode, "cupti") == 0)
            clc_log(CLC_MSG_WARNING, "GPU times come from CUDA events around each launch: %s%s",
                    why, code);
        else
            clc_debug("GPU times come from CUDA events around each launch: %s%s", why, code);
        return OFF;
    }
    if (cupti.flush_period) cupti.flush_period(FLUSH_MS);
    /* registered after libcupti's own exit handlers (it is loaded by now), so run before them */
    atexit(finish_at_exit);
    clc_debug("GPU times come from CUPTI's kernel records");
    return ON;
}

int clc_cupti_on(void) {
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (likely(s)) return s == ON;
    if (pthread_mutex_trylock(&g_state_lock) != 0) return 0; /* being started: events */
    if (!(s = atomic_load_explicit(&g_state, memory_order_relaxed)))
        atomic_store_explicit(&g_state, s = start(), memory_order_release);
    pthread_mutex_unlock(&g_state_lock);
    return s == ON;
}

void clc_cupti_begin(clc_entry *e, uint64_t seq) {
    launch_slot *s = &g_launches[seq & (LAUNCH_SLOTS - 1)];
    atomic_store_explicit(&s->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&s->generation, atomic_load(&g_generation), memory_order_relaxed);
    atomic_store_explicit(&s->entry, e, memory_order_relaxed);
    atomic_store_explicit(&s->seq, seq + 1, memory_order_release);
    if (t_depth < NESTED) t_timed[t_depth] = seq + 1;
    t_depth++;
}

void clc_cupti_end(int launched) {
    if (t_depth) t_depth--;
    if (launched) atomic_fetch_add_explicit(&g_launched, 1, memory_order_relaxed);
}

/* Reads every record CUPTI holds, waiting up to `wait_ns` for those of timed launches still
 * running (never for other work: a program's kernel that waits on its host may never end), and
 * forgets what did not come (a new generation): said once where `say`. Under g_state_lock. */
static void drain_locked(uint64_t wait_ns, int say) {
    uint64_t deadline = clc_now_ns() + wait_ns;
    struct timespec pause = {0, 100000};
    for (;;) {
        cupti.flush_all(CLC_CUPTI_FLUSH_FORCED);
        if (atomic_load(&g_timed) >= atomic_load(&g_launched) || clc_now_ns() > deadline) break;
        nanosleep(&pause, NULL);
        if (pause.tv_nsec < 20000000) pause.tv_nsec *= 2;
    }
    atomic_fetch_add(&g_generation, 1);
    uint64_t launched = atomic_exchange(&g_launched, 0), timed = atomic_exchange(&g_timed, 0);
    size_t dropped = 0;
    if (cupti.dropped) cupti.dropped(NULL, 0, &dropped);
    if (say && launched > timed)
        CLC_WARN_ONCE(
            "%llu timed launches' GPU times did not come back from CUPTI (%llu did; CUPTI "
            "dropped %zu records): their kernels' GPU totals are short",
            (unsigned long long)(launched - timed), (unsigned long long)atomic_load(&g_timed_all),
            dropped);
}

/* At exit, or before a context or a module goes. */
void clc_cupti_drain(void) {
    if (atomic_load_explicit(&g_state, memory_order_acquire) != ON) return;
    pthread_mutex_lock(&g_state_lock);
    if (atomic_load_explicit(&g_state, memory_order_relaxed) == ON) drain_locked(DRAIN_WAIT_NS, 1);
    pthread_mutex_unlock(&g_state_lock);
}

/* Takes clc off CUPTI, leaving it as the program would find it without clc. */
static void leave_cupti_locked(int state, uint64_t wait_ns, int say) {
    int in = t_in_clc;
    t_in_clc = 1;
    drain_locked(wait_ns, say);
    cupti.disable(CLC_CUPTI_KIND_CONCURRENT_KERNEL);
    cupti.unsubscribe(g_subscriber);
    g_subscriber = NULL;
    atomic_store(&g_state, state);
    t_in_clc = in;
}

/* The last reading, before libcupti's own exit handlers: launches after it (in later exit
 * handlers, destructors) are timed by events. */
static void finish_at_exit(void) {
    if (!g_cfg.pid || getpid() != g_cfg.pid) return;
    pthread_mutex_lock(&g_state_lock);
    if (atomic_load(&g_state) == ON) leave_cupti_locked(FINISHED, DRAIN_WAIT_NS, 1);
    pthread_mutex_unlock(&g_state_lock);
}

/* CUPTI does not follow a fork: the child's launches are timed by events, and what the parent
 * had in flight is not the child's. */
void clc_cupti_after_fork_child(void) {
    pthread_mutex_init(&g_state_lock, NULL);
    if (atomic_load(&g_state) == ON || atomic_load(&g_state) == 0) atomic_store(&g_state, OFF);
    g_subscriber = NULL;
    atomic_store(&g_launched, 0);
    atomic_store(&g_timed, 0);
    atomic_store(&g_timed_all, 0);
    atomic_fetch_add(&g_generation, 1);
    t_depth = 0;
    t_runtime_correlation = 0;
}

/* ---- the program's own use of CUPTI ----------------------------------------------------------
 * CUPTI's entry points the program calls to become its client come here first (the shim is
 * preloaded): clc gives CUPTI up, then the call goes on to the program's libcupti. */

static void give_up(void) {
    pthread_mutex_lock(&g_state_lock);
    int was = atomic_load(&g_state);
    if (was == ON) {
        /* what has come back is read; the program's own start is not held up for the rest */
        leave_cupti_locked(GIVEN_UP, 0, 0);
        clc_debug("the program uses CUPTI itself: its later timed launches are timed by CUDA "
                  "events (those still running then are left without a GPU time)");
    } else if (was == 0) {
        atomic_store(&g_state, GIVEN_UP);
    }
    pthread_mutex_unlock(&g_state_lock);
}

/* The program's libcupti: the next definition after the shim's, else one loaded in a local
 * scope, not clc's own copy where the program has another. */
static void *real_cupti(const char *name) {
    void *p = clc_next_symbol(name), *h;
    if (!p && (h = loaded_cupti(g_own)) != NULL) p = clc_libc_dlsym(h, name);
    return p;
}

CLC_EXPORT result_t cuptiSubscribe(void **subscriber, callback_fn callback, void *userdata) {
    result_t (*real)(void **, callback_fn, void *) = real_cupti("cuptiSubscribe");
    if (!real) return CLC_CUPTI_ERROR_NOT_INITIALIZED;
    give_up();
    return real(subscriber, callback, userdata);
}

CLC_EXPORT result_t cuptiSubscribe_v2(void **subscriber, callback_fn callback, void *userdata,
                                      void *params) {
    result_t (*real)(void **, callback_fn, void *, void *) = real_cupti("cuptiSubscribe_v2");
    if (!real) return CLC_CUPTI_ERROR_NOT_INITIALIZED;
    give_up();
    return real(subscriber, callback, userdata, params);
}

CLC_EXPORT result_t cuptiActivityRegisterCallbacks(requested_fn requested, completed_fn completed) {
    result_t (*real)(requested_fn, completed_fn) = real_cupti("cuptiActivityRegisterCallbacks");
    if (!real) return CLC_CUPTI_ERROR_NOT_INITIALIZED;
    give_up();
    return real(requested, completed);
}
