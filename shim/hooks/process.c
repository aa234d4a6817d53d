/* SPDX-License-Identifier: Apache-2.0
 *
 * process.c: the process's own events, over its whole life. At start the settings clc-run gave
 * (at the constructor, or at the first hook called before it: a library of the program whose
 * constructor launches runs before the preloaded shim's); at a fork, each part's state for the
 * child; at a change of user or groups, decisions made anew; at exit, GPU times read back and
 * the engine's exit work (an exit handler), then the capture's counts and END record (the
 * shim's destructor, after every exit handler and static destructor). The other ways out are
 * leave.c's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hooks.h"

/* ---- settings and start-up ------------------------------------------------------------------- */

static clc_outcome outcome_from_env(const char *v) {
    /* Recorded, whatever the verdict: the capture says which launches clc could not decide. */
    clc_outcome o = {
        .action = CLC_ACTION_ALLOW, .flags = CLC_FLAG_RECORD, .rule = CLC_RULE_ON_ERROR};
    if (v && strcmp(v, "deny") == 0) {
        o.action = CLC_ACTION_DENY;
        o.error = 800; /* CUDA_ERROR_NOT_PERMITTED */
    }
    return o;
}

static void after_fork_child(void) {
    g_cfg.pid = getpid();
    clc_reset_rule_counts();
    clc_bridge_after_fork_child();
    clc_decider_after_fork_child();
    clc_capture_after_fork_child();
    clc_cache_after_fork_child();
    clc_green_after_fork_child();
    clc_priority_after_fork_child();
    clc_cupti_after_fork_child();
}

/* What a process needs before any hook may act: read a few settings and return (most processes
 * that inherit LD_PRELOAD never touch CUDA). */
static void start(void) {
    clc_resolve_dlsym();
    g_cfg.pid = getpid();
    clc_log_set_sink(clc_capture_message);
    g_cfg.configured = clc_settings_load();
    int deny = 0;
    g_cfg.unsettled = !g_cfg.configured && clc_settings_fallback(&deny);
    const char *v = clc_setting("CLC_VERBOSE");
    g_cfg.verbose = v && *v && strcmp(v, "0") != 0;
    g_cfg.on_error =
        outcome_from_env(g_cfg.unsettled ? (deny ? "deny" : "allow") : clc_setting("CLC_ON_ERROR"));
    v = clc_setting("CLC_OUTPUT");
    g_cfg.output = v && *v ? v : NULL;
    v = clc_setting("CLC_ROOT_PID");
    g_cfg.root_pid = v ? atoi(v) : 0;
    v = clc_setting("CLC_FORCE");
    g_cfg.force = v && strcmp(v, "1") == 0;
    pthread_atfork(NULL, NULL, after_fork_child);
    clc_leave_start();
    if (g_cfg.configured) g_hot.priority = clc_priority_start();
}

/* 0: not started, 1: under way, 2: done. A signal handler that interrupts the start on its own
 * thread goes on with what is set so far; other threads wait for it. */
static _Atomic int g_started;
static CLC_TLS int t_starting;

void clc_start(void) {
    if (likely(atomic_load_explicit(&g_started, memory_order_acquire) == 2)) return;
    int expected = 0;
    if (atomic_compare_exchange_strong(&g_started, &expected, 1)) {
        t_starting = 1;
        start();
        t_starting = 0;
        atomic_store_explicit(&g_started, 2, memory_order_release);
        return;
    }
    while (!t_starting && atomic_load_explicit(&g_started, memory_order_acquire) != 2)
        sched_yield();
}

/* A driver that cannot be placed is said once: its launches get on_error. The thread is inside
 * clc's own work meanwhile: a launch from a signal handler that interrupts it (inside the
 * loader's dlopen, or holding the driver's lock) takes the re-entrant gate instead of waiting
 * for itself. */
int clc_start_driver(void) {
    int was = t_in_clc;
    t_in_clc = 1;
    clc_start();
    int ready = clc_driver_load();
    t_in_clc = was;
    if (ready) return 1;
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_ERROR,
                "the CUDA driver the program calls could not be placed (no cuCtxGetCurrent or "
                "kernel names where its entry points are): its launches get on_error=%s",
                g_cfg.on_error.action == CLC_ACTION_DENY ? "deny" : "allow");
    return 0;
}

__attribute__((constructor)) static void clc_init(void) { clc_start(); }

/* ---- exit -------------------------------------------------------------------------------------
 * exit() runs the exit handlers (atexit, and the static destructors of the program and its
 * libraries) in the reverse order of their registration, then the libraries' destructors. The
 * shim's own exit handler is registered at the first CUDA activity, after cudart registered its
 * teardown, so that it runs first, while contexts and events are still alive: it reads back GPU
 * times and lets the engine run its exit hooks. Launches made after it (handlers registered
 * before the first CUDA call) are decided and recorded as any other; the shim's destructor then
 * writes the counts and the END record. A library's destructor runs after the shim's: its
 * launches are still decided, and each one that is recorded or refused writes the counts and
 * the END record again (clc_late_launch). */

_Atomic int clc_late; /* the shim's destructor has run */

static void at_exit(void) {
    int was = t_in_clc;
    t_in_clc = 1;
    clc_timing_drain_all();
    clc_bridge_exit();
    t_in_clc = was;
}

/* Registered at the first CUDA activity, after cudart registered its own teardown, so that it
 * runs first (atexit order is reverse) while contexts and events are still alive. A process
 * with CUDA activity, and so a capture, also keeps it through a fatal signal. */
static void register_exit(void) {
    atexit(at_exit);
    if (g_cfg.configured && g_cfg.output) clc_signals_start();
}

void clc_ensure_exit_handler(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_exit);
}

__attribute__((destructor)) static void clc_fini(void) {
    if (getpid() != g_cfg.pid) return;
    int was = t_in_clc;
    t_in_clc = 1;
    clc_priority_leave(0);
    clc_capture_finish(CLC_END_EXIT, 0, 0);
    atomic_store(&clc_late, 1);
    t_in_clc = was;
}

void clc_late_launch(void) {
    int was = t_in_clc;
    t_in_clc = 1;
    clc_capture_finish(CLC_END_EXIT, 0, 0);
    t_in_clc = was;
}

/* ---- a change of user or groups -------------------------------------------------------------- */

#define CLC_ID_HOOK(name, params, args)                                                          \
    CLC_EXPORT int name params {                                                                 \
        int (*real) params = (int (*) params)clc_next_symbol(#name);                             \
        int result_ = real ? real args : -1;                                                     \
        if (result_ == 0 && !t_in_clc) {                                                         \
            t_in_clc = 1;                                                                        \
            clc_identity_follow();                                                               \
            t_in_clc = 0;                                                                        \
        }                                                                                        \
        return result_;                                                                          \
    }
CLC_ID_HOOK(setuid, (uid_t uid), (uid))
CLC_ID_HOOK(seteuid, (uid_t uid), (uid))
CLC_ID_HOOK(setreuid, (uid_t r, uid_t e), (r, e))
CLC_ID_HOOK(setresuid, (uid_t r, uid_t e, uid_t s), (r, e, s))
CLC_ID_HOOK(setgid, (gid_t gid), (gid))
CLC_ID_HOOK(setegid, (gid_t gid), (gid))
CLC_ID_HOOK(setregid, (gid_t r, gid_t e), (r, e))
CLC_ID_HOOK(setresgid, (gid_t r, gid_t e, gid_t s), (r, e, s))
CLC_ID_HOOK(setgroups, (size_t n, const gid_t *list), (n, list))
