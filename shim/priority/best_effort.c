/* SPDX-License-Identifier: Apache-2.0
 *
 * best_effort.c: a best-effort process: the latency-critical slots it reads, its launches held
 * down to the floor, what a latency-critical class's slo keeps it to (how far it runs ahead of
 * the GPU is run_ahead.c's).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "priority.h"
#include "priority_internal.h"

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

static lc_view g_views[MAX_SLOTS];
static int g_n_views;
static int g_table_full;
static uint64_t g_scanned_ns;
static unsigned char g_be_uuid[BOARD_DEVICES][16];
static int g_be_uuid_known[BOARD_DEVICES];
static uid_t g_trusted[CLC_PRIORITY_MAX_TRUSTED];
static int g_n_trusted;

static void trust(uid_t uid) {
    for (int i = 0; i < g_n_trusted; i++)
        if (g_trusted[i] == uid) return;
    if (g_n_trusted < CLC_PRIORITY_MAX_TRUSTED)
        g_trusted[g_n_trusted++] = uid;
    else
        CLC_WARN_ONCE("priority: more than %d latency-critical users: the slots of "
                      "the others are not read",
                      CLC_PRIORITY_MAX_TRUSTED);
}

void read_trust(void) {
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
    CLC_WARN_ONCE("priority: slot %s is not trusted (%s): it does not hold this process (said "
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
void close_kept(int fd, dev_t dev, ino_t ino) {
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino) close(fd);
}

static void drop_view(int k) {
    close_kept(g_views[k].fd, g_views[k].dev, g_views[k].ino);
    g_views[k] = g_views[--g_n_views];
}

static void table_full(const char *why) {
    g_table_full = 1;
    CLC_WARN_ONCE("priority: %s: launches of this best-effort process are held to its floor "
                  "while it stays so (said once)",
                  why);
}

/* One user's directory opened for a scan: the directory (*dir) and a stream over it; NULL when
 * there is none to read, *go_on then 0 when the scan must stop (no descriptor left). */
static DIR *open_user_dir(uid_t uid, int *dir, int *go_on) {
    *go_on = 1;
    *dir = user_dir(uid, 0);
    if (*dir < 0) {
        if (errno == EMFILE || errno == ENFILE) {
            table_full("no descriptor left to read the board");
            *go_on = 0;
            return NULL;
        }
        if (errno == EPERM) {
            char name[48];
            snprintf(name, sizeof name, "u%u", (unsigned)uid);
            say_refused(name, "a directory another user controls, or others may write");
        }
        return NULL;
    }
    int dfd = fcntl(*dir, F_DUPFD_CLOEXEC, 0);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0) close(dfd);
        close(*dir);
        table_full("no descriptor left to read the board");
        *go_on = 0;
    }
    return d;
}

/* An entry "lc.*" of user `uid`'s directory: a new slot taken and marked present, a known one
 * marked present, anything else passed over (a refused one said once). 0 when the scan must
 * stop (the descriptors or the table ran out). g_be_lock held. */
static int take_slot(int dir, uid_t uid, const char *name, unsigned char *present) {
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
            table_full("no descriptor left to read a slot");
            return 0;
        }
        return 1; /* a link, or gone */
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return 1;
    }
    int known = -1;
    for (int k = 0; k < g_n_views; k++)
        if (g_views[k].dev == st.st_dev && g_views[k].ino == st.st_ino) known = k;
    if (known >= 0) {
        present[known] = 1;
        close(fd);
        return 1;
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
        if (why) say_refused(name, why);
        close(fd);
        return 1;
    }
    if (g_n_views == MAX_SLOTS) {
        close(fd);
        table_full("more latency-critical slots than a best-effort process reads");
        return 0;
    }
    int kept = fcntl(fd, F_DUPFD_CLOEXEC, VIEW_FD_MIN);
    close(fd);
    if (kept < 0) {
        table_full("no descriptor left to read a slot");
        return 0;
    }
    lc_view *v = &g_views[g_n_views];
    *v = (lc_view){.fd = kept, .dev = st.st_dev, .ino = st.st_ino, .uid = st.st_uid};
    board_slot slot;
    if (!read_view(v, &slot) || slot.version != BOARD_VERSION ||
        !slot_alive(slot.pid, slot.start_time)) {
        close(kept);
        return 1;
    }
    v->pid = slot.pid;
    v->start_time = slot.start_time;
    present[g_n_views++] = 1;
    return 1;
}

