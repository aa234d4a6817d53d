/* SPDX-License-Identifier: Apache-2.0
 *
 * cupti.c: GPU time of timed launches from CUPTI's kernel activity records: NVIDIA's own
 * start and end of each kernel on the GPU, gathered in buffers off the launch path.
 *
 * clc subscribes to CUPTI's callbacks of the launch entry points (driver and runtime). A timed
 * launch sets its number in a thread-local before the real call; CUPTI calls back inside that
 * call with the API call's correlation id, which the kernel's activity record will carry, and
 * the pair goes into a table. The kernel records come back in buffers, on CUPTI's own thread
 * (every FLUSH_MS or when a buffer fills) or at a forced flush; each one found in the table
 * makes one TIMING record and adds to its kernel's counts, as timing.c's events do. A launch
 * made through cudart carries the runtime call's id or the driver call's: both are entered.
 * Untimed launches pass CUPTI's callback too (a thread-local read) and CUPTI traces their
 * kernels (its cost, docs/performance.md), but nothing of clc's.
 *
 * CUPTI has room for one client. clc takes it only when nobody holds it (cuptiSubscribe says
 * so); a program that comes for it later (torch.profiler, Nsight Systems' injection) calls
 * cuptiSubscribe or cuptiActivityRegisterCallbacks through the exports below, and clc gives
 * CUPTI up to it, as the program would have found it without clc: later timed launches are
 * timed by timing.c's events. Where libcupti is missing or refuses, events time the launches
 * from the start, said once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cupti_abi.h"
#include "shim.h"

#define FLUSH_MS 200
#define BUFFER_BYTES (4u << 20)
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
static void *g_subscriber;

/* 0: not tried, 1: on, -1: not available (events time the launches), -2: given up to the
 * program */
static _Atomic int g_state;
static pthread_mutex_t g_state_lock = PTHREAD_MUTEX_INITIALIZER;

/* Each timed launch's kernel by its number: written before the launch, read when its record
 * comes back. A slot taken again before then (more timed launches in flight than slots) loses
 * the older one's time, counted. */
#define LAUNCH_SLOTS (1u << 18)
typedef struct {
    _Atomic uint64_t seq; /* seq + 1; 0: empty, or being written */
    clc_entry *_Atomic entry;
    _Atomic uint32_t kernel_id;
} launch_slot;
static launch_slot *g_launches;

/* CUPTI's correlation id of each timed launch's API call -> its seq + 1, direct-mapped: a slot
 * is taken again only after CORRELATION_SLOTS more API calls of the process. */
#define CORRELATION_SLOTS (1u << 18)
typedef struct {
    _Atomic uint32_t correlation; /* 0: empty */
    _Atomic uint64_t seq1;
} correlation_slot;
static correlation_slot *g_correlations;

/* The timed launch this thread is making (seq + 1), and the runtime call it is inside */
static CLC_TLS uint64_t t_timed;
static CLC_TLS uint32_t t_runtime_correlation;

/* timed launches made and timed since the last drain; all timed */
static _Atomic uint64_t g_launched, g_timed, g_timed_all;
/* The contexts with timed launches since the last drain: synchronized before it flushes. */
#define CONTEXTS 16
static _Atomic(CUcontext) g_contexts[CONTEXTS];

static void deliver(uint64_t seq1, uint64_t gpu_ns) {
    launch_slot *s = &g_launches[(seq1 - 1) & (LAUNCH_SLOTS - 1)];
    /* read between two reads of its seq: a slot being taken again is seen as changed */
    uint64_t before = atomic_load_explicit(&s->seq, memory_order_acquire);
    clc_entry *e = atomic_load_explicit(&s->entry, memory_order_relaxed);
    uint32_t kernel_id = atomic_load_explicit(&s->kernel_id, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (before != seq1 || atomic_load_explicit(&s->seq, memory_order_relaxed) != seq1 || !e) return;
    atomic_fetch_add_explicit(&g_timed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_timed_all, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->timed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->gpu_ns, gpu_ns, memory_order_relaxed);
    if (clc_capture_enabled()) {
        clc_rec_timing rec = {
            .seq = seq1 - 1, .kernel_id = kernel_id, .source = CLC_TIMING_CUPTI, .gpu_ns = gpu_ns};
        clc_capture_write(CLC_REC_TIMING, &rec, sizeof rec, NULL, 0);
    }
}

static void correlate(uint32_t correlation, uint64_t seq1) {
    correlation_slot *c = &g_correlations[correlation & (CORRELATION_SLOTS - 1)];
    atomic_store_explicit(&c->correlation, 0, memory_order_relaxed);
    atomic_store_explicit(&c->seq1, seq1, memory_order_relaxed);
    atomic_store_explicit(&c->correlation, correlation, memory_order_release);
}

/* CUPTI's callback, inside each launch call of the program (and of clc's own replacements). */
static void on_launch(void *userdata, uint32_t domain, uint32_t cbid, const void *data) {
    const clc_cupti_callback_data *d = data;
    if (domain == CLC_CUPTI_DOMAIN_RUNTIME) {
        t_runtime_correlation = d->site == CLC_CUPTI_API_ENTER ? d->correlation : 0;
        return;
    }
    uint64_t seq1 = t_timed;
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
        correlation_slot *c = &g_correlations[k->correlation & (CORRELATION_SLOTS - 1)];
        uint32_t expected = k->correlation;
        if (!k->correlation || k->end < k->start ||
            atomic_load_explicit(&c->correlation, memory_order_acquire) != expected)
            continue;
        uint64_t seq1 = atomic_load_explicit(&c->seq1, memory_order_relaxed);
        /* each launch's time once, even were a record handed over twice */
        if (atomic_compare_exchange_strong(&c->correlation, &expected, 0))
            deliver(seq1, k->end - k->start);
    }
    free(buffer);
}

