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
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "priority.h"

#define BOARD_MAGIC 0x3144524f42434c43ull /* "CLCBORD1" */
#define BOARD_VERSION 1
#define BOARD_DEVICES 16
#define MAX_SLOTS 64
#define MAX_TRUSTED 256            /* users whose directories a best-effort process reads */
#define MAX_ENTRIES 1024           /* directory entries one scan reads, all directories */
#define SCAN_NS 50000000ull        /* the directories are read again after 50 ms */
#define HOLD_STEP_NS 20000ull      /* a held launch looks again every 20 us */
#define WINDOW_NS 100000000ull     /* the floor: at most (1 - floor) x 100 ms held in any 100 ms */
#define FLOOR_BUCKET_NS 1000000ull /* held time is counted per millisecond */
#define FLOOR_BUCKETS (WINDOW_NS / FLOOR_BUCKET_NS + 1) /* a window, and the bucket it begins in */
#define RUN_AHEAD_STEP 4           /* an event every 4 launches */
#define RUN_AHEAD_STREAMS 32       /* streams kept from running ahead */
#define RUN_AHEAD_WAIT_NS 200000000ull /* a run-ahead wait gives up after 200 ms */
#define DEFAULT_BOARD "/dev/shm/clc-board"
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

typedef struct {
    unsigned char uuid[16];
    _Atomic uint32_t used;    /* 1 once uuid is written */
    _Atomic uint32_t waiting; /* threads of the process inside a synchronization */
    _Atomic uint64_t launched;
    _Atomic uint64_t settled;
    _Atomic uint64_t busy_since_ns; /* CLOCK_MONOTONIC when the GPU last went busy */
} __attribute__((aligned(64))) board_row;

typedef struct {
    uint64_t magic;
    uint32_t version, size;
    int32_t pid;
    uint32_t uid;
    uint64_t start_time; /* /proc/<pid>/stat's starttime, in clock ticks after boot */
    char class_name[32];
    board_row rows[BOARD_DEVICES];
} __attribute__((aligned(64))) board_slot;
_Static_assert(sizeof(board_row) == 64, "one cache line per GPU");

static int g_class;       /* CLC_PRIORITY_LC, CLC_PRIORITY_BE, or 0 */
static int g_board = -1;  /* the board directory, or -1 */
static dev_t g_board_dev; /* what g_board was opened on: checked before each use */
static ino_t g_board_ino;
static int g_board_bad;  /* the board cannot be used: every launch held to the floor */
static int g_board_refused; /* ... for good: it is another user's, or others may replace it */
static double g_floor = 0.1;
static unsigned g_run_ahead = 32;
static uint64_t g_held_word; /* CLC_ACTION_CONFINE word of a held launch (held_share); 0: wait */
static uint64_t g_idle_ns = 20000000ull;
static char g_board_path[256];

/* ---- shared: the board directory, users' directories, process start times --------------- */

static uint64_t start_time_of(pid_t pid) {
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
static int slot_alive(int32_t pid, uint64_t start_time) {
    if (pid <= 0) return 0;
    int signalled = kill(pid, 0) == 0;
    if (!signalled && errno != EPERM) return 0; /* ESRCH: gone */
    uint64_t now = start_time_of(pid);
    /* 0 for another user's process that /proc does not show (hidepid): alive, by kill's word
     * (EPERM); a process this one may signal but not see is not believed */
    return now ? now == start_time : !signalled;
}

static void board_unusable(const char *why) {
    g_board_bad = 1;
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING, "priority: the board %s cannot be used (%s): %s", g_board_path,
                why,
                g_class == CLC_PRIORITY_BE
                    ? "every launch of this best-effort process is held to its floor"
                    : "this latency-critical process does not hold best-effort work");
}

/* The board directory, walked without following a link another user controls, made (mode 1777)
 * when it is missing; it must be this user's or root's, and sticky when others may write it. */
