/* SPDX-License-Identifier: Apache-2.0
 *
 * latency_critical.c: the slot a latency-critical process writes on the board: its launches
 * counted, settled by its synchronizations.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "priority.h"
#include "priority_internal.h"

/* ---- latency-critical: the slot this process writes -------------------------------------- */

board_slot *_Atomic g_slot; /* published once its header and g_slot_pid are written */
char g_slot_name[64];
pid_t g_slot_pid;   /* the process the slot is of (a forked child makes its own) */
static pid_t g_slot_tried;        /* the process that last tried to make one, and when */
static uint64_t g_slot_tried_ns;
int g_slot_dir = -1;
dev_t g_slot_dir_dev;
ino_t g_slot_dir_ino;
/* Per GPU, the streams the process launched on: for each, the number (the row's `launched`
 * after it) of its last launch, and the number up to which its work is known done (a
 * synchronization of it, an event recorded on it that completed, a synchronization of the
 * device). The GPU is idle once every stream's work is done: the row is then settled. A stream
 * whose work is done gives its place to the next new one; a launch on a stream that finds no
 * place leaves the GPU busy until the device is synchronized (`untracked`). */
lc_streams g_streams[BOARD_DEVICES];

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

/* The slot's row for `device`: the slot made at the process's first launch, the row's UUID at
 * the first launch on the device. */
pthread_mutex_t g_slot_lock = PTHREAD_MUTEX_INITIALIZER;

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
            atomic_store_explicit(&r->slo_milli, g_slo_milli, memory_order_relaxed);
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

/* Raises *a to v if it is lower. */
static void raise_to(_Atomic uint64_t *a, uint64_t v) {
    uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (cur < v && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_acq_rel,
                                                             memory_order_relaxed));
}

/* A place being given to a new stream: no launch or settling takes it meanwhile. */
#define CLAIMING ((CUstream)(uintptr_t)-2)

static int place_done(lc_stream *p) {
    return atomic_load_explicit(&p->done, memory_order_acquire) >=
           atomic_load_explicit(&p->last, memory_order_acquire);
}

/* The launch numbered `seq` went to stream `key`: its place's last launch. A place whose
 * stream's work is all done is given to a new stream by claiming it first (CLAIMING), checking
 * it is still done, then writing it and publishing the key; a launch that raised a place's last
 * looks again that the place is still its stream's, so that a launch is never left on a place
 * given away meanwhile. */
static void note_stream(int device, CUstream key, uint64_t seq) {
    lc_streams *ls = &g_streams[device];
    for (int i = 0; i < LC_STREAMS; i++) {
        lc_stream *p = &ls->place[i];
        if (atomic_load_explicit(&p->key, memory_order_acquire) != key) continue;
        raise_to(&p->last, seq);
        if (atomic_load_explicit(&p->key, memory_order_acquire) == key) return;
        break; /* given away under it: noted anew below */
    }
    for (int i = 0; i < LC_STREAMS; i++) {
        lc_stream *p = &ls->place[i];
        CUstream k = atomic_load_explicit(&p->key, memory_order_acquire);
        if (k == CLAIMING || (k != NULL && !place_done(p))) continue;
        if (!atomic_compare_exchange_strong(&p->key, &k, CLAIMING)) continue;
        if (k != NULL && !place_done(p)) { /* a launch of its stream came meanwhile */
            atomic_store_explicit(&p->key, k, memory_order_release);
            continue;
        }
        atomic_store_explicit(&p->done, 0, memory_order_release);
        atomic_store_explicit(&p->last, seq, memory_order_release);
        atomic_store_explicit(&p->seen_last, 0, memory_order_release);
        atomic_store_explicit(&p->key, key, memory_order_release);
        return;
    }
    atomic_store_explicit(&ls->untracked_ns, clc_now_ns(), memory_order_release);
    if (!atomic_exchange_explicit(&ls->untracked, 1, memory_order_acq_rel))
        CLC_WARN_ONCE("priority: work in flight on more than %d streams of device %d: the GPU "
                      "counts as busy until the device is synchronized, or for idle_after_ms "
                      "after the last launch that found no place",
                      LC_STREAMS, device);
}

