/* SPDX-License-Identifier: Apache-2.0
 *
 * timing.c: GPU time of a launch: from CUPTI's kernel records where CUPTI is present
 * (cupti.c), else from two CUDA events recorded on its stream around it.
 *
 * The launching thread never waits for the GPU: each measurement goes into the thread's FIFO
 * and is read back (cuEventQuery) at that thread's later timed launches, oldest first, and at
 * exit or before a context is torn down (cuEventSynchronize). Event pairs are pooled per
 * thread, and the pools are emptied at a teardown. A stream being captured into
 * a graph is not timed: an event recorded there becomes a graph node and measures nothing.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "records.h"

#define FIFO_SIZE 1024
#define POOL_SIZE 64
/* Launches of one thread between begin and end at once: one, but for a multi-device cooperative
 * call, whose launches (one per device) all begin before the driver's call and end after it. */
#define OPEN_SIZE 32

struct clc_timing {
    CUevent start, end;
    CUcontext ctx;
    clc_entry *entry;
    uint64_t seq;
};

typedef struct tstate {
    atomic_flag busy; /* the owner and the exit drain; never contended in steady state */
    clc_timing fifo[FIFO_SIZE];
    uint32_t first, count;
    clc_timing pool[POOL_SIZE];
    uint32_t pooled;
    clc_timing open[OPEN_SIZE]; /* between begin and end of a launch */
    uint32_t opened;             /* bit i: open[i] is in use */
    struct tstate *next;
} tstate;

static tstate *_Atomic g_states;
static CLC_TLS tstate *t_state;

static tstate *state(void) {
    if (likely(t_state != NULL)) return t_state;
    tstate *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    atomic_flag_clear(&s->busy);
    tstate *old = atomic_load(&g_states);
    do s->next = old;
    while (!atomic_compare_exchange_weak(&g_states, &old, s));
    t_state = s;
    return s;
}

static void lock(tstate *s) {
    while (atomic_flag_test_and_set_explicit(&s->busy, memory_order_acquire)) {
    }
}
static void unlock(tstate *s) { atomic_flag_clear_explicit(&s->busy, memory_order_release); }

static void destroy_pair(clc_timing *t) {
    g_drv.event_destroy(t->start);
    g_drv.event_destroy(t->end);
}

static void release_pair(tstate *s, clc_timing *t) {
    if (s->pooled < POOL_SIZE) {
        s->pool[s->pooled++] = *t;
        return;
    }
    destroy_pair(t);
}

static void finish(tstate *s, clc_timing *t, int wait) {
    float ms = 0;
    CUresult r = wait ? g_drv.event_synchronize(t->end) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) r = g_drv.event_elapsed(&ms, t->start, t->end);
    if (r == CUDA_SUCCESS && t->entry) {
        clc_capture_gpu_time(t->entry, t->seq, (uint64_t)((double)ms * 1e6 + 0.5),
                             CLC_TIMING_EVENTS);
    } else if (r != CUDA_SUCCESS) {
        CLC_WARN_ONCE("a launch's GPU time was lost (CUresult %d)", r);
    }
    release_pair(s, t);
}

/* Read back what the GPU has finished, oldest first, without waiting. */
static void poll(tstate *s) {
    while (s->count) {
        clc_timing *t = &s->fifo[s->first];
        if (g_drv.event_query(t->end) != CUDA_SUCCESS) return;
        finish(s, t, 0);
        s->first = (s->first + 1) % FIFO_SIZE;
        s->count--;
    }
}

/* The bit of s->opened for the open slot t. */
static uint32_t slot_bit(const tstate *s, const clc_timing *t) {
    return 1u << (unsigned)(t - s->open);
}

/* A slot given back by a begin that failed after taking it. */
static void close_slot(tstate *s, clc_timing *t) {
    lock(s);
    s->opened &= ~slot_bit(s, t);
    unlock(s);
}

/* What a launch timed by CUPTI holds between begin and end: nothing of its own. */
static clc_timing g_by_cupti;
static CLC_TLS int t_events_only;

void clc_timing_events_only(int on) { t_events_only = on; }