static int open_board(void) {
    const char *path = clc_setting("CLC_PRIORITY_BOARD");
    snprintf(g_board_path, sizeof g_board_path, "%s", path && *path ? path : DEFAULT_BOARD);
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
static int board_fd(void) {
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
static int user_dir(uid_t uid, int create) {
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

/* A stream as the board tells streams apart: the per-thread default stream is the thread's
 * own, the legacy one the process's. */
static CLC_TLS char t_stream_key;
static CUstream stream_key(CUstream stream, int ptsz) {
    if (stream == NULL) return ptsz ? (CUstream)&t_stream_key : CU_STREAM_LEGACY;
    if (stream == CU_STREAM_PER_THREAD) return (CUstream)&t_stream_key;
    return stream;
}

/* The UUID of a device ordinal of this process; 0 when the driver cannot say. */
static int device_uuid(int device, unsigned char out[16]) {
    if (!g_drv.device_get_uuid) return 0;
    return g_drv.device_get_uuid(out, (CUdevice)device) == CUDA_SUCCESS;
}

/* ---- latency-critical: the slot this process writes -------------------------------------- */

static board_slot *_Atomic g_slot; /* published once its header and g_slot_pid are written */
static char g_slot_name[64];
static pid_t g_slot_pid;   /* the process the slot is of (a forked child makes its own) */
static pid_t g_slot_tried;        /* the process that last tried to make one, and when */
static uint64_t g_slot_tried_ns;
static int g_slot_dir = -1;
static dev_t g_slot_dir_dev;
static ino_t g_slot_dir_ino;
/* per GPU: the stream key of every launch since the GPU went busy; MULTI_STREAM when several */
#define MULTI_STREAM ((CUstream)(uintptr_t)-1)
static CUstream _Atomic g_busy_stream[BOARD_DEVICES];

/* Slots of this user's processes that died without removing them. */
static void remove_dead_slots(int dir) {
    int dfd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0) close(dfd);
        return;
    }
    struct dirent *de;
    for (int n = 0; n < MAX_ENTRIES && (de = readdir(d)) != NULL; n++) {
        int pid;
        unsigned long long start;
        char rest;
        if (sscanf(de->d_name, "lc.%d.%llu%c", &pid, &start, &rest) == 2 && !slot_alive(pid, start))
            unlinkat(dir, de->d_name, 0);
    }
    closedir(d);
}

static void lc_open_slot(void) {
    pid_t pid = getpid();
    g_slot_tried = pid;
    g_slot_tried_ns = clc_now_ns();
    uid_t me = geteuid();
    int dir = user_dir(me, 1);
    if (dir < 0) {
        if (!g_board_bad)
            board_unusable(errno == EPERM ? "this user's directory there is another user's, or "
                                            "others may write it"
                                          : strerror(errno));
        return;
    }
    remove_dead_slots(dir);
    uint64_t start = start_time_of(pid);
    snprintf(g_slot_name, sizeof g_slot_name, "lc.%d.%llu", (int)pid, (unsigned long long)start);
    int fd = openat(dir, g_slot_name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
        /* this very process's, before an exec (same pid, same start time): made anew */
        struct stat st;
        fd = openat(dir, g_slot_name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me ||
                        st.st_nlink != 1 || ftruncate(fd, 0) != 0)) {
            close(fd);
            fd = -1;
            errno = EEXIST;
        }
    }
    if (fd < 0) {
        board_unusable(strerror(errno));
        close(dir);
        return;
    }
    fchmod(fd, 0644); /* whatever the umask: best-effort processes of other users read it */
    /* The pages are allocated now (posix_fallocate), not at the first write to the mapping:
     * a full file system would kill the process then (SIGBUS). */
    board_slot *s = MAP_FAILED;
    int err = posix_fallocate(fd, 0, sizeof(board_slot));
    if (err == 0)
        s = mmap(NULL, sizeof(board_slot), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    else
        errno = err;
    close(fd);
    if (s == MAP_FAILED) {
        unlinkat(dir, g_slot_name, 0);
        board_unusable(strerror(errno));
        close(dir);
        return;
    }
    s->version = BOARD_VERSION;
    s->size = sizeof(board_slot);
    s->pid = pid;
    s->uid = me;
    s->start_time = start;
    const char *name = clc_setting("CLC_PRIORITY_NAME");
    snprintf(s->class_name, sizeof s->class_name, "%s", name ? name : "");
    atomic_thread_fence(memory_order_release);
    s->magic = BOARD_MAGIC; /* readers take a slot only once this is written */
    struct stat st;
    if (fstat(dir, &st) == 0) g_slot_dir_dev = st.st_dev, g_slot_dir_ino = st.st_ino;
    g_slot_dir = fcntl(dir, F_DUPFD_CLOEXEC, 100);
    close(dir);
    g_slot_pid = pid;
    atomic_store_explicit(&g_slot, s, memory_order_release);
}

static inline board_slot *slot_now(void) {
    return atomic_load_explicit(&g_slot, memory_order_acquire);
}

/* The slot's row for `device`: the slot made at the process's first launch, the row's UUID at
 * the first launch on the device. */
static pthread_mutex_t g_slot_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) static board_row *lc_row_slow(int device) {
    int was = t_in_clc;
    t_in_clc = 1; /* a signal handler's launch on this thread takes the re-entrant gate */
    pthread_mutex_lock(&g_slot_lock);
    board_row *r = NULL;
    /* tried again a second after a failure (a file system full for a moment) */
    if (!slot_now() &&
        (g_slot_tried != getpid() || clc_now_ns() - g_slot_tried_ns >= 1000000000ull))
        lc_open_slot();
    board_slot *slot = slot_now();
    if (slot && g_slot_pid == getpid()) {
        r = &slot->rows[device];
        if (!atomic_load_explicit(&r->used, memory_order_acquire)) {
            if (device_uuid(device, r->uuid))
                atomic_store_explicit(&r->used, 1, memory_order_release);
            else
                r = NULL;
        }
    }
    pthread_mutex_unlock(&g_slot_lock);
    t_in_clc = was;
    return r;
}