void clc_priority_lc_launch(int device, CUstream stream, int ptsz) {
    if (unlikely((unsigned)device >= BOARD_DEVICES)) {
        CLC_WARN_ONCE("priority: device %d is beyond the board's %d GPUs: its "
                      "launches do not hold best-effort work",
                      device, BOARD_DEVICES);
        return;
    }
    board_slot *slot = slot_now();
    board_row *r = slot ? &slot->rows[device] : NULL;
    if (unlikely(!r || !atomic_load_explicit(&r->used, memory_order_acquire)) &&
        !(r = lc_row_slow(device)))
        return;
    /* A launch captured into a graph runs nothing now (the graph's replays count). The legacy
     * default stream cannot capture: only launches on other streams ask the driver. */
    int capturing;
    if ((ptsz || (stream != NULL && stream != CU_STREAM_LEGACY)) &&
        clc_stream_capture_status(stream, ptsz, &capturing) == CUDA_SUCCESS &&
        capturing != CU_STREAM_CAPTURE_STATUS_NONE)
        return;
    uint64_t before = atomic_fetch_add_explicit(&r->launched, 1, memory_order_acq_rel);
    if (before == atomic_load_explicit(&r->settled, memory_order_acquire))
        atomic_store_explicit(&r->busy_since_ns, clc_now_ns(), memory_order_release);
    note_stream(device, stream_key(stream, ptsz), before + 1);
}

/* Whether a stream's work, not known done, counts as done all the same: no launch on it for
 * idle_after_ms, as settlings saw it, while the process waited for other work (as a process
 * quiet for that long counts as idle). Work waited for in a way clc does not follow (a stream
 * made to wait for another's event, a warm-up on a side stream) ends so. */
static int quiet_stream(lc_stream *p, uint64_t l, uint64_t now) {
    if (atomic_load_explicit(&p->seen_last, memory_order_acquire) != l) {
        atomic_store_explicit(&p->seen_last, l, memory_order_release);
        atomic_store_explicit(&p->seen_ns, now, memory_order_release);
        return 0;
    }
    return now - atomic_load_explicit(&p->seen_ns, memory_order_acquire) >= g_idle_ns;
}

/* ---- latency-critical: the slo ------------------------------------------------------------
 * A busy period runs from the launch that finds the GPU idle (busy_since_ns) to the settling
 * that makes it idle again. Periods that begin during a probe (best-effort work held whole,
 * PROBE_NS every PROBE_EVERY_NS, the first at the first period), PROBE_DRAIN_NS in or later
 * (work queued before it drained), are the quiet ones; those that begin after it, the recent
 * ones. The row gives the p99 of the last SLO_RING quiet periods, and of the recent periods
 * that ended in the last RECENT_NS (the newest SLO_MIN_SAMPLES at least): best-effort
 * processes compare them with the slo (best_effort.c) and give up share and run-ahead while
 * recent > slo x quiet. */
uint32_t g_slo_milli;
slo_rings g_slo[BOARD_DEVICES];
#define PROBE_NS 300000000ull
#define PROBE_DRAIN_NS 30000000ull
#define PROBE_EVERY_NS 10000000000ull
#define RECENT_NS 1000000000ull
#define SLO_MIN_SAMPLES 16 /* a p99 is published from this many periods on */
static pthread_mutex_t g_slo_lock = PTHREAD_MUTEX_INITIALIZER;

/* The p99 of the samples of a ring of n taken so far that ended at or after `from` (all when
 * `ended` is NULL), the newest SLO_MIN_SAMPLES at least: by rank, the largest of up to 100, the
 * second largest above. */
static uint32_t p99_of(const uint32_t *ring, const uint64_t *ended, uint32_t n, uint64_t from) {
    uint32_t k = n < SLO_RING ? n : SLO_RING, a = 0, b = 0, used = 0;
    for (uint32_t age = 0; age < k; age++) { /* newest first */
        uint32_t i = (n - 1 - age) % SLO_RING;
        if (ended && age >= SLO_MIN_SAMPLES && ended[i] < from) break;
        used++;
        if (ring[i] > a)
            b = a, a = ring[i];
        else if (ring[i] > b)
            b = ring[i];
    }
    return used > 100 ? b : a;
}

static void take_sample(uint32_t *ring, uint64_t *ended, uint32_t *n, uint32_t us, uint64_t now,
                        _Atomic uint32_t *out) {
    ring[*n % SLO_RING] = us ? us : 1;
    if (ended) ended[*n % SLO_RING] = now;
    if (++*n >= SLO_MIN_SAMPLES)
        atomic_store_explicit(out, p99_of(ring, ended, *n, now - RECENT_NS), memory_order_relaxed);
}

