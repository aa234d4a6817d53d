/* SPDX-License-Identifier: Apache-2.0
 *
 * process.c: the process's own events. At start (the constructor, before main) the settings
 * clc-run gave; at a fork, each part's state for the child; at exit, GPU times read back, the
 * engine's exit work, the capture's last records.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

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
    clc_reset_rule_counts();
    clc_bridge_after_fork_child();
    clc_decider_after_fork_child();
    clc_capture_after_fork_child();
    clc_cache_after_fork_child();
    clc_green_after_fork_child();
}

/* Runs in every process that inherits LD_PRELOAD, most of which never touch CUDA: read a few
 * variables and return. */
__attribute__((constructor)) static void clc_init(void) {
    clc_resolve_dlsym();
    clc_log_set_sink(clc_capture_message);
    g_cfg.configured = clc_settings_load();
    const char *v = clc_setting("CLC_VERBOSE");
    g_cfg.verbose = v && *v && strcmp(v, "0") != 0;
    g_cfg.on_error = outcome_from_env(clc_setting("CLC_ON_ERROR"));
    v = clc_setting("CLC_OUTPUT");
    g_cfg.output = v && *v ? v : NULL;
    v = clc_setting("CLC_ROOT_PID");
    g_cfg.root_pid = v ? atoi(v) : 0;
    v = clc_setting("CLC_FORCE");
    g_cfg.force = v && strcmp(v, "1") == 0;
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* ---- exit ------------------------------------------------------------------------------------ */

static void at_exit(void) {
    t_in_clc = 1;
    clc_timing_drain_all();
    clc_bridge_exit();
    clc_capture_finish();
}

/* Registered at the first CUDA activity, after cudart registered its own teardown, so that it
 * runs first (atexit order is reverse) while contexts and events are still alive. */
static void register_exit(void) { atexit(at_exit); }

void clc_ensure_exit_handler(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_exit);
}