/* ---- libcupti ----------------------------------------------------------------------------- */

static int find_loaded(struct dl_phdr_info *info, size_t size, void *arg) {
    const char *base = strrchr(info->dlpi_name, '/');
    if (!strstr(base ? base : info->dlpi_name, "libcupti.so")) return 0;
    *(void **)arg = clc_libc_dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
    return *(void **)arg != NULL;
}

/* The libcupti the program has loaded (in any scope: Python loads extensions' libraries
 * locally), or NULL. */
static void *loaded_cupti(void) {
    void *h = NULL;
    dl_iterate_phdr(find_loaded, &h);
    return h;
}

/* One the program loaded already, else the one clc-run found (CLC_CUPTI), else the loader's. */
static void *open_cupti(const char **why) {
    void *h = loaded_cupti();
    const char *path = clc_setting("CLC_CUPTI");
    if (!h && path && *path) h = clc_libc_dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = clc_libc_dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = clc_libc_dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) *why = "libcupti not found";
    return h;
}

static int start(void) {
    const char *mode = clc_setting("CLC_TIMING"), *why = NULL;
    result_t r = CLC_CUPTI_SUCCESS;
    void *h;
    if (mode && strcmp(mode, "events") == 0) return -1;
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
    if (!why) {
        g_launches = calloc(LAUNCH_SLOTS, sizeof *g_launches);
        g_correlations = calloc(CORRELATION_SLOTS, sizeof *g_correlations);
        if (!g_launches || !g_correlations) why = "no memory";
    }
    /* CUPTI's rule: a client subscribes first, and gives way when another did */
    if (!why && (r = cupti.subscribe(&g_subscriber, on_launch, NULL)) != CLC_CUPTI_SUCCESS)
        why = "another tool holds CUPTI";
    for (size_t i = 0; !why && i < N_OF(CLC_CUPTI_DRIVER_LAUNCHES); i++)
        if ((r = cupti.enable_callback(1, g_subscriber, CLC_CUPTI_DOMAIN_DRIVER,
                                       CLC_CUPTI_DRIVER_LAUNCHES[i])) != CLC_CUPTI_SUCCESS)
            why = "CUPTI refused the launch callbacks";
    for (size_t i = 0; !why && i < N_OF(CLC_CUPTI_RUNTIME_LAUNCHES); i++)
        cupti.enable_callback(1, g_subscriber, CLC_CUPTI_DOMAIN_RUNTIME,
                              CLC_CUPTI_RUNTIME_LAUNCHES[i]);
    if (!why &&
        ((r = cupti.register_callbacks(buffer_requested, buffer_completed)) != CLC_CUPTI_SUCCESS ||
         (r = cupti.enable(CLC_CUPTI_KIND_CONCURRENT_KERNEL)) != CLC_CUPTI_SUCCESS))
        why = "CUPTI refused kernel records";
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
        return -1;
    }
    if (cupti.flush_period) cupti.flush_period(FLUSH_MS);
    clc_debug("GPU times come from CUPTI's kernel records");
    return 1;
}

int clc_cupti_on(void) {
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (likely(s)) return s > 0;
    pthread_mutex_lock(&g_state_lock);
    if (!(s = atomic_load_explicit(&g_state, memory_order_relaxed)))
        atomic_store_explicit(&g_state, s = start(), memory_order_release);
    pthread_mutex_unlock(&g_state_lock);
    return s > 0;
}

static void note_context(void) {
    CUcontext ctx = NULL;
    if (g_drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) return;
    for (int i = 0; i < CONTEXTS; i++) {
        CUcontext c = atomic_load_explicit(&g_contexts[i], memory_order_relaxed);
        if (c == ctx) return;
        if (!c) {
            CUcontext none = NULL;
            if (atomic_compare_exchange_strong(&g_contexts[i], &none, ctx) || none == ctx) return;
        }
    }
}