/* The row went idle at `now`: its busy period taken once (a thread that finds another taking
 * one leaves it: a sample lost, never a wait). */
static void slo_period(int device, board_row *r, uint64_t now) {
    slo_rings *s = &g_slo[device];
    uint64_t since = atomic_load_explicit(&r->busy_since_ns, memory_order_acquire);
    if (!since || since > now ||
        atomic_exchange_explicit(&s->period_of, since, memory_order_acq_rel) == since ||
        pthread_mutex_trylock(&g_slo_lock) != 0)
        return;
    uint64_t us = (now - since) / 1000;
    uint32_t sample = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    if (s->probe_start && since >= s->probe_start + PROBE_DRAIN_NS && since <= s->probe_end)
        take_sample(s->quiet, NULL, &s->n_quiet, sample, now, &r->quiet_p99_us);
    else if (since > s->probe_end)
        take_sample(s->recent, s->recent_end, &s->n_recent, sample, now, &r->recent_p99_us);
    if (now >= s->next_probe) {
        s->probe_start = now;
        s->probe_end = now + PROBE_NS;
        s->next_probe = now + PROBE_EVERY_NS;
        uint32_t until = (uint32_t)(s->probe_end / 1000000);
        atomic_store_explicit(&r->probe_until_ms, until ? until : 1, memory_order_release);
    }
    pthread_mutex_unlock(&g_slo_lock);
}

/* At exit: per device, the p99s the slot gave last, into the capture (and with -v, said). */
void lc_slo_said(void) {
    board_slot *slot = slot_now();
    for (int d = 0; slot && d < BOARD_DEVICES; d++) {
        const board_row *r = &slot->rows[d];
        if (!atomic_load_explicit(&r->used, memory_order_acquire) || !g_slo[d].period_of) continue;
        clc_note("priority: slo %.2f on device %d: busy periods' p99 %.2f ms while best-effort "
                 "work was held (%u periods), %.2f ms otherwise (%u periods)",
                 g_slo_milli / 1000.0, d, atomic_load(&r->quiet_p99_us) / 1000.0, g_slo[d].n_quiet,
                 atomic_load(&r->recent_p99_us) / 1000.0, g_slo[d].n_recent);
    }
}

/* Raises the row's settled count to v; with an slo, a busy period ended when that made the row
 * idle. */
static void settle_row(int device, board_row *r, uint64_t v, uint64_t now) {
    raise_to(&r->settled, v);
    if (g_slo_milli && atomic_load_explicit(&r->settled, memory_order_acquire) ==
                           atomic_load_explicit(&r->launched, memory_order_acquire))
        slo_period(device, r, now);
}

/* Work known done: on stream `key` up to launch `upto`, or (key NULL) on every stream. Once
 * every stream's work is done, the row is settled up to the last launch seen. */
static void settle(int device, CUstream key, uint64_t upto) {
    board_row *r = &slot_now()->rows[device];
    lc_streams *ls = &g_streams[device];
    uint64_t last = 0, now = clc_now_ns();
    int idle = 1;
    if (!key || now - atomic_load_explicit(&ls->untracked_ns, memory_order_acquire) >= g_idle_ns)
        atomic_store_explicit(&ls->untracked, 0, memory_order_release);
    for (int i = 0; i < LC_STREAMS; i++) {
        lc_stream *p = &ls->place[i];
        CUstream k = atomic_load_explicit(&p->key, memory_order_acquire);
        if (!k) continue;
        if (k == CLAIMING) { /* a new stream's first launch, being noted */
            idle = 0;
            continue;
        }
        if (!key || k == key) raise_to(&p->done, upto);
        uint64_t l = atomic_load_explicit(&p->last, memory_order_acquire);
        if (atomic_load_explicit(&p->done, memory_order_acquire) < l && quiet_stream(p, l, now))
            raise_to(&p->done, l);
        if (atomic_load_explicit(&p->done, memory_order_acquire) < l) idle = 0;
        if (l > last) last = l;
    }
    if (!key) {
        settle_row(device, r, upto, now); /* the whole device: whatever the places say */
        return;
    }
    if (idle && !atomic_load_explicit(&ls->untracked, memory_order_acquire))
        settle_row(device, r, last, now);
}