void clc_priority_lc_launch(int device, CUstream stream, int ptsz) {
    if (unlikely((unsigned)device >= BOARD_DEVICES)) {
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "priority: device %d is beyond the board's %d GPUs: its "
                    "launches do not hold best-effort work",
                    device, BOARD_DEVICES);
        return;
    }
    board_slot *slot = slot_now();
    board_row *r = slot ? &slot->rows[device] : NULL;
    if (unlikely(!r || !atomic_load_explicit(&r->used, memory_order_acquire)) &&
        !(r = lc_row_slow(device)))
        return;
    CUstream key = stream_key(stream, ptsz);
    uint64_t before = atomic_fetch_add_explicit(&r->launched, 1, memory_order_acq_rel);
    if (before == atomic_load_explicit(&r->settled, memory_order_acquire)) {
        /* went busy: the stream is its, unless another thread's launch got there first */
        CUstream expected = NULL;
        if (!atomic_compare_exchange_strong(&g_busy_stream[device], &expected, key) &&
            expected != key)
            atomic_store_explicit(&g_busy_stream[device], MULTI_STREAM, memory_order_relaxed);
        atomic_store_explicit(&r->busy_since_ns, clc_now_ns(), memory_order_release);
    } else if (atomic_load_explicit(&g_busy_stream[device], memory_order_relaxed) != key) {
        atomic_store_explicit(&g_busy_stream[device], MULTI_STREAM, memory_order_relaxed);
    }
}

uint64_t clc_priority_sync_begin(int device, int *counted) {
    board_slot *slot = slot_now();
    *counted = 0;
    if (!slot || (unsigned)device >= BOARD_DEVICES || g_slot_pid != getpid()) return 0;
    atomic_fetch_add_explicit(&slot->rows[device].waiting, 1, memory_order_acq_rel);
    *counted = 1;
    return atomic_load_explicit(&slot->rows[device].launched, memory_order_acquire);
}

void clc_priority_sync_end(int device, uint64_t launched, int whole_context, CUstream stream,
                           int ptsz, int counted, int done) {
    board_slot *slot = slot_now();
    if (!counted || !slot || (unsigned)device >= BOARD_DEVICES || g_slot_pid != getpid()) return;
    board_row *r = &slot->rows[device];
    atomic_fetch_sub_explicit(&r->waiting, 1, memory_order_acq_rel);
    if (!done) return;
    CUstream busy = atomic_load_explicit(&g_busy_stream[device], memory_order_acquire);
    if (!whole_context && busy != stream_key(stream, ptsz))
        return; /* work on other streams may still run */
    uint64_t cur = atomic_load_explicit(&r->settled, memory_order_relaxed);
    while (cur < launched &&
           !atomic_compare_exchange_weak_explicit(&r->settled, &cur, launched, memory_order_acq_rel,
                                                  memory_order_relaxed));
    /* idle again: the next launch names the stream anew */
    if (atomic_load_explicit(&r->launched, memory_order_acquire) ==
        atomic_load_explicit(&r->settled, memory_order_acquire))
        atomic_compare_exchange_strong(&g_busy_stream[device], &busy, NULL);
}

