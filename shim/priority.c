/* SPDX-License-Identifier: Apache-2.0
 *
 * priority.c: latency-critical and best-effort processes on one machine, through a board of
 * small files, with no process in between.
 *
 * clc-run decides a process's class from the policy (CLC_PRIORITY: "lc" or "be") and seals it
 * with the other settings; the program cannot change it.
 *
 * A latency-critical process owns one slot file in the board directory (CLC_PRIORITY_BOARD),
 * `lc.<pid>.<start time>`, mode 0644, mapped shared. Per GPU (by UUID, since two processes may
 * number their devices differently) it counts the launches made (`launched`, one atomic add per
 * launch) and the launches known finished (`settled`): a synchronization that returned (the
 * context's, or the stream's when every launch since the GPU went busy was on that stream)
 * settles what was launched before it. The GPU is busy for the process while launched !=
 * settled. While a thread of it waits in a synchronization the GPU counts as busy however
 * long it takes; otherwise a process that launched nothing for the policy's idle_after_ms
 * counts as idle (it may wait in ways clc does not see). The slot is removed at exit; a crashed
 * process's slot is ignored by its pid and start time.
 *
 * A best-effort process reads the slots (pread, at most every READ_EVERY_NS) at its launches
 * (the directory is scanned again every SCAN_NS) and holds the launch while any trusted slot says
 * its GPU is busy: it sleeps in steps of HOLD_STEP_NS until the GPU is idle, or until the hold has
 * taken the share of time the policy's floor leaves it (per WINDOW_NS). While a latency-critical
 * process runs on the machine, a best-effort process also keeps at most CLC_PRIORITY_RUN_AHEAD
 * launches queued per context (an event recorded every RUN_AHEAD_STEP launches, waited for when its
 * turn comes again), so that holding its launches takes effect within a few kernels: the driver
 * queues about a thousand launches per stream before it blocks.
 *
 * Trust: a slot counts only when it is a regular file of its own (not a link), not writable
 * by group or others, owned by this user, root, or a user or group the policy's
 * latency-critical classes name (CLC_PRIORITY_TRUST: "u<uid>" and "g<gid>" words). The
 * directory must be this user's or root's, and sticky when others may write it. A board that
 * cannot be used holds every launch as if a latency-critical process were busy, down to the
 * floor (said once); so does a slot table that is full.
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

#include "shim.h"

#define BOARD_MAGIC 0x3144524f42434c43ull /* "CLCBORD1" */
#define BOARD_VERSION 1
#define BOARD_DEVICES 16
#define MAX_SLOTS 64
#define SCAN_NS 50000000ull      /* the directory is read again after 50 ms */
#define HOLD_STEP_NS 20000ull    /* a held launch looks again every 20 us */
#define WINDOW_NS 100000000ull   /* the floor is kept per 100 ms */
#define RUN_AHEAD_STEP 4         /* an event every 4 launches */
#define RUN_AHEAD_CONTEXTS 8
#define DEFAULT_BOARD "/dev/shm/clc-board"

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

static int g_class;      /* CLC_PRIORITY_LC, CLC_PRIORITY_BE, or 0 */
static int g_board = -1; /* the board directory (O_PATH), or -1 */
static int g_board_bad;  /* the board cannot be used: every launch held to the floor */
static double g_floor = 0.1;
static unsigned g_run_ahead = 32;
static uint64_t g_held_word; /* CLC_ACTION_CONFINE word of a held launch (held_share); 0: wait */
static uint64_t g_idle_ns = 20000000ull;
static char g_board_path[256];

/* ---- shared: the board directory, process start times ---------------------------------- */

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
    return fd;
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

/* ---- latency-critical: the slot this process writes -------------------------------------- */

static board_slot *g_slot;
static char g_slot_name[64];
static pid_t g_slot_pid;
/* per GPU: the stream of every launch since the GPU went busy, or MULTI */
#define MULTI_STREAM ((CUstream)(uintptr_t)-1)
static CUstream _Atomic g_busy_stream[BOARD_DEVICES];