uint64_t clc_priority_sync_begin(int device, int blocking, int *counted) {
    board_slot *slot = slot_now();
    *counted = 0;
    if (!slot || (unsigned)device >= BOARD_DEVICES || g_slot_pid != getpid()) return 0;
    if (blocking) atomic_fetch_add_explicit(&slot->rows[device].waiting, 1, memory_order_acq_rel);
    *counted = blocking ? SYNC_WAITING : SYNC_QUERY;
    return atomic_load_explicit(&slot->rows[device].launched, memory_order_acquire);
}

uint64_t clc_priority_launched(int device) {
    board_slot *slot = slot_now();
    if (!slot || (unsigned)device >= BOARD_DEVICES) return 0;
    return atomic_load_explicit(&slot->rows[device].launched, memory_order_acquire);
}

/* A wait counted by clc_priority_sync_begin ended: no longer waiting; when it returned
 * successfully, the work of stream `key` (of every stream: `whole`) done up to `upto`. */
static void wait_ended(int device, int counted, int done, int whole, CUstream key, uint64_t upto) {
    board_slot *slot = slot_now();
    if (!counted || !slot || (unsigned)device >= BOARD_DEVICES || g_slot_pid != getpid()) return;
    if (counted == SYNC_WAITING)
        atomic_fetch_sub_explicit(&slot->rows[device].waiting, 1, memory_order_acq_rel);
    if (done && (whole || key)) settle(device, whole ? NULL : key, upto);
}

void clc_priority_sync_end(int device, uint64_t launched, int whole_context, CUstream stream,
                           int ptsz, int counted, int done) {
    wait_ended(device, counted, done, whole_context, stream_key(stream, ptsz), launched);
}

/* ---- events: what the process waits on, besides synchronizations --------------------------- */
typedef struct {
    CUevent ev;
    int device;
    CUstream key;      /* the stream it was recorded on */
    uint64_t launched; /* the row's launches when it was recorded */
} lc_event;
static lc_event g_events[CLC_LC_EVENTS];
static pthread_mutex_t g_events_lock = PTHREAD_MUTEX_INITIALIZER;

/* The table's lock, taken with t_in_clc set (a signal handler's event call on this thread then
 * passes straight through instead of waiting for it); what t_in_clc was. */
static int events_lock(void) {
    int was = t_in_clc;
    t_in_clc = 1;
    pthread_mutex_lock(&g_events_lock);
    return was;
}

static void events_unlock(int was) {
    pthread_mutex_unlock(&g_events_lock);
    t_in_clc = was;
}

static lc_event *event_place(CUevent ev) {
    uint64_t x = (uint64_t)(uintptr_t)ev * 0x9e3779b97f4a7c15ull;
    return &g_events[(x >> 32) % CLC_LC_EVENTS];
}

void clc_priority_event_record(int device, CUevent ev, CUstream stream, int ptsz,
                               uint64_t launched) {
    board_slot *slot = slot_now();
    if (!slot || (unsigned)device >= BOARD_DEVICES || g_slot_pid != getpid() || !ev) return;
    int was = events_lock();
    *event_place(ev) = (lc_event){
        .ev = ev, .device = device, .key = stream_key(stream, ptsz), .launched = launched};
    events_unlock(was);
}

int clc_priority_event_covers(CUevent ev, CUstream *key, uint64_t *launched) {
    int device = -1;
    int was = events_lock();
    lc_event *e = event_place(ev);
    if (ev && e->ev == ev) device = e->device, *key = e->key, *launched = e->launched;
    events_unlock(was);
    return device;
}

void clc_priority_event_settle(int device, CUstream key, uint64_t launched, int counted, int done) {
    wait_ended(device, counted, done, 0, key, launched);
}

void clc_priority_event_forget(CUevent ev) {
    int was = events_lock();
    lc_event *e = event_place(ev);
    if (e->ev == ev) e->ev = NULL;
    events_unlock(was);
}

/* A forked child: the parent's events are not its own, and another thread of the parent may
 * have held the lock. */
void lc_events_after_fork(void) {
    pthread_mutex_init(&g_events_lock, NULL);
    memset(g_events, 0, sizeof g_events);
    pthread_mutex_init(&g_slo_lock, NULL); /* its periods are the parent's (g_slo cleared) */
}