/* ---- best-effort: the slots it reads ----------------------------------------------------- */

/* A slot is read with pread through a descriptor kept for it, never mapped: its owner could
 * shrink the file, and a read of a mapping past its end would kill this process (SIGBUS). The
 * descriptor is checked before each read (the program may have closed it, and reused its
 * number): the same file, still a regular file of its size and owner, writable by no one
 * else. */
typedef struct {
    int fd;
    dev_t dev;
    ino_t ino;
    uid_t uid;
    int32_t pid;
    uint64_t start_time;
    uint64_t seen_launched[BOARD_DEVICES];
    uint64_t seen_ns[BOARD_DEVICES];
} lc_view;

#define VIEW_FD_MIN 100         /* kept descriptors above the numbers programs use most */
#define READ_EVERY_NS 5000ull   /* a launch within 5 us of the last look uses what it saw */

static pthread_mutex_t g_be_lock = PTHREAD_MUTEX_INITIALIZER;
static lc_view g_views[MAX_SLOTS];
static int g_n_views;
static int g_table_full;
static uint64_t g_scanned_ns;
static unsigned char g_be_uuid[BOARD_DEVICES][16];
static int g_be_uuid_known[BOARD_DEVICES];
static uid_t g_trusted[MAX_TRUSTED];
static int g_n_trusted;

static void trust(uid_t uid) {
    for (int i = 0; i < g_n_trusted; i++)
        if (g_trusted[i] == uid) return;
    if (g_n_trusted < MAX_TRUSTED)
        g_trusted[g_n_trusted++] = uid;
    else if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "priority: more than %d latency-critical users: the slots of "
                "the others are not read",
                MAX_TRUSTED);
}

static void read_trust(void) {
    trust(geteuid());
    trust(0);
    const char *t = clc_setting("CLC_PRIORITY_TRUST");
    while (t && *t) {
        char *end;
        if (*t == 'u') {
            unsigned long id = strtoul(t + 1, &end, 10);
            if (end != t + 1) trust((uid_t)id);
            t = end;
        } else {
            t++;
        }
        while (*t == ',' || *t == ' ') t++;
    }
}

static void say_refused(const char *name, const char *why) {
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "priority: slot %s is not trusted (%s): it does not hold this process (said "
                "once)",
                name, why);
}

/* The slot, read whole into *out: 0 when the view's file is no longer what it was. */
static int read_view(const lc_view *v, board_slot *out) {
    struct stat st;
    if (fstat(v->fd, &st) != 0 || st.st_dev != v->dev || st.st_ino != v->ino ||
        !S_ISREG(st.st_mode) || (st.st_mode & (S_IWGRP | S_IWOTH)) || st.st_uid != v->uid ||
        (size_t)st.st_size != sizeof(board_slot))
        return 0;
    return pread(v->fd, out, sizeof *out, 0) == (ssize_t)sizeof *out && out->magic == BOARD_MAGIC;
}

/* Closes a descriptor clc kept, unless the program has put a file of its own at its number. */
static void close_kept(int fd, dev_t dev, ino_t ino) {
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino) close(fd);
}

static void drop_view(int k) {
    close_kept(g_views[k].fd, g_views[k].dev, g_views[k].ino);
    g_views[k] = g_views[--g_n_views];
}

static void table_full(const char *why) {
    g_table_full = 1;
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "priority: %s: launches of this best-effort process are held to its floor "
                "while it stays so (said once)",
                why);
}

/* Reads one user's directory: new slots taken, the ones seen marked present. 0 when the scan
 * must stop (the entries or the table ran out). g_be_lock held. */
