/* SPDX-License-Identifier: Apache-2.0
 *
 * board.c: the board the priority classes share (priority.c says how): its directory, the
 * users' directories in it, the processes' start times that tell a live slot from a stale one;
 * the process's class and settings.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "priority.h"
#include "priority_internal.h"

int g_class;       /* CLC_PRIORITY_LC, CLC_PRIORITY_BE, or 0 */
int g_board = -1;  /* the board directory, or -1 */
static dev_t g_board_dev; /* what g_board was opened on: checked before each use */
static ino_t g_board_ino;
int g_board_bad;  /* the board cannot be used: every launch held to the floor */
static int g_board_refused; /* ... for good: it is another user's, or others may replace it */
double g_floor = CLC_PRIORITY_FLOOR_DEFAULT;
unsigned g_run_ahead = CLC_PRIORITY_RUN_AHEAD_DEFAULT;
uint64_t g_held_word; /* CLC_ACTION_CONFINE word of a held launch (held_share); 0: wait */
uint64_t g_reserve_word; /* CLC_ACTION_CONFINE word while latency-critical work lives (reserve) */
uint64_t g_held_words[4]; /* held_share's word at each slo level (priority_internal.h) */
/* best-effort: the lock of its views, holds and rings (best_effort.c, run_ahead.c), and the
 * waits that kept run_ahead */
pthread_mutex_t g_be_lock = PTHREAD_MUTEX_INITIALIZER;
uint64_t g_run_ahead_waits;
uint64_t g_idle_ns = CLC_PRIORITY_IDLE_MS_DEFAULT * 1000000ull;
char g_board_path[256];

/* ---- shared: the board directory, users' directories, process start times --------------- */

uint64_t start_time_of(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!p) return 0;
    /* after ")": state is field 3; starttime is field 22 */
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

/* Whether a slot's process is the one that wrote it (its pid now names another process, or
 * none, when it died without removing it). */
int slot_alive(int32_t pid, uint64_t start_time) {
    if (pid <= 0) return 0;
    int signalled = kill(pid, 0) == 0;
    if (!signalled && errno != EPERM) return 0; /* ESRCH: gone */
    uint64_t now = start_time_of(pid);
    /* 0 for another user's process that /proc does not show (hidepid): alive, by kill's word
     * (EPERM); a process this one may signal but not see is not believed */
    return now ? now == start_time : !signalled;
}

void board_unusable(const char *why) {
    g_board_bad = 1;
    CLC_WARN_ONCE("priority: the board %s cannot be used (%s): %s", g_board_path, why,
                  g_class == CLC_PRIORITY_BE
                      ? "every launch of this best-effort process is held to its floor"
                      : "this latency-critical process does not hold best-effort work");
}

/* The board directory, walked without following a link another user controls, made (mode 1777)
 * when it is missing; it must be this user's or root's, and sticky when others may write it. */
static int open_board(void) {
    const char *path = clc_setting("CLC_PRIORITY_BOARD");
    snprintf(g_board_path, sizeof g_board_path, "%s",
             path && *path ? path : CLC_PRIORITY_BOARD_DEFAULT);
    char last[256];
    int parent = clc_open_parent(g_board_path, last, sizeof last);
    if (parent < 0) return -1;
    if (mkdirat(parent, last, 01777) == 0) {
        /* the umask took bits off: set what was asked, through a descriptor of the new one */
        int d = openat(parent, last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d >= 0) {
            fchmod(d, 01777);
            close(d);
        }
    }
    int fd = openat(parent, last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(parent);
    if (fd < 0) return -1;
    struct stat st;
    uid_t me = geteuid();
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_uid != me && st.st_uid != 0) ||
        ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    int kept = fcntl(fd, F_DUPFD_CLOEXEC, 100);
    close(fd);
    if (kept < 0) return -1;
    g_board_dev = st.st_dev;
    g_board_ino = st.st_ino;
    return kept;
}

/* g_board, checked: a program that closed it (and reused its number) gets it opened again. */
int board_fd(void) {
    struct stat st;
    if (g_board >= 0 && fstat(g_board, &st) == 0 && st.st_dev == g_board_dev &&
        st.st_ino == g_board_ino)
        return g_board;
    if (g_board_refused) return -1;
    g_board = open_board(); /* tried again at each scan after a passing failure */
    if (g_board < 0) {
        g_board_refused = errno == EPERM;
        board_unusable(errno == EPERM ? "it is another user's, or others may replace its files"
                                      : strerror(errno));
    } else {
        g_board_bad = 0;
    }
    return g_board;
}

/* The directory of `uid`'s slots, made (mode 0755) when `create` and missing: it must be a
 * directory of that user's (or root's) that no one else may write. -1 with errno (ENOENT,
 * EPERM). */
int user_dir(uid_t uid, int create) {
    int board = board_fd();
    if (board < 0) return -1;
    char name[32];
    snprintf(name, sizeof name, "u%u", (unsigned)uid);
    if (create && mkdirat(board, name, 0755) == 0) {
        int d = openat(board, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d >= 0) {
            fchmod(d, 0755);
            close(d);
        }
    }
    int fd = openat(board, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_uid != uid && st.st_uid != 0) ||
        (st.st_mode & (S_IWGRP | S_IWOTH))) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

/* The per-thread default stream's key (stream_key, priority_internal.h). */
CLC_TLS char t_stream_key;

/* The UUID of a device ordinal of this process; 0 when the driver cannot say. */
int device_uuid(int device, unsigned char out[16]) {
    if (!g_drv.device_get_uuid) return 0;
    return g_drv.device_get_uuid(out, (CUdevice)device) == CUDA_SUCCESS;
}