void clc_cupti_begin(clc_entry *e, uint64_t seq) {
    launch_slot *s = &g_launches[seq & (LAUNCH_SLOTS - 1)];
    atomic_store_explicit(&s->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&s->entry, e, memory_order_relaxed);
    atomic_store_explicit(&s->kernel_id, e->kernel_id, memory_order_relaxed);
    atomic_store_explicit(&s->seq, seq + 1, memory_order_release);
    note_context();
    t_timed = seq + 1;
}

void clc_cupti_end(int launched) {
    t_timed = 0;
    if (launched) atomic_fetch_add_explicit(&g_launched, 1, memory_order_relaxed);
}

/* At exit, or before a context or a module goes: the contexts with timed launches are
 * synchronized and every record CUPTI holds is read; the launch numbers still waiting are
 * forgotten then, so that no later record counts for an entry that may have gone. */
void clc_cupti_drain(void) {
    if (atomic_load_explicit(&g_state, memory_order_acquire) <= 0) return;
    pthread_mutex_lock(&g_state_lock); /* not given up to the program meanwhile */
    if (atomic_load_explicit(&g_state, memory_order_relaxed) <= 0) {
        pthread_mutex_unlock(&g_state_lock);
        return;
    }
    CUcontext mine = NULL;
    g_drv.ctx_get_current(&mine);
    for (int i = 0; i < CONTEXTS; i++) {
        CUcontext c = atomic_exchange(&g_contexts[i], NULL);
        if (c && g_drv.ctx_set_current && g_drv.ctx_synchronize &&
            g_drv.ctx_set_current(c) == CUDA_SUCCESS)
            g_drv.ctx_synchronize();
    }
    if (g_drv.ctx_set_current) g_drv.ctx_set_current(mine);
    cupti.flush_all(CLC_CUPTI_FLUSH_FORCED);
    for (uint32_t i = 0; i < LAUNCH_SLOTS; i++) atomic_store(&g_launches[i].seq, 0);
    uint64_t launched = atomic_exchange(&g_launched, 0), timed = atomic_exchange(&g_timed, 0);
    size_t dropped = 0;
    if (cupti.dropped) cupti.dropped(NULL, 0, &dropped);
    if (launched > timed && CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "%llu timed launches' GPU times did not come back from CUPTI (%llu did; CUPTI "
                "dropped %zu records): their kernels' GPU totals are short",
                (unsigned long long)(launched - timed),
                (unsigned long long)atomic_load(&g_timed_all), dropped);
    pthread_mutex_unlock(&g_state_lock);
}

/* ---- the program's own use of CUPTI ----------------------------------------------------------
 * CUPTI's entry points the program calls to become its client come here first (the shim is
 * preloaded): clc gives CUPTI up, then the call goes on to the program's libcupti. */

static void give_up(void) {
    pthread_mutex_lock(&g_state_lock);
    int was = atomic_exchange(&g_state, -2);
    if (was > 0) {
        int in = t_in_clc;
        t_in_clc = 1;
        /* what CUPTI holds of clc's launches goes to clc first; then CUPTI as the program
         * would find it without clc */
        cupti.flush_all(CLC_CUPTI_FLUSH_FORCED);
        cupti.disable(CLC_CUPTI_KIND_CONCURRENT_KERNEL);
        cupti.unsubscribe(g_subscriber);
        g_subscriber = NULL;
        t_in_clc = in;
        uint64_t left = atomic_load(&g_launched) - atomic_load(&g_timed);
        clc_debug("the program uses CUPTI itself: its later timed launches are timed by CUDA "
                  "events%s",
                  left ? " (launches still running then are left without a GPU time)" : "");
    }
    pthread_mutex_unlock(&g_state_lock);
}

static void *real_cupti(const char *name) {
    void *p = clc_next_symbol(name), *h;
    if (!p && (h = loaded_cupti()) != NULL) p = clc_libc_dlsym(h, name);
    return p;
}

CLC_EXPORT result_t cuptiSubscribe(void **subscriber, callback_fn callback, void *userdata) {
    result_t (*real)(void **, callback_fn, void *) = real_cupti("cuptiSubscribe");
    if (!real) return CLC_CUPTI_ERROR_UNKNOWN;
    give_up();
    return real(subscriber, callback, userdata);
}

CLC_EXPORT result_t cuptiSubscribe_v2(void **subscriber, callback_fn callback, void *userdata,
                                      void *params) {
    result_t (*real)(void **, callback_fn, void *, void *) = real_cupti("cuptiSubscribe_v2");
    if (!real) return CLC_CUPTI_ERROR_UNKNOWN;
    give_up();
    return real(subscriber, callback, userdata, params);
}

CLC_EXPORT result_t cuptiActivityRegisterCallbacks(requested_fn requested, completed_fn completed) {
    result_t (*real)(requested_fn, completed_fn) = real_cupti("cuptiActivityRegisterCallbacks");
    if (!real) return CLC_CUPTI_ERROR_UNKNOWN;
    give_up();
    return real(requested, completed);
}