static int scan_user(uid_t uid, unsigned char *present, int *entries) {
    int dir = user_dir(uid, 0);
    if (dir < 0) {
        if (errno == EMFILE || errno == ENFILE) {
            table_full("no descriptor left to read the board");
            return 0;
        }
        if (errno == EPERM) {
            char name[48];
            snprintf(name, sizeof name, "u%u", (unsigned)uid);
            say_refused(name, "a directory another user controls, or others may write");
        }
        return 1;
    }
    int dfd = fcntl(dir, F_DUPFD_CLOEXEC, 0);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0) close(dfd);
        close(dir);
        table_full("no descriptor left to read the board");
        return 0;
    }
    int go_on = 1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (++*entries > MAX_ENTRIES) {
            table_full("more board entries than one scan reads");
            go_on = 0;
            break;
        }
        if (strncmp(de->d_name, "lc.", 3) != 0) continue;
        int fd = openat(dir, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                table_full("no descriptor left to read a slot");
                go_on = 0;
                break;
            }
            continue; /* a link, or gone */
        }
        struct stat st;
        if (fstat(fd, &st) != 0) {
            close(fd);
            continue;
        }
        int known = -1;
        for (int k = 0; k < g_n_views; k++)
            if (g_views[k].dev == st.st_dev && g_views[k].ino == st.st_ino) known = k;
        if (known >= 0) {
            present[known] = 1;
            close(fd);
            continue;
        }
        const char *why = NULL;
        if (!S_ISREG(st.st_mode))
            why = "not a regular file";
        else if (st.st_mode & (S_IWGRP | S_IWOTH))
            why = "writable by others";
        else if (st.st_uid != uid)
            why = "not its directory's user's";
        else if (st.st_size != 0 && (size_t)st.st_size != sizeof(board_slot))
            why = "not a slot of this version";
        if (why || (size_t)st.st_size != sizeof(board_slot)) {
            if (why) say_refused(de->d_name, why);
            close(fd);
            continue;
        }
        if (g_n_views == MAX_SLOTS) {
            close(fd);
            table_full("more latency-critical slots than a best-effort process reads");
            go_on = 0;
            break;
        }
        int kept = fcntl(fd, F_DUPFD_CLOEXEC, VIEW_FD_MIN);
        close(fd);
        if (kept < 0) {
            table_full("no descriptor left to read a slot");
            go_on = 0;
            break;
        }
        lc_view *v = &g_views[g_n_views];
        *v = (lc_view){.fd = kept, .dev = st.st_dev, .ino = st.st_ino, .uid = st.st_uid};
        board_slot slot;
        if (!read_view(v, &slot) || slot.version != BOARD_VERSION ||
            !slot_alive(slot.pid, slot.start_time)) {
            close(kept);
            continue;
        }
        v->pid = slot.pid;
        v->start_time = slot.start_time;
        present[g_n_views++] = 1;
    }
    closedir(d);
    close(dir);
    return go_on;
}

/* Reads the trusted users' directories again: new slots taken, dead or removed ones dropped.
 * g_be_lock held. */
static void scan(uint64_t now) {
    g_scanned_ns = now;
    if (board_fd() < 0) return;
    unsigned char present[MAX_SLOTS] = {0};
    int entries = 0, complete = 1;
    g_table_full = 0;
    for (int i = 0; i < g_n_trusted && complete; i++)
        complete = scan_user(g_trusted[i], present, &entries);
    /* drop the slots removed, and those whose process died (not after an incomplete scan:
     * the slots it did not reach are still there) */
    for (int k = 0; k < g_n_views;) {
        if ((complete && !present[k]) || !slot_alive(g_views[k].pid, g_views[k].start_time)) {
            present[k] = present[g_n_views - 1];
            drop_view(k);
        } else {
            k++;
        }
    }
}

/* Whether a latency-critical process is busy on `device`; *since: when it went busy. */
static int lc_busy_now(int device, uint64_t now, uint64_t *since) {
    if (g_board_bad || g_table_full) return 1;
    if ((unsigned)device >= BOARD_DEVICES) {
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "priority: device %d is beyond the board's %d GPUs: its launches are held "
                    "to the floor",
                    device, BOARD_DEVICES);
        return 1;
    }
    if (!g_be_uuid_known[device]) {
        if (!device_uuid(device, g_be_uuid[device])) {
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING,
                        "priority: the driver does not name device %d (no UUID): its launches "
                        "are held to the floor",
                        device);
            return 1;
        }
        g_be_uuid_known[device] = 1;
    }
    board_slot slot;
    for (int k = 0; k < g_n_views;) {
        lc_view *v = &g_views[k];
        if (!read_view(v, &slot)) { /* changed under us: believed no more */
            drop_view(k);
            continue;
        }
        k++;
        for (int d = 0; d < BOARD_DEVICES; d++) {
            const board_row *r = &slot.rows[d];
            if (!r->used || memcmp(r->uuid, g_be_uuid[device], 16) != 0) continue;
            uint64_t l = r->launched, s = r->settled;
            if (l != v->seen_launched[d]) v->seen_launched[d] = l, v->seen_ns[d] = now;
            /* busy: waiting for its GPU in a synchronization, or not quiet for longer than
             * the policy's idle_after */
            if (l != s && (r->waiting || now - v->seen_ns[d] < g_idle_ns)) {
                *since = r->busy_since_ns;
                return 1;
            }
        }
    }
    return 0;
}

