/* SPDX-License-Identifier: Apache-2.0
 *
 * priority.c: latency-critical and best-effort processes on one machine, through a board of
 * small files, with no process in between.
 *
 * clc-run decides a process's class from the policy (CLC_PRIORITY: "lc" or "be") and seals it
 * with the other settings; the program cannot change it.
 *
 * The board (CLC_PRIORITY_BOARD) holds a directory per user, `u<uid>`, owned by that user and
 * writable by no one else. A latency-critical process owns one slot file there,
 * `lc.<pid>.<start time>`, mode 0644, mapped shared, made at its first launch. Per GPU (by
 * UUID, since two processes may number their devices differently) it counts the launches made
 * (`launched`, one atomic add per launch) and the launches known finished (`settled`): a
 * synchronization that returned (the context's, or the stream's when every launch since the
 * GPU went busy was on that stream) settles what was launched before it. The GPU is busy for
 * the process while launched != settled. While a thread of it waits in a synchronization the
 * GPU counts as busy however long it takes; otherwise a process that launched nothing for the
 * policy's idle_after_ms counts as idle (it may wait in ways clc does not see). The slot is
 * removed at exit; a crashed process's slot is ignored by its pid and start time, and removed
 * by the next latency-critical process of the same user.
 *
 * A best-effort process reads only the directories of the users it trusts (itself, root, and
 * the users the policy's latency-critical classes name: CLC_PRIORITY_TRUST, "u<uid>" words),
 * every SCAN_NS, and each slot it took (pread through a kept descriptor, checked before each
 * read; never mapped: an owner shrinking the file would kill the reader) at most every
 * READ_EVERY_NS. It holds a launch while a slot says its GPU is busy: it sleeps in steps of
 * HOLD_STEP_NS until the GPU is idle, or until the process (all its threads together) has
 * been held for (1 - floor) x WINDOW_NS of the last WINDOW_NS, by its own clock, whatever the
 * pattern of busy and idle; its launches then go on until held time falls out of the window.
 * With held_share a held launch does not wait: it is confined to that share of the SMs. While a
 * latency-critical process runs on the machine, a best-effort process also keeps at most
 * CLC_PRIORITY_RUN_AHEAD launches queued per stream (an event recorded every RUN_AHEAD_STEP
 * launches, waited for, at most RUN_AHEAD_WAIT_NS, when its turn comes again), so that holding
 * its launches takes effect within a few kernels: the driver queues about a thousand launches
 * per stream before it blocks.
 *
 * A board that cannot be used holds every launch as if a latency-critical process were busy,
 * down to the floor (said once); so does a slot table that is full, or a directory of more
 * entries than a scan reads.
 *
 * Here: the process's class at its start, and its end. The board is board.c's, a
 * latency-critical process's slot latency_critical.c's, a best-effort process's reading,
 * holding and run-ahead bound best_effort.c's.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "priority.h"
#include "priority_internal.h"

/* ---- the process's start and end ----------------------------------------------------------- */