static void lc_open_slot(void) {
    if (g_board < 0) return;
    pid_t pid = getpid();
    uint64_t start = start_time_of(pid);
    snprintf(g_slot_name, sizeof g_slot_name, "lc.%d.%llu", (int)pid, (unsigned long long)start);
    int fd = openat(g_board, g_slot_name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
        /* this very process's, before an exec (same pid, same start time): written again */
        struct stat st;
        fd = openat(g_board, g_slot_name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
            close(fd);
            fd = -1;
            errno = EEXIST;
        }
    }
    if (fd < 0) {
        board_unusable(strerror(errno));
        return;
    }
    fchmod(fd, 0644); /* whatever the umask: best-effort processes of other users read it */
    board_slot *s = MAP_FAILED;
    if (ftruncate(fd, sizeof(board_slot)) == 0)
        s = mmap(NULL, sizeof(board_slot), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED) {
        unlinkat(g_board, g_slot_name, 0);
        board_unusable(strerror(errno));
        return;
    }
    s->version = BOARD_VERSION;
    s->size = sizeof(board_slot);
    s->pid = pid;
    s->uid = geteuid();
    s->start_time = start;
    const char *name = clc_setting("CLC_PRIORITY_NAME");
    snprintf(s->class_name, sizeof s->class_name, "%s", name ? name : "");
    atomic_thread_fence(memory_order_release);
    s->magic = BOARD_MAGIC; /* readers take a slot only once this is written */
    g_slot = s;
    g_slot_pid = pid;
}

/* The UUID of a device ordinal of this process; 0 when the driver cannot say. */
static int device_uuid(int device, unsigned char out[16]) {
    if (!g_drv.device_get_uuid) return 0;
    return g_drv.device_get_uuid(out, (CUdevice)device) == CUDA_SUCCESS;
}

