/* SPDX-License-Identifier: Apache-2.0
 *
 * clock.c: the time the capture's records carry: CLOCK_MONOTONIC, and launch times from the
 * TSC where the kernel keeps time by it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "records.h"
#include "capture_internal.h"

uint64_t clc_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Launch timestamps. CLOCK_MONOTONIC costs 30-60 ns right after a launch (measured on an
 * H200 host), the TSC about 10. Where the kernel itself keeps time by the TSC (clocksource
 * "tsc"), launch times come from it, converted with a calibration against CLOCK_MONOTONIC
 * that the flusher refreshes every FLUSH_MS; before the first one, and elsewhere,
 * clock_gettime. Calibrations are published by pointer into a small ring, so that a reader
 * never sees one half-written. */

static tsc_calibration g_cal_ring[4];
tsc_calibration *_Atomic g_cal;
static int g_tsc_usable;
uint64_t g_cal_first_tsc, g_cal_first_ns;
static unsigned g_cal_next;

#if defined(__x86_64__)
/* One moment on both clocks: the TSC read between two clock reads, the tightest pair of a few
 * tries (a preempted try would be off by the preemption). */
static void clock_pair(uint64_t *tsc, uint64_t *ns) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = clc_now_ns(), t = __rdtsc(), b = clc_now_ns();
        if (b - a < best) {
            best = b - a;
            *tsc = t;
            *ns = a + (b - a) / 2;
        }
    }
}
#endif

void calibrate(void) {
#if defined(__x86_64__)
    if (!g_tsc_usable) return;
    uint64_t tsc = 0, ns = 0;
    clock_pair(&tsc, &ns);
    if (!g_cal_first_tsc) {
        g_cal_first_tsc = tsc;
        g_cal_first_ns = ns;
        return;
    }
    if (ns - g_cal_first_ns < 10000000ull || tsc <= g_cal_first_tsc) return;
    tsc_calibration *c = &g_cal_ring[g_cal_next++ % 4];
    c->tsc0 = tsc;
    c->ns0 = ns;
    c->mult =
        (uint64_t)(((unsigned __int128)(ns - g_cal_first_ns) << 32) / (tsc - g_cal_first_tsc));
    atomic_store_explicit(&g_cal, c, memory_order_release);
#endif
}

void check_tsc(void) {
    char src[32] = {0};
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource",
                  O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, src, sizeof src - 1);
    close(fd);
    g_tsc_usable = n >= 3 && strncmp(src, "tsc", 3) == 0 && (n == 3 || src[3] == '\n');
}

static CLC_TLS uint64_t t_last_launch_ns;

/* Never earlier than the thread's previous launch: a new calibration may move the clock back
 * by the error of the old one (tens of ns). */
uint64_t clc_launch_time_ns(void) {
    uint64_t ns = 0;
#if defined(__x86_64__)
    const tsc_calibration *c = atomic_load_explicit(&g_cal, memory_order_acquire);
    if (likely(c != NULL)) {
        uint64_t tsc = __rdtsc();
        /* A thread may read the TSC a little before the calibration point was taken. */
        if (likely(tsc >= c->tsc0))
            ns = c->ns0 + (uint64_t)(((unsigned __int128)(tsc - c->tsc0) * c->mult) >> 32);
        else
            ns = c->ns0 - (uint64_t)(((unsigned __int128)(c->tsc0 - tsc) * c->mult) >> 32);
    }
#endif
    if (!ns) ns = clc_now_ns();
    if (unlikely(ns < t_last_launch_ns)) ns = t_last_launch_ns;
    t_last_launch_ns = ns;
    return ns;
}