int clc_timing_begin(clc_timing **out, CUstream stream, int ptsz, clc_entry *e, uint64_t seq) {
    *out = NULL;
    int capturing;
    if (clc_stream_capture_status(stream, ptsz, &capturing) == CUDA_SUCCESS &&
        capturing != CU_STREAM_CAPTURE_STATUS_NONE)
        return -1;
    if (!t_events_only && clc_cupti_on()) {
        clc_cupti_begin(e, seq);
        *out = &g_by_cupti;
        return 0;
    }
    if (!g_drv.event_create || !g_drv.event_record || !g_drv.event_elapsed) return -1;
    tstate *s = state();
    if (!s) return -1;
    CUcontext ctx = NULL;
    g_drv.ctx_get_current(&ctx);
    lock(s);
    if (s->opened == (uint32_t)((1ull << OPEN_SIZE) - 1)) {
        unlock(s);
        CLC_WARN_ONCE("more than %d launches of one thread were being timed at once: the "
                      "others are not timed",
                      OPEN_SIZE);
        return -1;
    }
    clc_timing *t = &s->open[__builtin_ctz(~s->opened)];
    s->opened |= slot_bit(s, t);
    memset(t, 0, sizeof *t);
    for (uint32_t i = s->pooled; i-- > 0;) {
        if (s->pool[i].ctx == ctx) {
            *t = s->pool[i];
            s->pool[i] = s->pool[--s->pooled];
            break;
        }
    }
    unlock(s);
    if (!t->start) {
        if (g_drv.event_create(&t->start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
            close_slot(s, t);
            return -1;
        }
        if (g_drv.event_create(&t->end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
            g_drv.event_destroy(t->start);
            close_slot(s, t);
            return -1;
        }
        t->ctx = ctx;
    }
    if ((ptsz ? g_drv.event_record_ptsz : g_drv.event_record)(t->start, stream) != CUDA_SUCCESS) {
        destroy_pair(t);
        close_slot(s, t);
        return -1;
    }
    *out = t;
    return 0;
}

void clc_timing_end(clc_timing *t, CUstream stream, int ptsz, clc_entry *e, uint64_t seq) {
    if (t == &g_by_cupti) {
        clc_cupti_end(e != NULL);
        return;
    }
    tstate *s = t_state;
    lock(s);
    s->opened &= ~slot_bit(s, t); /* t is read below under the lock, before a begin retakes it */
    if (!e) {
        release_pair(s, t);
        unlock(s);
        return;
    }
    if ((ptsz ? g_drv.event_record_ptsz : g_drv.event_record)(t->end, stream) != CUDA_SUCCESS) {
        destroy_pair(t);
        unlock(s);
        return;
    }
    t->entry = e;
    t->seq = seq;
    if (s->count == FIFO_SIZE) {
        /* The GPU is a whole FIFO behind: wait for the oldest rather than lose it. */
        finish(s, &s->fifo[s->first], 1);
        s->first = (s->first + 1) % FIFO_SIZE;
        s->count--;
    }
    s->fifo[(s->first + s->count) % FIFO_SIZE] = *t;
    s->count++;
    poll(s);
    unlock(s);
}

void clc_timing_drain_all(void) {
    if (!clc_driver_ready()) return;
    clc_cupti_drain();
    if (!g_drv.event_synchronize) return;
    CUcontext mine = NULL;
    g_drv.ctx_get_current(&mine);
    for (tstate *s = atomic_load(&g_states); s; s = s->next) {
        lock(s);
        while (s->count) {
            clc_timing *t = &s->fifo[s->first];
            if (g_drv.ctx_set_current) g_drv.ctx_set_current(t->ctx);
            finish(s, t, 1);
            s->first = (s->first + 1) % FIFO_SIZE;
            s->count--;
        }
        /* The pooled events may belong to the context about to go: a context retained
         * again later can have the same handle, and its dead events must not be reused. */
        while (s->pooled) destroy_pair(&s->pool[--s->pooled]);
        unlock(s);
    }
    if (g_drv.ctx_set_current) g_drv.ctx_set_current(mine);
}