__attribute__((noinline)) static board_row *lc_row_slow(int device) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    board_row *r = NULL;
    if (g_slot && g_slot_pid == getpid()) {
        r = &g_slot->rows[device];
        if (!atomic_load_explicit(&r->used, memory_order_acquire)) {
            if (device_uuid(device, r->uuid))
                atomic_store_explicit(&r->used, 1, memory_order_release);
            else
                r = NULL;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

void clc_priority_lc_launch(int device, CUstream stream) {
    if (unlikely(!g_slot || (unsigned)device >= BOARD_DEVICES)) {
        if (!g_slot) return; /* said when the board failed */
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "priority: device %d is beyond the board's %d GPUs: its "
                    "launches do not hold best-effort work",
                    device, BOARD_DEVICES);
        return;
    }
    board_row *r = &g_slot->rows[device];
    if (unlikely(!atomic_load_explicit(&r->used, memory_order_acquire)) &&
        !(r = lc_row_slow(device)))
        return;
    uint64_t before = atomic_fetch_add_explicit(&r->launched, 1, memory_order_acq_rel);
    if (before == atomic_load_explicit(&r->settled, memory_order_acquire)) {
        atomic_store_explicit(&g_busy_stream[device], stream, memory_order_relaxed);
        atomic_store_explicit(&r->busy_since_ns, clc_now_ns(), memory_order_release);
    } else if (atomic_load_explicit(&g_busy_stream[device], memory_order_relaxed) != stream) {
        atomic_store_explicit(&g_busy_stream[device], MULTI_STREAM, memory_order_relaxed);
    }
}

uint64_t clc_priority_sync_begin(int device) {
    if (!g_slot || (unsigned)device >= BOARD_DEVICES || g_slot_pid != getpid()) return 0;
    atomic_fetch_add_explicit(&g_slot->rows[device].waiting, 1, memory_order_acq_rel);
    return atomic_load_explicit(&g_slot->rows[device].launched, memory_order_acquire);
}

void clc_priority_sync_end(int device, uint64_t launched, int whole_context, CUstream stream,
                           int done) {
    if (!g_slot || (unsigned)device >= BOARD_DEVICES || g_slot_pid != getpid()) return;
    atomic_fetch_sub_explicit(&g_slot->rows[device].waiting, 1, memory_order_acq_rel);
    if (!done) return;
    if (!whole_context &&
        atomic_load_explicit(&g_busy_stream[device], memory_order_relaxed) != stream)
        return; /* work on other streams may still run */
    board_row *r = &g_slot->rows[device];
    uint64_t cur = atomic_load_explicit(&r->settled, memory_order_relaxed);
    while (cur < launched &&
           !atomic_compare_exchange_weak_explicit(&r->settled, &cur, launched, memory_order_acq_rel,
                                                  memory_order_relaxed));
}

/* ---- best-effort: the slots it reads ----------------------------------------------------- */

/* A slot is read with pread through a descriptor kept for it, never mapped: its owner could
 * shrink the file, and a read of a mapping past its end would kill this process (SIGBUS). The
 * descriptor is checked before each read (the program may have closed it, and reused its
 * number): the same file, still a regular file of its size, still writable by no one else. */
typedef struct {
    int fd;
    dev_t dev;
    ino_t ino;
    uid_t uid;
    gid_t gid;
    int32_t pid;
    uint64_t start_time;
    uint64_t seen_launched[BOARD_DEVICES];
    uint64_t seen_ns[BOARD_DEVICES];
} lc_view;

#define VIEW_FD_MIN 100  /* kept descriptors above the numbers programs use most */
#define READ_EVERY_NS 5000ull /* a launch within 5 us of the last look uses what it saw */

static pthread_mutex_t g_be_lock = PTHREAD_MUTEX_INITIALIZER;
static lc_view g_views[MAX_SLOTS];
static int g_n_views;
static int g_table_full;
static uint64_t g_scanned_ns;
static unsigned char g_be_uuid[BOARD_DEVICES][16];
static int g_be_uuid_known[BOARD_DEVICES];
static uid_t g_trust_uid[16];
static gid_t g_trust_gid[16];
static int g_n_trust_uid, g_n_trust_gid;

static void read_trust(void) {
    const char *t = clc_setting("CLC_PRIORITY_TRUST");
    g_trust_uid[g_n_trust_uid++] = geteuid();
    g_trust_uid[g_n_trust_uid++] = 0;
    while (t && *t) {
        char kind = *t++;
        char *end;
        unsigned long id = strtoul(t, &end, 10);
        if (end != t) {
            if (kind == 'u' && g_n_trust_uid < 16) g_trust_uid[g_n_trust_uid++] = (uid_t)id;
            if (kind == 'g' && g_n_trust_gid < 16) g_trust_gid[g_n_trust_gid++] = (gid_t)id;
        }
        t = end;
        while (*t == ',' || *t == ' ') t++;
        if (end == t && *t && *t != 'u' && *t != 'g') break;
    }
}

static int trusted_owner(const struct stat *st) {
    for (int i = 0; i < g_n_trust_uid; i++)
        if (st->st_uid == g_trust_uid[i]) return 1;
    for (int i = 0; i < g_n_trust_gid; i++)
        if (st->st_gid == g_trust_gid[i]) return 1;
    return 0;
}

/* Whether the slot's process is the one that wrote it (its pid now names another process, or
 * none, when it died without removing it). */
static int slot_alive(int32_t pid, uint64_t start_time) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    return start_time_of(pid) == start_time;
}

/* The slot, read whole into *out: 0 when the view's file is no longer what it was. */
static int read_view(const lc_view *v, board_slot *out) {
    struct stat st;
    if (fstat(v->fd, &st) != 0 || st.st_dev != v->dev || st.st_ino != v->ino ||
        !S_ISREG(st.st_mode) || (st.st_mode & (S_IWGRP | S_IWOTH)) || st.st_uid != v->uid ||
        st.st_gid != v->gid || (size_t)st.st_size != sizeof(board_slot))
        return 0;
    return pread(v->fd, out, sizeof *out, 0) == (ssize_t)sizeof *out && out->magic == BOARD_MAGIC;
}

