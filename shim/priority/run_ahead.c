/* SPDX-License-Identifier: Apache-2.0
 *
 * run_ahead.c: how far a best-effort process's launches run ahead of the GPU while a
 * latency-critical process is on the board: an event every RUN_AHEAD_STEP launches per stream,
 * and a launch waits for the one run_ahead launches before it.
 */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "priority.h"
#include "priority_internal.h"

ahead_ring g_rings[RUN_AHEAD_STREAMS];
#define RING_IDLE_NS 1000000000ull /* a ring whose stream launched nothing for 1 s may be reused */

/* Waits, at most RUN_AHEAD_WAIT_NS, for an event; 0 when it gave up (said once). */
static int wait_event(CUevent ev) {
    CUresult r = g_drv.event_query(ev);
    if (r != CUDA_ERROR_NOT_READY) return 1;
    __atomic_fetch_add(&g_run_ahead_waits, 1, __ATOMIC_RELAXED);
    uint64_t start = clc_now_ns();
    while ((r = g_drv.event_query(ev)) == CUDA_ERROR_NOT_READY) {
        if (clc_now_ns() - start >= RUN_AHEAD_WAIT_NS) {
            CLC_WARN_ONCE("priority: a stream's earlier work did not finish within %llu ms: its "
                          "launches go on, further ahead than run_ahead, until it does (said once)",
                          (unsigned long long)(RUN_AHEAD_WAIT_NS / 1000000));
            return 0;
        }
        struct timespec step = {0, HOLD_STEP_NS};
        nanosleep(&step, NULL);
    }
    return 1;
}

/* Forgets a ring; its events are destroyed when `destroy` (their context is known alive). */
static void forget_ring(ahead_ring *ring, int destroy) {
    for (int e = 0; e < 64 && destroy; e++)
        if (ring->ring[e] && g_drv.event_destroy) g_drv.event_destroy(ring->ring[e]);
    if (destroy && ring->stalled && g_drv.event_destroy) g_drv.event_destroy(ring->stalled);
    memset(ring, 0, sizeof *ring);
}

void bound_run_ahead(CUcontext ctx, CUstream stream, int per_thread, int down) {
    if (!ctx || !g_drv.event_create || !g_drv.event_record || !g_drv.event_query) return;
    unsigned n = (down >= 3 ? RUN_AHEAD_STEP : g_run_ahead >> down) / RUN_AHEAD_STEP;
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    CUstream key = stream_key(stream, per_thread);
    pthread_mutex_lock(&g_be_lock);
    ahead_ring *ring = NULL;
    for (int i = 0; i < RUN_AHEAD_STREAMS && !ring; i++)
        if (g_rings[i].ctx == ctx && g_rings[i].key == key) ring = &g_rings[i];
    uint64_t now = clc_now_ns();
    if (!ring) {
        for (int i = 0; i < RUN_AHEAD_STREAMS && !ring; i++)
            if (!g_rings[i].ctx) ring = &g_rings[i];
        /* all in use: the one idle longest is taken over, when idle for a second (the
         * stream of a thread gone, say); its events are destroyed only when they are this
         * context's (another's may be gone) */
        for (int i = 0; i < RUN_AHEAD_STREAMS && !ring; i++)
            if (now - g_rings[i].last_ns >= RING_IDLE_NS &&
                (!ring || g_rings[i].last_ns < ring->last_ns))
                ring = &g_rings[i];
        if (!ring) {
            pthread_mutex_unlock(&g_be_lock);
            CLC_WARN_ONCE("priority: more than %d streams in use at once: the launches of the "
                          "others are not kept from running ahead (said once)",
                          RUN_AHEAD_STREAMS);
            return;
        }
        if (ring->ctx) forget_ring(ring, ring->ctx == ctx);
        *ring = (ahead_ring){.ctx = ctx, .key = key, .stream = stream, .per_thread = per_thread};
    }
    ring->last_ns = now;
    uint64_t k = ring->launches++;
    if (k % RUN_AHEAD_STEP) {
        pthread_mutex_unlock(&g_be_lock);
        return;
    }
    if (ring->stalled) {
        if (g_drv.event_query(ring->stalled) == CUDA_ERROR_NOT_READY) {
            pthread_mutex_unlock(&g_be_lock);
            return;
        }
        if (g_drv.event_destroy) g_drv.event_destroy(ring->stalled);
        ring->stalled = NULL;
    }
    CUevent *slot = &ring->ring[(k / RUN_AHEAD_STEP) % n];
    CUevent ev = *slot;
    *slot = NULL; /* this thread's until it is recorded again */
    pthread_mutex_unlock(&g_be_lock);
    if (ev && !wait_event(ev)) {
        pthread_mutex_lock(&g_be_lock);
        if (ring->ctx == ctx && ring->key == key && !ring->stalled)
            ring->stalled = ev;
        else if (g_drv.event_destroy)
            g_drv.event_destroy(ev);
        pthread_mutex_unlock(&g_be_lock);
        return;
    }
    if (!ev && g_drv.event_create(&ev, 2 /* CU_EVENT_DISABLE_TIMING */) != CUDA_SUCCESS) return;
    if ((per_thread ? g_drv.event_record_ptsz : g_drv.event_record)(ev, stream) != CUDA_SUCCESS) {
        if (g_drv.event_destroy) g_drv.event_destroy(ev);
        return;
    }
    pthread_mutex_lock(&g_be_lock);
    if (ring->ctx == ctx && ring->key == key && !*slot)
        *slot = ev;
    else if (g_drv.event_destroy)
        g_drv.event_destroy(ev);
    pthread_mutex_unlock(&g_be_lock);
}

void clc_priority_forget_context(CUcontext ctx) {
    if (g_class != CLC_PRIORITY_BE) return;
    pthread_mutex_lock(&g_be_lock);
    for (int i = 0; i < RUN_AHEAD_STREAMS; i++) /* its events went with it */
        if (g_rings[i].ctx == ctx) memset(&g_rings[i], 0, sizeof g_rings[i]);
    pthread_mutex_unlock(&g_be_lock);
}

void clc_priority_forget_stream(CUstream stream) {
    if (g_class != CLC_PRIORITY_BE || !stream) return;
    pthread_mutex_lock(&g_be_lock);
    for (int i = 0; i < RUN_AHEAD_STREAMS; i++)
        if (g_rings[i].ctx && g_rings[i].stream == stream) forget_ring(&g_rings[i], 1);
    pthread_mutex_unlock(&g_be_lock);
}