/* Reads one user's directory: new slots taken, the ones seen marked present. 0 when the scan
 * must stop (the entries or the table ran out). g_be_lock held. */
static int scan_user(uid_t uid, unsigned char *present, int *entries) {
    int dir, go_on;
    DIR *d = open_user_dir(uid, &dir, &go_on);
    if (!d) return go_on;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (++*entries > MAX_ENTRIES) {
            table_full("more board entries than one scan reads");
            go_on = 0;
            break;
        }
        if (strncmp(de->d_name, "lc.", 3) != 0) continue;
        if (!take_slot(dir, uid, de->d_name, present)) {
            go_on = 0;
            break;
        }
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

/* What the latency-critical slos on a device say (best_effort.c "slo"): whether one has an
 * slo, whether one probes now, and the highest recent p99 / (slo x quiet p99), x 1000 (0: none
 * known yet). */
typedef struct {
    int slo, probe;
    uint32_t pressure;
} slo_seen;

/* a slot with an slo was seen once: launches ask slo_down */
static _Atomic int g_slo_known;
/* a probe's end further ahead than this is not believed (a row written by hand) */
#define PROBE_AHEAD_MAX_MS 1000
/* a service's slo counts while it launched on the GPU in the last 10 s: between requests
 * further apart the levels start again from the class's bounds */
#define SLO_KEEP_NS 10000000000ull

/* A row's slo, into *seen. */
static void see_slo(const board_row *r, uint64_t now, slo_seen *seen) {
    if (!r->slo_milli) return;
    seen->slo = 1;
    atomic_store_explicit(&g_slo_known, 1, memory_order_relaxed);
    int32_t ahead = (int32_t)(r->probe_until_ms - (uint32_t)(now / 1000000));
    if (r->probe_until_ms && ahead > 0 && ahead <= PROBE_AHEAD_MAX_MS) seen->probe = 1;
    if (r->quiet_p99_us && r->recent_p99_us) {
        uint64_t p =
            (uint64_t)r->recent_p99_us * 1000000ull / ((uint64_t)r->quiet_p99_us * r->slo_milli);
        if (p > seen->pressure) seen->pressure = p > UINT32_MAX ? UINT32_MAX : (uint32_t)p;
    }
}

/* Whether a latency-critical process is busy on `device` now; *since: when it went busy;
 * *present whether one lives there (it launched there in the last CLC_PRIORITY_RESERVE_KEEP_MS,
 * or cannot be told); *seen what their slos say. */
static int lc_busy_now(int device, uint64_t now, uint64_t *since, int *present, slo_seen *seen) {
    *present = 1;
    *seen = (slo_seen){0};
    if (g_board_bad || g_table_full) return 1;
    if ((unsigned)device >= BOARD_DEVICES) {
        CLC_WARN_ONCE("priority: device %d is beyond the board's %d GPUs: its launches are held "
                      "to the floor",
                      device, BOARD_DEVICES);
        return 1;
    }
    if (!g_be_uuid_known[device]) {
        if (!device_uuid(device, g_be_uuid[device])) {
            CLC_WARN_ONCE("priority: the driver does not name device %d (no UUID): its launches "
                          "are held to the floor",
                          device);
            return 1;
        }
        g_be_uuid_known[device] = 1;
    }
    board_slot slot;
    int busy = 0;
    *present = 0;
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
            uint64_t quiet_for = now - v->seen_ns[d];
            if (l && quiet_for < CLC_PRIORITY_RESERVE_KEEP_MS * 1000000ull) *present = 1;
            if (l && quiet_for < SLO_KEEP_NS) see_slo(r, now, seen);
            /* busy: a thread of it blocked waiting for its GPU (whatever is settled: the work
             * may be something clc does not count), or launches not settled and not quiet for
             * longer than the policy's idle_after */
            if (!busy && (r->waiting || (l != s && now - v->seen_ns[d] < g_idle_ns))) {
                *since = r->busy_since_ns;
                *present = busy = 1;
            }
        }
    }
    return busy;
}

static struct {
    uint64_t at_ns, since;
    int busy, present;
    slo_seen slo;
} g_looked[BOARD_DEVICES];