static struct {
    uint64_t at_ns, since;
    int busy;
} g_looked[BOARD_DEVICES];

/* lc_busy_now, looked at again only READ_EVERY_NS after the last look (g_be_lock held) */
static int lc_busy(int device, uint64_t now, uint64_t *since) {
    if ((unsigned)device >= BOARD_DEVICES) return lc_busy_now(device, now, since);
    if (g_looked[device].at_ns && now - g_looked[device].at_ns < READ_EVERY_NS) {
        *since = g_looked[device].since;
        return g_looked[device].busy;
    }
    uint64_t s = 0;
    int busy = lc_busy_now(device, now, &s);
    g_looked[device].at_ns = now;
    g_looked[device].since = s;
    g_looked[device].busy = busy;
    *since = s;
    return busy;
}

/* ---- best-effort: holding, down to the floor --------------------------------------------- */

/* hold statistics of this process, for the exit line */
static uint64_t g_holds, g_held_ns, g_held_max_ns, g_floor_releases, g_run_ahead_waits;
/* The time the process was held, all its threads together (while g_holding of them wait), by
 * this process's own clock: what a latency-critical process writes on the board says only
 * whether it is busy, never how long this process was held. Counted per FLOOR_BUCKET_NS in a
 * ring that covers every window of WINDOW_NS ending now (the oldest bucket is counted whole),
 * so that the floor holds over any window, not per hold: a latency-critical process that goes
 * idle for a moment before the floor would let a hold go gains nothing by it. */
static int g_holding;
static struct {
    uint64_t held_ns[FLOOR_BUCKETS];
    uint64_t sum;        /* of held_ns: what the floor weighs */
    uint64_t latest;     /* the newest bucket in the ring, as now / FLOOR_BUCKET_NS */
    uint64_t counted_to; /* held time is counted up to here */
} g_window;

/* Whether a latency-critical process is busy on `device` now, the directories read again
 * when a scan is due (g_be_lock held). */
static int look(int device, uint64_t now, uint64_t *since) {
    if (now - g_scanned_ns >= SCAN_NS) scan(now);
    return lc_busy(device, now, since);
}

/* A hold that ended, counted for the exit line: its HOLD record (g_be_lock held). */
static clc_rec_hold count_hold(uint64_t start, uint64_t held, uint64_t since, int device,
                               uint32_t why) {
    g_holds++;
    g_held_ns += held;
    if (held > g_held_max_ns) g_held_max_ns = held;
    return (clc_rec_hold){start, held, since && since <= start ? start - since : 0, device, why};
}

/* The ring moved on to the bucket of `now`: the buckets that fall out of it are forgotten
 * (g_be_lock held). */
static void window_advance(uint64_t now) {
    uint64_t bucket = now / FLOOR_BUCKET_NS;
    if (bucket <= g_window.latest) return;
    if (bucket - g_window.latest >= FLOOR_BUCKETS) {
        memset(g_window.held_ns, 0, sizeof g_window.held_ns);
        g_window.sum = 0;
    } else {
        for (uint64_t b = g_window.latest + 1; b <= bucket; b++) {
            g_window.sum -= g_window.held_ns[b % FLOOR_BUCKETS];
            g_window.held_ns[b % FLOOR_BUCKETS] = 0;
        }
    }
    g_window.latest = bucket;
}

/* The time held since the last count, up to `now`, put in the buckets it fell in (g_be_lock
 * held). A late count (a held thread woken late) loses nothing: the whole span is counted. */
static void count_held(uint64_t now) {
    window_advance(now);
    uint64_t from = g_window.counted_to;
    g_window.counted_to = now;
    if (!g_holding || from >= now) return;
    /* a span longer than the ring (a thread stopped while held) fills it, and no more: its
     * older part would land on the newer buckets' places */
    if (g_window.latest + 1 >= FLOOR_BUCKETS) {
        uint64_t oldest = (g_window.latest + 1 - FLOOR_BUCKETS) * FLOOR_BUCKET_NS;
        if (from < oldest) from = oldest;
    }
    while (from < now) {
        uint64_t bucket = from / FLOOR_BUCKET_NS, end = (bucket + 1) * FLOOR_BUCKET_NS;
        if (end > now) end = now;
        g_window.held_ns[bucket % FLOOR_BUCKETS] += end - from;
        g_window.sum += end - from;
        from = end;
    }
}