static void drop_view(int k) {
    close(g_views[k].fd);
    g_views[k] = g_views[--g_n_views];
}

static void say_refused(const char *name, const char *why) {
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "priority: slot %s/%s is not trusted (%s): it does not hold "
                "this process (said once)",
                g_board_path, name, why);
}

/* Reads the directory again: new slots mapped, dead or removed ones dropped. g_be_lock held. */
static void scan(uint64_t now) {
    g_scanned_ns = now;
    if (g_board < 0) return;
    int dfd = openat(g_board, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0) close(dfd);
        return;
    }
    unsigned char present[MAX_SLOTS] = {0};
    struct dirent *de;
    int full = 0;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "lc.", 3) != 0) continue;
        int fd = openat(g_board, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue; /* a link, or gone */
        struct stat st;
        int i = -1;
        if (fstat(fd, &st) == 0) {
            for (int k = 0; k < g_n_views; k++)
                if (g_views[k].dev == st.st_dev && g_views[k].ino == st.st_ino) i = k;
        }
        if (i >= 0) {
            present[i] = 1;
            close(fd);
            continue;
        }
        const char *why = NULL;
        if (!S_ISREG(st.st_mode))
            why = "not a regular file";
        else if (st.st_mode & (S_IWGRP | S_IWOTH))
            why = "writable by others";
        else if (!trusted_owner(&st))
            why = "owned by a user the policy does not make latency-critical";
        else if ((size_t)st.st_size != sizeof(board_slot))
            why = st.st_size == 0 ? NULL : "not a slot of this version";
        if (why || (size_t)st.st_size != sizeof(board_slot)) {
            if (why) say_refused(de->d_name, why);
            close(fd);
            continue;
        }
        if (g_n_views == MAX_SLOTS) {
            full = 1;
            close(fd);
            continue;
        }
        board_slot slot;
        int kept = fcntl(fd, F_DUPFD_CLOEXEC, VIEW_FD_MIN);
        close(fd);
        if (kept < 0) continue;
        lc_view *v = &g_views[g_n_views];
        *v = (lc_view){
            .fd = kept, .dev = st.st_dev, .ino = st.st_ino, .uid = st.st_uid, .gid = st.st_gid};
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
    /* drop the slots removed, and those whose process died */
    for (int k = 0; k < g_n_views;) {
        if (!present[k] || !slot_alive(g_views[k].pid, g_views[k].start_time)) {
            present[k] = present[g_n_views - 1];
            drop_view(k);
        } else {
            k++;
        }
    }
    if (full && !g_table_full) {
        g_table_full = 1;
        clc_log(CLC_MSG_WARNING,
                "priority: more than %d latency-critical slots on the board "
                "%s: launches are held to the floor while it stays so",
                MAX_SLOTS, g_board_path);
    }
    if (!full) g_table_full = 0;
}

