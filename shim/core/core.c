/* SPDX-License-Identifier: Apache-2.0
 *
 * core.c: what every part of the shim uses: the process-wide settings (g_cfg, filled by
 * process.c), the recursion guard, the log, and a lock waited for a bounded time. The bottom
 * layer: it calls no other file.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

clc_settings g_cfg;
CLC_TLS int t_in_clc;

/* ---- logging -------------------------------------------------------------------------------- */

/* Where warnings and errors go besides stderr: the capture, once process.c has set it. */
static clc_log_sink g_log_sink;

void clc_log_set_sink(clc_log_sink sink) { g_log_sink = sink; }

_Atomic uint64_t clc_default_signals;

void clc_signals_hold(sigset_t *old) {
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    sigset_t held;
    sigfillset(&held);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&held, faults[i]);
    uint64_t dfl = atomic_load_explicit(&clc_default_signals, memory_order_relaxed);
    for (int sig = 1; dfl && sig <= 64; sig++, dfl >>= 1)
        if (dfl & 1) sigdelset(&held, sig);
    pthread_sigmask(SIG_BLOCK, &held, old);
}

int clc_lock_within(pthread_mutex_t *m, int ms) {
    if (ms <= 0) return pthread_mutex_lock(m) == 0;
    for (int waited = 0; waited < ms * 10; waited++) {
        if (pthread_mutex_trylock(m) == 0) return 1;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* A message: on stderr from warnings up (every one with -v), into the capture when `keep`. */
static void say(int level, int keep, const char *fmt, va_list ap) {
    char buf[1024];
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    if (level > CLC_MSG_INFO || g_cfg.verbose) {
        char line[1100];
        int m = snprintf(line, sizeof line, "clc: %s\n", buf);
        if (m > 0) (void)!write(2, line, (size_t)(m < (int)sizeof line ? m : (int)sizeof line - 1));
    }
    if (keep && g_log_sink) g_log_sink(level, buf, (size_t)n);
}

void clc_log(int level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(level, level > CLC_MSG_INFO, fmt, ap);
    va_end(ap);
}

void clc_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(CLC_MSG_INFO, 1, fmt, ap);
    va_end(ap);
}