/* Whether a launch may be held now: only while the process was held for less than
 * (1 - floor) x WINDOW_NS in the window that ends now (g_be_lock held). */
static int may_hold(uint64_t now) {
    if (g_floor >= 1) return 0;
    count_held(now);
    return g_window.sum < (uint64_t)((1.0 - g_floor) * (double)WINDOW_NS);
}

static void hold(int device) {
    pthread_mutex_lock(&g_be_lock);
    uint64_t now = clc_now_ns(), since = 0;
    if (!look(device, now, &since) || !may_hold(now)) {
        pthread_mutex_unlock(&g_be_lock);
        return;
    }
    uint64_t start = now;
    g_holding++; /* counted from now: may_hold counted the time before */
    int why = g_board_bad || g_table_full ? CLC_HOLD_NO_BOARD : CLC_HOLD_BUSY;
    int released_by_floor = 0;
    for (;;) {
        pthread_mutex_unlock(&g_be_lock);
        struct timespec step = {0, HOLD_STEP_NS};
        nanosleep(&step, NULL);
        pthread_mutex_lock(&g_be_lock);
        uint64_t s2;
        now = clc_now_ns();
        if (!may_hold(now)) {
            released_by_floor = 1;
            break;
        }
        if (!look(device, now, &s2)) break;
    }
    g_holding--;
    g_floor_releases += (uint64_t)released_by_floor;
    clc_rec_hold rec = count_hold(start, now - start, since, device,
                                  (uint32_t)why | (released_by_floor ? CLC_HOLD_FLOOR : 0));
    pthread_mutex_unlock(&g_be_lock);
    clc_capture_write(CLC_REC_HOLD, &rec, sizeof rec, NULL, 0);
}

/* held_share: while a latency-critical process is busy, launches run on the share instead of
 * waiting. One HOLD record (CLC_HOLD_SHARED) per busy period: opened at the first launch that
 * finds the GPU busy, closed at the first that finds it idle, or at exit. g_be_lock held. */
static uint64_t g_shared_start, g_shared_since;
static int g_shared_device = -1;

static void close_shared(uint64_t now) {
    if (!g_shared_start) return;
    clc_rec_hold rec = count_hold(g_shared_start, now - g_shared_start, g_shared_since,
                                  g_shared_device, CLC_HOLD_BUSY | CLC_HOLD_SHARED);
    g_shared_start = 0;
    clc_capture_write(CLC_REC_HOLD, &rec, sizeof rec, NULL, 0);
}

static int held_to_share(int device) {
    pthread_mutex_lock(&g_be_lock);
    uint64_t now = clc_now_ns(), since = 0;
    int busy = look(device, now, &since);
    if (busy && !g_shared_start) {
        g_shared_start = now;
        g_shared_since = since;
        g_shared_device = device;
    } else if (!busy) {
        close_shared(now);
    }
    pthread_mutex_unlock(&g_be_lock);
    return busy;
}

/* ---- best-effort: how far it runs ahead of the GPU ---------------------------------------- */

/* Per (context, stream): the events of its last launches, one every RUN_AHEAD_STEP. A launch
 * waits only for its own stream's earlier work, so that no launch waits for work that may
 * wait for it. */
typedef struct {
    CUcontext ctx;
    CUstream key, stream;
    int per_thread;
    uint64_t launches;
    CUevent stalled; /* an event waited for in vain: no wait on this stream until it is done */
    uint64_t last_ns; /* its last launch */
    CUevent ring[64];
} ahead_ring;
static ahead_ring g_rings[RUN_AHEAD_STREAMS];
#define RING_IDLE_NS 1000000000ull /* a ring whose stream launched nothing for 1 s may be reused */