int clc_priority_start(void) {
    const char *c = clc_setting("CLC_PRIORITY");
    if (!c || !*c) return 0;
    g_class = strcmp(c, CLC_PRIORITY_WORD_LC) == 0   ? CLC_PRIORITY_LC
              : strcmp(c, CLC_PRIORITY_WORD_BE) == 0 ? CLC_PRIORITY_BE
                                                     : 0;
    if (!g_class) return 0;
    const char *v;
    /* clc-run checked these; kept in range whatever they say */
    if ((v = clc_setting("CLC_PRIORITY_FLOOR"))) g_floor = strtod(v, NULL);
    if (!(g_floor >= CLC_PRIORITY_FLOOR_MIN && g_floor <= CLC_PRIORITY_FLOOR_MAX))
        g_floor = CLC_PRIORITY_FLOOR_DEFAULT;
    if ((v = clc_setting("CLC_PRIORITY_RUN_AHEAD"))) g_run_ahead = (unsigned)strtoul(v, NULL, 10);
    if (g_run_ahead < CLC_PRIORITY_RUN_AHEAD_MIN || g_run_ahead > CLC_PRIORITY_RUN_AHEAD_MAX)
        g_run_ahead = CLC_PRIORITY_RUN_AHEAD_DEFAULT;
    if ((v = clc_setting("CLC_PRIORITY_IDLE_MS"))) {
        double ms = strtod(v, NULL);
        if (ms > 0 && ms <= CLC_PRIORITY_IDLE_MS_MAX) g_idle_ns = (uint64_t)(ms * 1e6);
    }
    if ((v = clc_setting("CLC_PRIORITY_HELD_SHARE"))) {
        double share = strtod(v, NULL);
        if (share > 0 && share < 1)
            g_held_word = (uint64_t)CLC_CAP_SHARE << CLC_CONFINE_KIND_SHIFT |
                          (uint64_t)(share * 1e6) | CLC_CONFINE_LAST;
    }
    if ((v = clc_setting("CLC_PRIORITY_RESERVE"))) {
        double reserve = strtod(v, NULL);
        if (reserve > 0 && reserve < 1)
            g_reserve_word = (uint64_t)CLC_CAP_SHARE << CLC_CONFINE_KIND_SHIFT |
                             (uint64_t)((1 - reserve) * 1e6) | CLC_CONFINE_LAST;
    }
    if ((v = clc_setting("CLC_PRIORITY_SLO")) && g_class == CLC_PRIORITY_LC) {
        double slo = strtod(v, NULL);
        if (slo > 1 && slo <= CLC_PRIORITY_SLO_MAX) g_slo_milli = (uint32_t)(slo * 1000);
    }
    /* held_share's word at each slo level: the share's millionths halved per level down */
    for (int level = 1; level < 4 && g_held_word; level++) {
        uint64_t millionths = (g_held_word & 0xFFFFFFFFull) >> (3 - level);
        g_held_words[level] = (g_held_word & ~0xFFFFFFFFull) | millionths;
    }
    if (g_class == CLC_PRIORITY_BE) read_trust();
    board_fd();
    if (g_class == CLC_PRIORITY_LC && g_board >= 0) {
        /* a slot of this very process before an exec (same pid, same start time) is no more
         * than a stale one: the new image makes its own at its first launch */
        int dir = user_dir(geteuid(), 0);
        if (dir >= 0) {
            char name[64];
            snprintf(name, sizeof name, "lc.%d.%llu", (int)getpid(),
                     (unsigned long long)start_time_of(getpid()));
            unlinkat(dir, name, 0);
            close(dir);
        }
    }
    clc_debug("priority: %s process, board %s",
              g_class == CLC_PRIORITY_LC ? "latency-critical" : "best-effort", g_board_path);
    return g_class;
}

void clc_priority_leave(int in_signal) {
    struct stat st;
    /* the slot's directory, if the program left its descriptor alone */
    if (slot_now() && g_slot_pid == getpid() && g_slot_dir >= 0 && fstat(g_slot_dir, &st) == 0 &&
        st.st_dev == g_slot_dir_dev && st.st_ino == g_slot_dir_ino)
        unlinkat(g_slot_dir, g_slot_name, 0);
    if (!in_signal && g_class == CLC_PRIORITY_BE && pthread_mutex_trylock(&g_be_lock) == 0) {
        periods_close(clc_now_ns());
        pthread_mutex_unlock(&g_be_lock);
    }
    if (!in_signal && g_class == CLC_PRIORITY_LC && g_slo_milli && g_slot_pid == getpid())
        lc_slo_said();
    if (!in_signal && g_class == CLC_PRIORITY_BE && (g_holds || g_run_ahead_waits) && g_cfg.verbose)
        clc_log(CLC_MSG_INFO,
                "priority: held %llu times, %.1f ms in all (longest %.2f ms, %llu let go by the "
                "floor); %llu waits to keep the run-ahead bound",
                (unsigned long long)g_holds, g_held_ns / 1e6, g_held_max_ns / 1e6,
                (unsigned long long)g_floor_releases, (unsigned long long)g_run_ahead_waits);
}

/* A forked child is a process of its own: a latency-critical one makes its own slot at its
 * first launch (the parent's stays the parent's), a best-effort one has its own holds. */
void clc_priority_after_fork_child(void) {
    pthread_mutex_init(&g_slot_lock, NULL);
    board_slot *slot = slot_now();
    if (g_class == CLC_PRIORITY_LC && slot) {
        munmap(slot, sizeof(board_slot));
        atomic_store(&g_slot, NULL);
        close_kept(g_slot_dir, g_slot_dir_dev, g_slot_dir_ino);
        g_slot_dir = -1;
        memset(g_streams, 0, sizeof g_streams); /* the parent's work is not this process's */
        memset(g_slo, 0, sizeof g_slo);
    }
    if (g_class == CLC_PRIORITY_LC) lc_events_after_fork();
    if (g_class == CLC_PRIORITY_BE) {
        pthread_mutex_init(&g_be_lock, NULL);
        memset(g_rings, 0, sizeof g_rings); /* the parent's events are not this process's */
        g_holding = 0;
        memset(&g_window, 0, sizeof g_window); /* held time is the parent's */
        memset(g_shared_period, 0, sizeof g_shared_period);
        memset(g_reserve_period, 0, sizeof g_reserve_period);
        memset(g_slo_period, 0, sizeof g_slo_period);
        memset(g_slo_level, 0, sizeof g_slo_level);
    }
}