/* lc_busy_now, looked at again only READ_EVERY_NS after the last look (g_be_lock held) */
static int lc_busy(int device, uint64_t now, uint64_t *since, int *present, slo_seen *seen) {
    if ((unsigned)device >= BOARD_DEVICES) return lc_busy_now(device, now, since, present, seen);
    if (!g_looked[device].at_ns || now - g_looked[device].at_ns >= READ_EVERY_NS) {
        g_looked[device].since = 0;
        g_looked[device].busy = lc_busy_now(device, now, &g_looked[device].since,
                                            &g_looked[device].present, &g_looked[device].slo);
        g_looked[device].at_ns = now;
    }
    *since = g_looked[device].since;
    *present = g_looked[device].present;
    *seen = g_looked[device].slo;
    return g_looked[device].busy;
}

/* ---- best-effort: holding, down to the floor --------------------------------------------- */

/* hold statistics of this process, for the exit line */
uint64_t g_holds, g_held_ns, g_held_max_ns, g_floor_releases;
/* The time the process was held, all its threads together (while g_holding of them wait), by
 * this process's own clock: what a latency-critical process writes on the board says only
 * whether it is busy, never how long this process was held. Counted per FLOOR_BUCKET_NS in a
 * ring that covers every window of WINDOW_NS ending now (the oldest bucket is counted whole),
 * so that the floor holds over any window, not per hold: a latency-critical process that goes
 * idle for a moment before the floor would let a hold go gains nothing by it. */
int g_holding;
held_window g_window;

/* Whether a latency-critical process is busy on `device` now, the directories read again
 * when a scan is due (g_be_lock held); *present and *seen as lc_busy_now's, when not NULL. */
static int look(int device, uint64_t now, uint64_t *since, int *present, slo_seen *seen) {
    int lives;
    slo_seen slos;
    if (now - g_scanned_ns >= SCAN_NS) scan(now);
    return lc_busy(device, now, since, present ? present : &lives, seen ? seen : &slos);
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
    if (!look(device, now, &since, NULL, NULL) || !may_hold(now)) {
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
        if (!look(device, now, &s2, NULL, NULL)) break;
    }
    g_holding--;
    g_floor_releases += (uint64_t)released_by_floor;
    clc_rec_hold rec = count_hold(start, now - start, since, device,
                                  (uint32_t)why | (released_by_floor ? CLC_HOLD_FLOOR : 0));
    pthread_mutex_unlock(&g_be_lock);
    clc_capture_write(CLC_REC_HOLD, &rec, sizeof rec, NULL, 0);
}

/* A period that is not a wait, one HOLD record each (g_be_lock held): held_share's busy
 * periods, whose launches ran on the share instead of waiting (CLC_HOLD_SHARED: opened at the
 * first launch that finds the GPU busy, closed at the first that finds it idle), and reserve's
 * (CLC_HOLD_RESERVE: opened at the first launch that finds a latency-critical process living on
 * the GPU, closed at the first that finds none); both closed at exit too. Per device (the
 * last place for every device past the board's), so that a process launching on two GPUs, a
 * latency-critical process on one of them, keeps one period, not one per launch. */
hold_period g_shared_period[BOARD_DEVICES + 1], g_reserve_period[BOARD_DEVICES + 1];

void period_close(hold_period *p, uint64_t now) {
    if (!p->start) return;
    clc_rec_hold rec = {p->start, now - p->start, 0, p->device, p->why};
    if (p->counted) rec = count_hold(p->start, now - p->start, p->since, p->device, p->why);
    p->start = 0;
    clc_capture_write(CLC_REC_HOLD, &rec, sizeof rec, NULL, 0);
}

static void period_seen(hold_period *periods, uint32_t why, int on, uint64_t now, uint64_t since,
                        int device) {
    hold_period *p = &periods[(unsigned)device < BOARD_DEVICES ? device : BOARD_DEVICES];
    if (on && !p->start) {
        *p = (hold_period){.start = now,
                           .since = since,
                           .device = device,
                           .why = why,
                           .counted = (why & CLC_HOLD_SHARED) != 0};
    } else if (!on) {
        period_close(p, now);
    }
}

void periods_close(uint64_t now) {
    for (int d = 0; d <= BOARD_DEVICES; d++) {
        period_close(&g_shared_period[d], now);
        period_close(&g_reserve_period[d], now);
        period_close(&g_slo_period[d], now);
    }
}

