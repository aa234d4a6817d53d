// SPDX-License-Identifier: Apache-2.0
//
// bench_util.h: the clock and the median the benchmark programs share.
#ifndef CLC_BENCH_UTIL_H
#define CLC_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static inline double bench_now_us(void) { return bench_now_ns() / 1e3; }

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Sorts v in place.
static inline double bench_median(double *v, int n) {
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