/* Whether a latency-critical process is busy on `device`; *since: when it went busy. */
static int lc_busy_now(int device, uint64_t now, uint64_t *since) {
    if (g_board_bad || g_table_full) return 1;
    if ((unsigned)device >= BOARD_DEVICES) return 0;
    if (!g_be_uuid_known[device]) {
        if (!device_uuid(device, g_be_uuid[device])) {
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING,
                        "priority: the driver does not name device %d (no UUID): its launches "
                        "are not held",
                        device);
            return 0;
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

/* hold statistics of this process, for the exit line */
static uint64_t g_holds, g_held_ns, g_held_max_ns, g_floor_releases, g_run_ahead_waits;
static uint64_t g_window_start, g_window_held;

static int floor_left(uint64_t now) {
    if (now - g_window_start >= WINDOW_NS) g_window_start = now, g_window_held = 0;
    return g_window_held < (uint64_t)((1.0 - g_floor) * (double)WINDOW_NS);
}

static void hold(int device) {
    pthread_mutex_lock(&g_be_lock);
    uint64_t now = clc_now_ns(), since = 0;
    if (now - g_scanned_ns >= SCAN_NS) scan(now);
    if (!lc_busy(device, now, &since) || !floor_left(now)) {
        pthread_mutex_unlock(&g_be_lock);
        return;
    }
    uint64_t start = now;
    int why = g_board_bad || g_table_full ? CLC_HOLD_NO_BOARD : CLC_HOLD_BUSY;
    int released_by_floor = 0;
    for (;;) {
        pthread_mutex_unlock(&g_be_lock);
        struct timespec step = {0, HOLD_STEP_NS};
        nanosleep(&step, NULL);
        pthread_mutex_lock(&g_be_lock);
        uint64_t t = clc_now_ns(), s2;
        g_window_held += t - now;
        now = t;
        if (now - g_scanned_ns >= SCAN_NS) scan(now);
        if (!floor_left(now)) {
            released_by_floor = 1;
            break;
        }
        if (!lc_busy(device, now, &s2)) break;
    }
    uint64_t held = now - start;
    g_holds++;
    g_held_ns += held;
    if (held > g_held_max_ns) g_held_max_ns = held;
    g_floor_releases += (uint64_t)released_by_floor;
    pthread_mutex_unlock(&g_be_lock);
    clc_rec_hold rec = {start, held, since && since <= start ? start - since : 0, device,
                        (uint32_t)why | (released_by_floor ? CLC_HOLD_FLOOR : 0)};
    clc_capture_write(CLC_REC_HOLD, &rec, sizeof rec, NULL, 0);
}

/* ---- best-effort: how far it runs ahead of the GPU ---------------------------------------- */

typedef struct {
    CUcontext ctx;
    uint64_t launches;
    CUevent ring[64];
} ahead_ring;
static ahead_ring g_rings[RUN_AHEAD_CONTEXTS];

static void bound_run_ahead(CUcontext ctx, CUstream stream, int per_thread) {
    if (!g_n_views || !ctx || !g_drv.event_create || !g_drv.event_record) return;
    unsigned n = g_run_ahead / RUN_AHEAD_STEP;
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    pthread_mutex_lock(&g_be_lock);
    ahead_ring *ring = NULL;
    for (int i = 0; i < RUN_AHEAD_CONTEXTS && !ring; i++)
        if (g_rings[i].ctx == ctx) ring = &g_rings[i];
    for (int i = 0; i < RUN_AHEAD_CONTEXTS && !ring; i++)
        if (!g_rings[i].ctx) ring = &g_rings[i], ring->ctx = ctx;
    if (!ring) {
        pthread_mutex_unlock(&g_be_lock);
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "priority: more than %d contexts: launches of the others "
                    "are not kept from running ahead",
                    RUN_AHEAD_CONTEXTS);
        return;
    }
    uint64_t k = ring->launches++;
    if (k % RUN_AHEAD_STEP) {
        pthread_mutex_unlock(&g_be_lock);
        return;
    }
    CUevent *ev = &ring->ring[(k / RUN_AHEAD_STEP) % n];
    CUevent wait = *ev;
    if (!*ev) g_drv.event_create(ev, 2 /* CU_EVENT_DISABLE_TIMING */);
    CUevent mine = *ev;
    pthread_mutex_unlock(&g_be_lock);
    if (wait && g_drv.event_query(wait) == CUDA_ERROR_NOT_READY) {
        __atomic_fetch_add(&g_run_ahead_waits, 1, __ATOMIC_RELAXED);
        g_drv.event_synchronize(wait);
    }
    if (mine) (per_thread ? g_drv.event_record_ptsz : g_drv.event_record)(mine, stream);
}

/* held_share: while a latency-critical process is busy, launches run on the share instead of
 * waiting. One HOLD record (CLC_HOLD_SHARED) per busy period: opened at the first launch that
 * finds the GPU busy, closed at the first that finds it idle, or at exit. */
static uint64_t g_shared_start, g_shared_since;
static int g_shared_device = -1;

static void close_shared(uint64_t now) {
    if (!g_shared_start) return;
    uint64_t held = now - g_shared_start;
    g_holds++;
    g_held_ns += held;
    if (held > g_held_max_ns) g_held_max_ns = held;
    clc_rec_hold rec = {
        g_shared_start, held,
        g_shared_since && g_shared_since <= g_shared_start ? g_shared_start - g_shared_since : 0,
        g_shared_device, CLC_HOLD_BUSY | CLC_HOLD_SHARED};
    g_shared_start = 0;
    clc_capture_write(CLC_REC_HOLD, &rec, sizeof rec, NULL, 0);
}

static int held_to_share(int device) {
    pthread_mutex_lock(&g_be_lock);
    uint64_t now = clc_now_ns(), since = 0;
    if (now - g_scanned_ns >= SCAN_NS) scan(now);
    int busy = lc_busy(device, now, &since);
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

uint64_t clc_priority_be_launch(int device, CUcontext ctx, CUstream stream, int per_thread) {
    uint64_t word = 0;
    if (g_held_word)
        word = held_to_share(device) ? g_held_word : 0;
    else
        hold(device);
    bound_run_ahead(ctx, stream, per_thread);
    return word;
}

/* ---- the process's start and end ----------------------------------------------------------- */

int clc_priority_start(void) {
    const char *c = clc_setting("CLC_PRIORITY");
    if (!c || !*c) return 0;
    g_class = strcmp(c, "lc") == 0 ? CLC_PRIORITY_LC : strcmp(c, "be") == 0 ? CLC_PRIORITY_BE : 0;
    if (!g_class) return 0;
    const char *v;
    if ((v = clc_setting("CLC_PRIORITY_FLOOR"))) g_floor = strtod(v, NULL);
    if (!(g_floor >= 0 && g_floor <= 1)) g_floor = 0.1;
    if ((v = clc_setting("CLC_PRIORITY_RUN_AHEAD"))) g_run_ahead = (unsigned)strtoul(v, NULL, 10);
    if ((v = clc_setting("CLC_PRIORITY_IDLE_MS"))) g_idle_ns = (uint64_t)(strtod(v, NULL) * 1e6);
    if ((v = clc_setting("CLC_PRIORITY_HELD_SHARE"))) {
        double share = strtod(v, NULL);
        if (share > 0 && share < 1)
            g_held_word = (uint64_t)CLC_CAP_SHARE << CLC_CONFINE_KIND_SHIFT |
                          (uint64_t)(share * 1e6) | CLC_CONFINE_LAST;
    }
    read_trust();
    g_board = open_board();
    if (g_board < 0) {
        board_unusable(errno == EPERM ? "it is another user's, or others may replace its files"
                                      : strerror(errno));
    } else if (g_class == CLC_PRIORITY_LC) {
        lc_open_slot();
    }
    clc_debug("priority: %s process, board %s",
              g_class == CLC_PRIORITY_LC ? "latency-critical" : "best-effort", g_board_path);
    return g_class;
}

void clc_priority_leave(int in_signal) {
    if (g_slot && g_slot_pid == getpid() && g_board >= 0) unlinkat(g_board, g_slot_name, 0);
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

/* A forked child is a process of its own: a latency-critical one gets its own slot (the
 * parent's stays the parent's), a best-effort one its own view of the board. */
void clc_priority_after_fork_child(void) {
    if (g_class == CLC_PRIORITY_LC && g_slot) {
        munmap(g_slot, sizeof(board_slot));
        g_slot = NULL;
        for (int d = 0; d < BOARD_DEVICES; d++) atomic_store(&g_busy_stream[d], NULL);
        lc_open_slot();
    }
    if (g_class == CLC_PRIORITY_BE) {
        pthread_mutex_init(&g_be_lock, NULL);
        memset(g_rings, 0, sizeof g_rings); /* the parent's events are not this process's */
    }
}