/* ---- best-effort: a latency-critical class's slo -------------------------------------------
 * While a latency-critical process with an slo lives on the device, this process's launches
 * there keep to a level `down` below its class's own bounds: 0 the class's held share and
 * run-ahead, 1 half of each, 2 a quarter, 3 no share (held launches wait) and a run-ahead of
 * RUN_AHEAD_STEP. The level is judged from what the slots say (see_slo), at most every
 * SLO_JUDGE_NS: a step down while the service's recent p99 is above slo x its quiet p99, a
 * step up while it is 10 % below. While the service probes, launches keep to level 3 (held
 * whole) and the level is not judged. Each period below the class's bounds is a HOLD record
 * (CLC_HOLD_SLO). */
#define SLO_JUDGE_NS 1000000000ull /* the service's recent periods take about that to renew */
slo_level g_slo_level[BOARD_DEVICES + 1];
hold_period g_slo_period[BOARD_DEVICES + 1];

static int slo_down(int device) {
    pthread_mutex_lock(&g_be_lock);
    uint64_t now = clc_now_ns(), since;
    slo_seen seen;
    look(device, now, &since, NULL, &seen);
    slo_level *l = &g_slo_level[(unsigned)device < BOARD_DEVICES ? device : BOARD_DEVICES];
    if (!seen.slo) {
        l->down = 0;
    } else if (!seen.probe && seen.pressure && now - l->judged_ns >= SLO_JUDGE_NS) {
        l->judged_ns = now;
        if (seen.pressure > 1000 && l->down < 3)
            l->down++;
        else if (seen.pressure < 900 && l->down > 0)
            l->down--;
    }
    int down = seen.probe ? 3 : l->down;
    period_seen(g_slo_period, CLC_HOLD_BUSY | CLC_HOLD_SLO, down > 0, now, 0, device);
    pthread_mutex_unlock(&g_be_lock);
    return down;
}

/* reserve: whether a latency-critical process lives on `device` (its launches leave the
 * reserve free meanwhile), its period opened or closed. */
static int lc_present(int device) {
    pthread_mutex_lock(&g_be_lock);
    uint64_t now = clc_now_ns(), since;
    int present;
    look(device, now, &since, &present, NULL);
    period_seen(g_reserve_period, CLC_HOLD_BUSY | CLC_HOLD_RESERVE, present, now, 0, device);
    pthread_mutex_unlock(&g_be_lock);
    return present;
}

static int held_to_share(int device) {
    pthread_mutex_lock(&g_be_lock);
    uint64_t now = clc_now_ns(), since = 0;
    int busy = look(device, now, &since, NULL, NULL);
    period_seen(g_shared_period, CLC_HOLD_BUSY | CLC_HOLD_SHARED, busy, now, since, device);
    pthread_mutex_unlock(&g_be_lock);
    return busy;
}

static uint64_t be_launch(int device, CUcontext ctx, CUstream stream, int per_thread,
                          int confinable) {
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
    int down = 0;
    if (g_held_word && confinable) {
        int busy = held_to_share(device);
        if (atomic_load_explicit(&g_slo_known, memory_order_relaxed)) down = slo_down(device);
        if (busy && !(word = g_held_words[3 - down])) hold(device);
    } else {
        hold(device);
        if (atomic_load_explicit(&g_slo_known, memory_order_relaxed)) down = slo_down(device);
    }
    if (g_reserve_word && lc_present(device)) {
        if (!confinable)
            CLC_WARN_ONCE("priority: a graph replay cannot be confined: it runs on the whole "
                          "GPU, the reserve included");
        else if (!word)
            word = g_reserve_word;
    }
    if (g_n_views) bound_run_ahead(ctx, stream, per_thread, down);
    if (exchanged) g_drv.exchange_capture_mode(&mode);
    t_in_clc = was;
    return word;
}

uint64_t clc_priority_be_launch(int device, CUcontext ctx, CUstream stream, int per_thread) {
    return be_launch(device, ctx, stream, per_thread, 1);
}

void clc_priority_be_graph_launch(int device, CUcontext ctx, CUstream stream, int per_thread) {
    be_launch(device, ctx, stream, per_thread, 0);
}