/* Waits, at most RUN_AHEAD_WAIT_NS, for an event; 0 when it gave up (said once). */
static int wait_event(CUevent ev) {
    CUresult r = g_drv.event_query(ev);
    if (r != CUDA_ERROR_NOT_READY) return 1;
    __atomic_fetch_add(&g_run_ahead_waits, 1, __ATOMIC_RELAXED);
    uint64_t start = clc_now_ns();
    while ((r = g_drv.event_query(ev)) == CUDA_ERROR_NOT_READY) {
        if (clc_now_ns() - start >= RUN_AHEAD_WAIT_NS) {
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING,
                        "priority: a stream's earlier work did not finish within %llu ms: its "
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

static void bound_run_ahead(CUcontext ctx, CUstream stream, int per_thread) {
    if (!g_n_views || !ctx || !g_drv.event_create || !g_drv.event_record || !g_drv.event_query)
        return;
    unsigned n = g_run_ahead / RUN_AHEAD_STEP;
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
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING,
                        "priority: more than %d streams in use at once: the launches of the "
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

uint64_t clc_priority_be_launch(int device, CUcontext ctx, CUstream stream, int per_thread) {
    /* Nothing to do while no latency-critical slot is known and the board is fine, until the
     * next scan (read without the lock: at worst one launch looks again) */
    if (!g_n_views && !g_board_bad && !g_table_full && g_scanned_ns &&
        clc_now_ns() - g_scanned_ns < SCAN_NS)
        return 0;
    /* A launch captured into a graph runs nothing now: neither held nor confined (a confined
     * node would stay confined in every replay). */
    int capturing;
    if (clc_stream_capture_status(stream, per_thread, &capturing) != CUDA_SUCCESS ||
        capturing != CU_STREAM_CAPTURE_STATUS_NONE)
        return 0;
    /* Inside clc's own work: a signal handler's launch on this thread takes the re-entrant
     * gate, not these locks; event calls in relaxed capture mode, so that another thread's
     * capture in global mode is not broken by them. */
    int was = t_in_clc, mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    t_in_clc = 1;
    int exchanged =
        g_drv.exchange_capture_mode && g_drv.exchange_capture_mode(&mode) == CUDA_SUCCESS;
    uint64_t word = 0;
    if (g_held_word)
        word = held_to_share(device) ? g_held_word : 0;
    else
        hold(device);
    bound_run_ahead(ctx, stream, per_thread);
    if (exchanged) g_drv.exchange_capture_mode(&mode);
    t_in_clc = was;
    return word;
}

/* ---- the process's start and end ----------------------------------------------------------- */

int clc_priority_start(void) {
    const char *c = clc_setting("CLC_PRIORITY");
    if (!c || !*c) return 0;
    g_class = strcmp(c, "lc") == 0 ? CLC_PRIORITY_LC : strcmp(c, "be") == 0 ? CLC_PRIORITY_BE : 0;
    if (!g_class) return 0;
    const char *v;
    /* clc-run checked these; kept in range whatever they say */
    if ((v = clc_setting("CLC_PRIORITY_FLOOR"))) g_floor = strtod(v, NULL);
    if (!(g_floor >= 0.001 && g_floor <= 1)) g_floor = 0.1;
    if ((v = clc_setting("CLC_PRIORITY_RUN_AHEAD"))) g_run_ahead = (unsigned)strtoul(v, NULL, 10);
    if (g_run_ahead < 4 || g_run_ahead > 256) g_run_ahead = 32;
    if ((v = clc_setting("CLC_PRIORITY_IDLE_MS"))) {
        double ms = strtod(v, NULL);
        if (ms > 0 && ms <= 10000) g_idle_ns = (uint64_t)(ms * 1e6);
    }
    if ((v = clc_setting("CLC_PRIORITY_HELD_SHARE"))) {
        double share = strtod(v, NULL);
        if (share > 0 && share < 1)
            g_held_word = (uint64_t)CLC_CAP_SHARE << CLC_CONFINE_KIND_SHIFT |
                          (uint64_t)(share * 1e6) | CLC_CONFINE_LAST;
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
    if (!in_signal && g_shared_start && pthread_mutex_trylock(&g_be_lock) == 0) {
        close_shared(clc_now_ns());
        pthread_mutex_unlock(&g_be_lock);
    }
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
        for (int d = 0; d < BOARD_DEVICES; d++) atomic_store(&g_busy_stream[d], NULL);
    }
    if (g_class == CLC_PRIORITY_BE) {
        pthread_mutex_init(&g_be_lock, NULL);
        memset(g_rings, 0, sizeof g_rings); /* the parent's events are not this process's */
        g_holding = 0;
        memset(&g_window, 0, sizeof g_window); /* held time is the parent's */
        g_shared_start = 0;
    }
}
