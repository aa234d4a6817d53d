/* SPDX-License-Identifier: Apache-2.0
 *
 * capture.c: writes the capture file (layout in clc_abi.h).
 *
 * Each launching thread appends whole records to its own ring buffer and publishes them by
 * advancing `head` (release). A flusher thread writes what is published to the file every
 * FLUSH_MS, so what was flushed survives a crash of the program. A thread whose buffer is full
 * flushes it itself, under the file lock: that is the only lock a recording launch can meet,
 * and only when the flusher has fallen a whole buffer behind.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "records.h"

#define BUF_SIZE (256u * 1024u)
#define FLUSH_MS 100
/* The counts that changed are written every this many flushes: a process killed by SIGKILL loses
 * at most this long of its counts, and the records of its last flush interval. */
#define SNAPSHOT_ROUNDS 10
/* The most of the size cap a thread claims at once for its launch and timing records. */
#define CLAIM_CHUNK (16u * 1024u)
#define STATS_RECORD (sizeof(clc_record_header) + sizeof(clc_rec_kernel_stats))
#define RULE_RECORD (sizeof(clc_record_header) + sizeof(clc_rec_rule_stats))
#define END_RECORD (sizeof(clc_record_header) + sizeof(clc_rec_end))

/* Records a signal handler made while its thread was filling a record of its own: kept aside,
 * then moved into the thread's buffer when that record is committed. */
#define NESTED_SIZE 4096
typedef struct {
    _Atomic uint32_t used;
    char data[NESTED_SIZE] __attribute__((aligned(8)));
} nested_records;

typedef struct tbuf {
    char *data;
    _Atomic size_t head; /* bytes published by the owner */
    _Atomic size_t tail; /* bytes written to the file */
    /* The owning thread's alone (a signal handler on it writes only to `nested`): */
    size_t reserved; /* the end of the record being filled; head when none is */
    uint64_t budget; /* bytes of the size cap claimed and not yet used */
    nested_records *_Atomic nested;
    struct tbuf *next;
    _Atomic int owned; /* 0: free for the next new thread to take */
} tbuf;

static tbuf *_Atomic g_bufs; /* every buffer ever made, newest first; never freed */
static pthread_mutex_t g_file_lock = PTHREAD_MUTEX_INITIALIZER;
/* The capture file, by path and identity. clc keeps a descriptor of it, at a high number, and
 * checks before each flush that it is still that file (device and inode); when the program has
 * closed it or put another file at its number, the file is opened again by its path (no link
 * another user controls followed) and checked, so that a program that closes or reuses
 * descriptors can neither lose the capture nor receive it. The kept descriptor outlives a change
 * of user that would forbid opening the file again. */
#define HIGH_FD 512
static char g_path[4200];
static struct stat g_file;
static int g_fd = -1;
static int g_file_ok; /* 0 once the file is gone or replaced: said once, nothing more written */
static uint64_t g_written, g_lost_bytes;
static int g_write_errno;
/* The size cap (--capture-limit) holds for the whole file: every record is claimed against it
 * before it is written. The counts (COUNTS records, see "the counts" below) and the END record
 * have room set aside (g_reserve) as kernels appear; records a capture must keep (kernels, loads,
 * warnings) may use the rest; launch and timing records and info messages stop first. */
static uint64_t g_max_bytes;
static _Atomic uint64_t g_claimed, g_reserve;
/* The part of g_reserve kept for COUNTS records to come and the wrapped kernels' WRAP_STATS. */
static _Atomic uint64_t g_counts_room;
static _Atomic int g_end_room;         /* the first END record's room is still in g_reserve */
static _Atomic uint64_t g_capped_bytes;
static _Atomic int g_over_cap;   /* an ordinary record found no room: later ones are not tried */
static _Atomic int g_truncated;  /* a record the capture keeps found no room */
static _Atomic int g_state; /* 0: not opened, 1: open, 2: failed or off */
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t g_dropped;
static _Atomic uint64_t g_undecided;
static CLC_TLS tbuf *t_buf;
/* Records begun and not yet committed on this thread: more than one only when a signal handler
 * interrupted the thread's own record (its records then go aside, see nested_records). */
static CLC_TLS unsigned t_depth;
static CLC_TLS uint32_t t_tid;
static pthread_key_t g_thread_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

uint64_t clc_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Launch timestamps. CLOCK_MONOTONIC costs 30-60 ns right after a launch (measured on an
 * H200 host), the TSC about 10. Where the kernel itself keeps time by the TSC (clocksource
 * "tsc"), launch times come from it, converted with a calibration against CLOCK_MONOTONIC
 * that the flusher refreshes every FLUSH_MS; before the first one, and elsewhere,
 * clock_gettime. Calibrations are published by pointer into a small ring, so that a reader
 * never sees one half-written. */
typedef struct {
    uint64_t tsc0, ns0; /* one moment on both clocks */
    uint64_t mult;      /* ns per TSC tick, times 2^32 */
} tsc_calibration;

static tsc_calibration g_cal_ring[4];
static tsc_calibration *_Atomic g_cal;
static int g_tsc_usable;
static uint64_t g_cal_first_tsc, g_cal_first_ns;
static unsigned g_cal_next;

#if defined(__x86_64__)
/* One moment on both clocks: the TSC read between two clock reads, the tightest pair of a few
 * tries (a preempted try would be off by the preemption). */
static void clock_pair(uint64_t *tsc, uint64_t *ns) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = clc_now_ns(), t = __rdtsc(), b = clc_now_ns();
        if (b - a < best) {
            best = b - a;
            *tsc = t;
            *ns = a + (b - a) / 2;
        }
    }
}
#endif

static void calibrate(void) {
#if defined(__x86_64__)
    if (!g_tsc_usable) return;
    uint64_t tsc = 0, ns = 0;
    clock_pair(&tsc, &ns);
    if (!g_cal_first_tsc) {
        g_cal_first_tsc = tsc;
        g_cal_first_ns = ns;
        return;
    }
    if (ns - g_cal_first_ns < 10000000ull || tsc <= g_cal_first_tsc) return;
    tsc_calibration *c = &g_cal_ring[g_cal_next++ % 4];
    c->tsc0 = tsc;
    c->ns0 = ns;
    c->mult =
        (uint64_t)(((unsigned __int128)(ns - g_cal_first_ns) << 32) / (tsc - g_cal_first_tsc));
    atomic_store_explicit(&g_cal, c, memory_order_release);
#endif
}

static void check_tsc(void) {
    char src[32] = {0};
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource",
                  O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, src, sizeof src - 1);
    close(fd);
    g_tsc_usable = n >= 3 && strncmp(src, "tsc", 3) == 0 && (n == 3 || src[3] == '\n');
}

static CLC_TLS uint64_t t_last_launch_ns;

/* Never earlier than the thread's previous launch: a new calibration may move the clock back
 * by the error of the old one (tens of ns). */
uint64_t clc_launch_time_ns(void) {
    uint64_t ns = 0;
#if defined(__x86_64__)
    const tsc_calibration *c = atomic_load_explicit(&g_cal, memory_order_acquire);
    if (likely(c != NULL)) {
        uint64_t tsc = __rdtsc();
        /* A thread may read the TSC a little before the calibration point was taken. */
        if (likely(tsc >= c->tsc0))
            ns = c->ns0 + (uint64_t)(((unsigned __int128)(tsc - c->tsc0) * c->mult) >> 32);
        else
            ns = c->ns0 - (uint64_t)(((unsigned __int128)(c->tsc0 - tsc) * c->mult) >> 32);
    }
#endif
    if (!ns) ns = clc_now_ns();
    if (unlikely(ns < t_last_launch_ns)) ns = t_last_launch_ns;
    t_last_launch_ns = ns;
    return ns;
}

uint32_t clc_tid(void) {
    if (unlikely(!t_tid)) t_tid = (uint32_t)gettid();
    return t_tid;
}

/* A line on stderr, at once: about the capture itself, so never into it. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n > 0) (void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int is_capture(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == g_file.st_dev &&
           st.st_ino == g_file.st_ino;
}

/* Keeps fd at a high number, out of the way of descriptors programs number themselves. */
static void keep(int fd) {
    int high = fcntl(fd, F_DUPFD_CLOEXEC, HIGH_FD);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    g_fd = fd;
}

/* The capture, for writing (called with g_file_lock held, or from a fatal signal's handler);
 * -1 (said once) when it is no longer clc's file. Never closed by the caller. */
static int open_capture_fd(void) {
    if (is_capture(g_fd)) return g_fd;
    g_fd = -1; /* not ours any more: never closed here */
    int fd = clc_reopen_file(g_path, &g_file);
    if (fd >= 0) {
        keep(fd);
        return g_fd;
    }
    int e = errno;
    g_file_ok = 0;
    if (CLC_FIRST_TIME())
        say("clc: the capture %s %s: no more records are written\n", g_path,
            e == ESTALE  ? "was replaced by another file"
            : e == EPERM ? "is now reached through a link another user controls"
                         : strerror(e));
    return -1;
}

/* n bytes the file refused (error e): counted, and said once, on stderr at the time (the capture
 * may be what cannot be written). */
static void lost(size_t n, int e) {
    g_lost_bytes += n;
    if (!g_write_errno) g_write_errno = e;
    if (CLC_FIRST_TIME())
        say("clc: writing the capture %s failed: %s; records are being lost (counted in its "
            "counts and end record, if those can be written)\n",
            g_path, strerror(e));
}

/* Writes parts (whole records) at the file's end, or loses them, counted; the offset they start
 * at, or -1. A failed or short write is cut back off, so that the file stays a sequence of whole
 * records, and the next one starts where it started. */
static off_t append_parts(int fd, const char *const *p, const size_t *n, int parts) {
    size_t total = 0;
    for (int i = 0; i < parts; i++) total += n[i];
    off_t before = lseek(fd, 0, SEEK_END);
    int e = before < 0 ? errno : 0;
    for (int i = 0; i < parts && !e; i++) e = write_all(fd, p[i], n[i]);
    if (!e) {
        g_written += total;
        return before;
    }
    if (before >= 0 && ftruncate(fd, before) == 0) (void)lseek(fd, before, SEEK_SET);
    lost(total, e);
    return -1;
}

static void append(int fd, const char *p, size_t n) { (void)append_parts(fd, &p, &n, 1); }

/* Called with g_file_lock held; fd is the capture opened for this flush. */
static void flush_buf(tbuf *b, int fd) {
    size_t head = atomic_load_explicit(&b->head, memory_order_acquire);
    size_t tail = atomic_load_explicit(&b->tail, memory_order_relaxed);
    if (head == tail) return;
    size_t from = tail % BUF_SIZE, n = head - tail;
    size_t first = n < BUF_SIZE - from ? n : BUF_SIZE - from;
    if (fd >= 0) {
        append(fd, b->data + from, first);
        if (n > first) append(fd, b->data, n - first);
    }
    atomic_store_explicit(&b->tail, head, memory_order_release);
}

static int pending(const tbuf *b) {
    return atomic_load_explicit(&b->head, memory_order_acquire) !=
           atomic_load_explicit(&b->tail, memory_order_relaxed);
}

/* Flushes one buffer (or all, b NULL) through a descriptor of its own. */
static void flush_locked(tbuf *b) {
    int any = b ? pending(b) : 0;
    for (tbuf *x = b ? NULL : atomic_load(&g_bufs); x && !any; x = x->next) any = pending(x);
    if (!any) return;
    int fd = g_file_ok ? open_capture_fd() : -1;
    if (b)
        flush_buf(b, fd);
    else
        for (tbuf *x = atomic_load(&g_bufs); x; x = x->next) flush_buf(x, fd);
}

/* ---- the size cap -----------------------------------------------------------------------------
 */

/* Claims n bytes of the cap, leaving `keep` bytes of it unclaimed: 1 when they fit. */
static int claim(uint64_t n, uint64_t keep) {
    uint64_t have = atomic_load_explicit(&g_claimed, memory_order_relaxed);
    do {
        if (have + n + keep > g_max_bytes) return 0;
    } while (!atomic_compare_exchange_weak(&g_claimed, &have, have + n));
    return 1;
}

static void capped(uint64_t n, int essential) {
    atomic_fetch_add_explicit(&g_capped_bytes, n, memory_order_relaxed);
    if (essential) {
        if (!atomic_exchange(&g_truncated, 1))
            say("clc: the capture %s reached its size limit (%llu bytes) before records it must "
                "keep (kernels, loads, warnings): those are dropped, and the capture cannot vouch "
                "for the run\n",
                g_path, (unsigned long long)g_max_bytes);
    } else if (!atomic_exchange(&g_over_cap, 1)) {
        say("clc: the capture %s reached its size limit (%llu bytes): later launch and timing "
            "records are dropped and counted; counts stay exact\n",
            g_path, (unsigned long long)g_max_bytes);
    }
}

/* Room under the cap for a record of n bytes (its padding included). A record the capture keeps
 * may use all but the room set aside (a kernel's also sets aside room for its counts); the others
 * come from the thread's claimed budget, refilled a chunk at a time. */
__attribute__((noinline)) static int fits_slow(tbuf *b, uint64_t n, int essential,
                                               uint64_t also_reserve) {
    if (essential) {
        if (claim(n + also_reserve, atomic_load(&g_reserve))) {
            /* The room claimed for the kernel's counts goes back, set aside for them. */
            atomic_fetch_add(&g_counts_room, also_reserve);
            atomic_fetch_add(&g_reserve, also_reserve);
            atomic_fetch_sub(&g_claimed, also_reserve);
            return 1;
        }
        capped(n, 1);
        return 0;
    }
    if (!atomic_load_explicit(&g_over_cap, memory_order_relaxed)) {
        uint64_t left = g_max_bytes - atomic_load(&g_claimed), keep = atomic_load(&g_reserve);
        uint64_t chunk = left > keep ? (left - keep) / 16 : 0;
        if (chunk > CLAIM_CHUNK) chunk = CLAIM_CHUNK;
        if (chunk < n) chunk = n;
        if (claim(chunk, keep)) {
            b->budget += chunk - n;
            return 1;
        }
    }
    capped(n, 0);
    return 0;
}

/* The common case inline: a launch or timing record from what the thread claimed already. */
static inline int fits(tbuf *b, uint64_t n, int essential, uint64_t also_reserve) {
    if (!g_max_bytes) return 1;
    if (likely(!essential && b->budget >= n)) {
        b->budget -= n;
        return 1;
    }
    return fits_slow(b, n, essential, also_reserve);
}

/* ---- the counts -------------------------------------------------------------------------------
 * Every kernel's counts, every rule's and the capture's own (records dropped, capped, lost) live
 * in COUNTS records (clc_abi.h), each written once at the file's end and then overwritten in
 * place, a copy at a time: they take no more room however long the process runs, and neither
 * the size cap that stopped the launch records nor a SIGKILL (which loses at most their last
 * second) can take them. Each kernel has a slot in one of them, given at its KERNEL record, in
 * the order kernels appear. The first COUNTS record (a segment) holds the rules' slots, the slot
 * of the launches decided without the table, and FIRST_SLOTS kernels; each later one holds as
 * many kernels as all before it (at most MAX_SLOTS). A segment's copy is made in memory, so that
 * a fatal signal's handler writes it without allocating, and only a segment whose counts
 * changed is written again.
 *
 * Locks, in the order they are taken: g_counts_lock (the copies in memory: one writer at a
 * time), the decision table's (the walk over the kernels' counts), g_file_lock, g_slots_lock (the
 * slots and the segments). A kernel's first sight takes the table's lock, then g_slots_lock.
 */
#define FIRST_SLOTS 16
/* A segment's record stays far below the reader's limit on a record's size (16 MiB). */
#define MAX_SLOTS 65536
#define COPY_HEADER sizeof(clc_counts_copy)
#define SEGMENT_HEAD (sizeof(clc_record_header) + sizeof(clc_rec_counts))
/* The room under the cap a kernel sets aside for its counts: its slot in both copies, as much
 * again for a slot to come (a new segment holds as many slots as all before it), and its share
 * of the segments' headers (a segment holds at least FIRST_SLOTS kernels). */
#define KERNEL_ROOM (4 * STATS_RECORD + (SEGMENT_HEAD + 2 * COPY_HEADER) / FIRST_SLOTS)
/* The room a kernel that may be wrapped sets aside for its WRAP_STATS record, written at exit
 * (the wrapper's counts are on the GPU until then): with the names up to WRAP_NAMES bytes. */
#define WRAP_NAMES 512
#define WRAP_ROOM (sizeof(clc_record_header) + sizeof(clc_rec_wrap_stats) + WRAP_NAMES)

typedef struct segment {
    struct segment *next;
    char *copy;             /* the copy to write: clc_counts_copy, then the slots */
    uint32_t capacity;      /* bytes of a copy */
    uint32_t first, slots;  /* the kernel slots it holds */
    uint32_t kernels_at;    /* where the first of them lies in a copy */
    off_t at;               /* its record's offset in the file; -1 before it is written there */
    unsigned turn;          /* the copy (0 or 1) that its next write overwrites */
    int changed;            /* a count in `copy` changed since it was last written */
    int refused;            /* the cap had no room for it: said once */
} segment;

typedef struct {
    uint32_t id; /* kernel id + 1; 0: free */
    uint32_t slot;
} slot_entry;

typedef struct {
    uint64_t dropped, lost, capped, undecided;
    int32_t write_errno;
    uint32_t flags;
} capture_counts;

static pthread_mutex_t g_counts_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_slots_lock = PTHREAD_MUTEX_INITIALIZER;
static segment *g_segments;    /* the first segment, then the later ones in order */
static slot_entry *g_slot_map; /* kernel id -> slot: open addressing, at most half full */
static uint32_t g_slot_map_size, g_slots_given, g_slots_made;
static uint32_t g_rule_slots; /* RULE_STATS slots of the first segment */
static uint64_t g_generation;
static capture_counts g_counts_written; /* the capture's counts in the first segment's copy */
static uint32_t g_crc_table[256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void make_crc_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        g_crc_table[i] = c;
    }
}

/* zlib's crc32(): crc32(crc32(0, a), b) is the CRC of a then b. */
static uint32_t crc32_of(uint32_t crc, const char *p, size_t n) {
    crc = ~crc;
    while (n--) crc = g_crc_table[(crc ^ (uint8_t)*p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* A segment of `slots` kernel slots from `first` (the first segment has `rules` RULE_STATS slots
 * and the uncached kernel's slot before them), every slot empty (a PAD record); NULL without
 * memory. */
static segment *new_segment(uint32_t first, uint32_t slots, uint32_t rules) {
    uint32_t kernels_at = COPY_HEADER + rules * RULE_RECORD + (rules ? STATS_RECORD : 0);
    uint32_t capacity = kernels_at + slots * STATS_RECORD;
    segment *s = calloc(1, sizeof *s);
    char *copy = s ? calloc(1, capacity) : NULL;
    if (!copy) {
        free(s);
        return NULL;
    }
    for (uint32_t at = COPY_HEADER, size; at < capacity; at += size) {
        size = at < COPY_HEADER + rules * RULE_RECORD ? RULE_RECORD : STATS_RECORD;
        clc_record_header h = {.type = CLC_REC_PAD, .size = size};
        memcpy(copy + at, &h, sizeof h);
    }
    *s = (segment){.copy = copy,
                   .capacity = capacity,
                   .first = first,
                   .slots = slots,
                   .kernels_at = kernels_at,
                   .at = -1};
    return s;
}

static slot_entry *map_place(slot_entry *map, uint32_t size, uint32_t id) {
    uint32_t i = (id * 2654435761u) & (size - 1);
    while (map[i].id && map[i].id != id + 1) i = (i + 1) & (size - 1);
    return &map[i];
}

/* Kernel `id`'s slot, given now if it has none (called with g_slots_lock held, not from a fatal
 * signal's handler: it may allocate); 0 when there is no memory for it. */
static int give_slot(uint32_t id) {
    if (!g_segments) return 0;
    if (id == CLC_KERNEL_UNCACHED) return 1; /* its slot is the first segment's */
    if (g_slot_map && map_place(g_slot_map, g_slot_map_size, id)->id) return 1;
    if (2 * (g_slots_given + 1) > g_slot_map_size) {
        uint32_t size = g_slot_map_size ? 2 * g_slot_map_size : 64;
        slot_entry *map = calloc(size, sizeof *map);
        if (!map) return 0;
        for (uint32_t i = 0; i < g_slot_map_size; i++)
            if (g_slot_map[i].id) *map_place(map, size, g_slot_map[i].id - 1) = g_slot_map[i];
        free(g_slot_map);
        g_slot_map = map;
        g_slot_map_size = size;
    }
    while (g_slots_given >= g_slots_made) {
        segment *s =
            new_segment(g_slots_made, g_slots_made < MAX_SLOTS ? g_slots_made : MAX_SLOTS, 0);
        if (!s) return 0;
        segment *last = g_segments;
        while (last->next) last = last->next;
        last->next = s;
        g_slots_made += s->slots;
    }
    *map_place(g_slot_map, g_slot_map_size, id) = (slot_entry){id + 1, g_slots_given++};
    return 1;
}

/* Where kernel `id`'s counts lie (with g_slots_lock held): its segment and offset in a copy. */
static segment *find_slot(uint32_t id, uint32_t *at) {
    if (!g_segments) return NULL;
    if (id == CLC_KERNEL_UNCACHED) {
        *at = g_segments->kernels_at - STATS_RECORD;
        return g_segments;
    }
    slot_entry *e = g_slot_map ? map_place(g_slot_map, g_slot_map_size, id) : NULL;
    if (!e || !e->id) return NULL;
    segment *s = g_segments;
    while (s && e->slot >= s->first + s->slots) s = s->next;
    if (!s) return NULL;
    *at = s->kernels_at + (e->slot - s->first) * STATS_RECORD;
    return s;
}

/* A record into a slot of s's copy; s is changed when the slot held something else. */
static void put(segment *s, uint32_t at, uint16_t type, const void *body, size_t size) {
    char rec[STATS_RECORD];
    clc_record_header h = {.type = type, .size = (uint32_t)(sizeof h + size)};
    memcpy(rec, &h, sizeof h);
    memcpy(rec + sizeof h, body, size);
    if (memcmp(s->copy + at, rec, sizeof h + size) != 0) {
        memcpy(s->copy + at, rec, sizeof h + size);
        s->changed = 1;
    }
}

typedef struct {
    int in_signal; /* from a fatal signal's handler: no waiting for a lock, no allocation */
    uint64_t beyond; /* denied by rules past the first segment's slots */
} gathering;

static void gather_kernel(const clc_kernel_counts *c, void *arg) {
    gathering *g = arg;
    clc_rec_kernel_stats st = {.kernel_id = c->kernel_id, .confined_sms = c->confined_sms};
#define COPY(name) st.name = c->name;
    CLC_KERNEL_COUNTERS(COPY)
#undef COPY
    if (g->in_signal ? pthread_mutex_trylock(&g_slots_lock) != 0
                     : pthread_mutex_lock(&g_slots_lock) != 0)
        return;
    /* A kernel new since the last write has no slot yet when its first sight could not take
     * the lock: given here, or, in a fatal signal's handler, left to its records. */
    uint32_t at;
    segment *s = find_slot(c->kernel_id, &at);
    if (!s && !g->in_signal && give_slot(c->kernel_id)) s = find_slot(c->kernel_id, &at);
    if (s)
        put(s, at, CLC_REC_KERNEL_STATS, &st, sizeof st);
    else if (!g->in_signal && !atomic_exchange(&g_truncated, 1))
        say("clc: no memory for the counts of a kernel of %s: they are missing from the "
            "capture, which cannot vouch for the run\n",
            g_path);
    pthread_mutex_unlock(&g_slots_lock);
}

/* Rules past the slots (a policy larger than clc-run said) are counted together, as the
 * counters past CLC_RULE_COUNTERS are. */
static void gather_rule(int32_t rule, uint64_t denied, void *arg) {
    gathering *g = arg;
    int64_t i = (int64_t)rule + 2;
    if (rule == INT32_MAX || i >= (int64_t)g_rule_slots - 1) {
        g->beyond += denied;
        return;
    }
    clc_rec_rule_stats st = {.rule = rule, .denied = denied};
    put(g_segments, COPY_HEADER + (uint32_t)i * RULE_RECORD, CLC_REC_RULE_STATS, &st, sizeof st);
}

/* The counts into the copies in memory (with g_counts_lock held): of every kernel, or of those
 * that changed since the last time. */
static void gather(int all, int in_signal) {
    if (!g_segments) return;
    gathering g = {.in_signal = in_signal};
    clc_cache_counts(gather_kernel, &g, !all, in_signal ? 200 : 0);
    clc_rule_stats(gather_rule, &g);
    if (g.beyond) {
        clc_rec_rule_stats st = {.rule = INT32_MAX, .denied = g.beyond};
        put(g_segments, COPY_HEADER + (g_rule_slots - 1) * RULE_RECORD, CLC_REC_RULE_STATS, &st,
            sizeof st);
    }
}

static capture_counts current_counts(void) {
    return (capture_counts){.dropped = atomic_load(&g_dropped),
                            .lost = g_lost_bytes,
                            .capped = atomic_load(&g_capped_bytes),
                            .undecided = atomic_load(&g_undecided),
                            .write_errno = g_write_errno,
                            .flags = (clc_cache_table_full() ? CLC_END_TABLE_FULL : 0) |
                                     (atomic_load(&g_truncated) ? CLC_END_TRUNCATED : 0)};
}

/* Appends segment s with both its copies unwritten (generation 0), in room set aside for it
 * under the cap (or any room left there); 0 when it could not be. */
static int append_segment(int fd, segment *s) {
    uint64_t bytes = SEGMENT_HEAD + 2 * (uint64_t)s->capacity;
    if (g_max_bytes) {
        uint64_t room = atomic_load(&g_counts_room), take;
        do take = room < bytes ? room : bytes;
        while (!atomic_compare_exchange_weak(&g_counts_room, &room, room - take));
        if (!claim(bytes, atomic_load(&g_reserve) - take)) {
            atomic_fetch_add(&g_counts_room, take);
            if (!s->refused) {
                s->refused = 1;
                capped(bytes, 1);
            }
            return 0;
        }
        atomic_fetch_sub(&g_reserve, take);
    }
    struct {
        clc_record_header h;
        clc_rec_counts c;
    } head = {{.type = CLC_REC_COUNTS, .size = (uint32_t)bytes}, {.capacity = s->capacity}};
    char blank[COPY_HEADER];
    memset(blank, 0, sizeof blank);
    const char *parts[] = {(const char *)&head, blank, s->copy + COPY_HEADER, blank,
                           s->copy + COPY_HEADER};
    size_t sizes[] = {sizeof head, COPY_HEADER, s->capacity - COPY_HEADER, COPY_HEADER,
                      s->capacity - COPY_HEADER};
    off_t at = append_parts(fd, parts, sizes, 5);
    if (at < 0) return 0;
    s->at = at;
    s->turn = 0;
    s->changed = 1;
    return 1;
}

/* Overwrites s's older copy with `copy` (its header made here: the next generation, and the
 * capture's counts); the two copies take turns only when a write went through whole. */
static void write_copy(int fd, segment *s, const capture_counts *now) {
    clc_counts_copy h = {.generation = ++g_generation,
                         .t_ns = clc_now_ns(),
                         .dropped = now->dropped,
                         .write_lost_bytes = now->lost,
                         .capped_bytes = now->capped,
                         .undecided = now->undecided,
                         .write_errno = now->write_errno,
                         .flags = now->flags,
                         .length = s->capacity - (uint32_t)COPY_HEADER};
    uint32_t crc = crc32_of(0, s->copy + COPY_HEADER, h.length);
    h.checksum = crc32_of(crc, (const char *)&h, sizeof h);
    memcpy(s->copy, &h, sizeof h);
    off_t at = s->at + (off_t)SEGMENT_HEAD + (off_t)s->turn * s->capacity;
    size_t done = 0;
    while (done < s->capacity) {
        ssize_t w = pwrite(fd, s->copy + done, s->capacity - done, at + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            lost(s->capacity, w < 0 ? errno : EIO);
            return;
        }
        done += (size_t)w;
    }
    s->turn ^= 1;
    s->changed = 0;
    if (s == g_segments) g_counts_written = *now;
}

/* Into the file (with g_counts_lock and g_file_lock held, fd the capture): each segment not
 * there yet, then each copy whose counts changed. A segment that is no longer whole in the file
 * (it was cut short by another writer) is written again at its end. */
static void put_out(int fd, int in_signal) {
    if (fd < 0 || !g_segments) return;
    if (in_signal ? pthread_mutex_trylock(&g_slots_lock) != 0
                  : pthread_mutex_lock(&g_slots_lock) != 0)
        return;
    struct stat st;
    off_t size = fstat(fd, &st) == 0 ? st.st_size : -1;
    capture_counts now = current_counts();
    if (memcmp(&now, &g_counts_written, sizeof now) != 0) g_segments->changed = 1;
    for (segment *s = g_segments; s; s = s->next) {
        if (s->at >= 0 && size >= 0 &&
            s->at + (off_t)(SEGMENT_HEAD + 2 * (uint64_t)s->capacity) > size)
            s->at = -1;
        if (s->at < 0 && !append_segment(fd, s)) continue;
        if (s->changed) write_copy(fd, s, &now);
    }
    pthread_mutex_unlock(&g_slots_lock);
}

/* The first segment, written at the file's start (fd, just after its header) so that the
 * counts have their room before any launch record. */
static void start_counts(int fd) {
    pthread_once(&g_crc_once, make_crc_table);
    const char *v = clc_setting("CLC_POLICY_DECIDERS");
    uint64_t deciders = v ? strtoull(v, NULL, 10) : 64;
    if (deciders > CLC_RULE_COUNTERS - 3) deciders = CLC_RULE_COUNTERS - 3;
    g_rule_slots = (uint32_t)deciders + 3;
    pthread_mutex_lock(&g_slots_lock);
    g_segments = new_segment(0, FIRST_SLOTS, g_rule_slots);
    g_slots_made = g_segments ? FIRST_SLOTS : 0;
    if (g_segments) append_segment(fd, g_segments);
    pthread_mutex_unlock(&g_slots_lock);
}

/* The counts that changed, into the file (the flusher, every second). */
static void write_counts(void) {
    pthread_mutex_lock(&g_counts_lock);
    gather(0, 0);
    pthread_mutex_lock(&g_file_lock);
    put_out(g_file_ok ? open_capture_fd() : -1, 0);
    pthread_mutex_unlock(&g_file_lock);
    pthread_mutex_unlock(&g_counts_lock);
}

/* ---- the flusher ------------------------------------------------------------------------------
 */

/* Whether the flusher is the process's last running thread: the main thread left by
 * pthread_exit (it stays a zombie while the process lives) and every other one has ended.
 * glibc ends a process with exit(0) when its last thread ends, but it counts the flusher
 * among them: without this, a program whose last thread returns would never end. */
static int only_flusher_left(void) {
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    /* After the command's closing parenthesis (the command may hold either): the main thread's
     * state, then num_threads, the 17th field after it, which counts the zombie main thread. */
    const char *p = strrchr(buf, ')');
    char state;
    long threads;
    return p &&
           sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %ld",
                  &state, &threads) == 2 &&
           state == 'Z' && threads == 2;
}

/* Ends the process as glibc would have at its last thread's end: exit(0), whose handlers and
 * destructors (the program's, and clc's writing the counts and END) run on this thread, as
 * they would have on the program's last one. */
static __attribute__((noreturn)) void end_as_last_thread(void) {
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    t_in_clc = 0;
    exit(0);
}

static void *flusher(void *arg) {
    (void)arg;
    t_in_clc = 1;
    /* The first round is short: launch times come from the TSC once it is calibrated. */
    struct timespec first = {0, 20 * 1000000L}, ts = {0, FLUSH_MS * 1000000L};
    for (int round = 0; atomic_load(&g_state) == 1; round++) {
        nanosleep(round ? &ts : &first, NULL);
        calibrate();
        pthread_mutex_lock(&g_file_lock);
        flush_locked(NULL);
        pthread_mutex_unlock(&g_file_lock);
        if (round % SNAPSHOT_ROUNDS == SNAPSHOT_ROUNDS - 1) write_counts();
        if (only_flusher_left()) end_as_last_thread();
    }
    return NULL;
}

static void release_buf(void *p) {
    tbuf *b = p;
    atomic_store_explicit(&b->owned, 0, memory_order_release);
}

static void make_key(void) { pthread_key_create(&g_thread_key, release_buf); }

/* A new thread takes a free buffer (its owner exited) before making one, so programs that
 * start many short-lived threads do not grow without bound. */
__attribute__((noinline)) static tbuf *new_thread_buf(void) {
    pthread_once(&g_key_once, make_key);
    tbuf *b;
    for (b = atomic_load(&g_bufs); b; b = b->next) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&b->owned, &expected, 1)) break;
    }
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) return NULL;
        b->data = malloc(BUF_SIZE);
        if (!b->data) {
            free(b);
            return NULL;
        }
        atomic_store(&b->owned, 1);
        tbuf *old = atomic_load(&g_bufs);
        do b->next = old;
        while (!atomic_compare_exchange_weak(&g_bufs, &old, b));
    }
    pthread_setspecific(g_thread_key, b);
    t_buf = b;
    return b;
}

static inline tbuf *thread_buf(void) { return likely(t_buf != NULL) ? t_buf : new_thread_buf(); }

static char *capture_path(char *out, size_t n) {
    if (!g_cfg.output) return NULL;
    int pid = getpid();
    if (g_cfg.root_pid == 0 || g_cfg.root_pid == pid) {
        snprintf(out, n, "%s", g_cfg.output);
        return out;
    }
    /* Another process of the program (a child, or a forked worker): a file of its own. */
    size_t len = strlen(g_cfg.output);
    int stem = len > 4 && strcmp(g_cfg.output + len - 4, ".clc") == 0 ? (int)len - 4 : (int)len;
    snprintf(out, n, "%.*s.child-%d.clc", stem, g_cfg.output, pid);
    return out;
}

static void write_preamble(void);

static void open_capture(void) {
    char path[4200];
    if (!capture_path(path, 4096)) { /* PATH_MAX: room left for a ".N" suffix */
        atomic_store(&g_state, 2);
        return;
    }
    /* Never through a link another user controls, never into something that is not a regular
     * file (a FIFO would block, a device take the records), never over an existing file
     * without --force, and with it, a new file in its place. */
    struct stat st;
    int fd = clc_create_file(path, g_cfg.force, &st);
    if (fd < 0 && errno == EEXIST && !g_cfg.force) {
        /* Same pid, new image (a script that exec'd the program): keep the first file. */
        char alt[4200];
        for (int i = 1; fd < 0 && errno == EEXIST && i < 100; i++) {
            snprintf(alt, sizeof alt, "%.4096s.%d", path, i);
            fd = clc_create_file(alt, 0, &st);
            if (fd >= 0) memcpy(path, alt, sizeof path - 1);
        }
    }
    if (fd < 0) {
        int e = errno;
        atomic_store(&g_state, 2);
        clc_log(CLC_MSG_ERROR, "cannot write the capture %s: %s", path,
                e == EINVAL  ? "not a regular file"
                : e == EPERM ? "a symbolic link on its path belongs to another user, or lies in "
                               "a folder others can write"
                : e == EEXIST && g_cfg.force ? "it exists and is not this user's regular file"
                                             : strerror(e));
        clc_announce(CLC_STATUS_CAPTURE_FAILED, path);
        return;
    }
    memcpy(g_path, path, sizeof path);
    g_file = st;
    g_file_ok = 1;
    const char *cap = clc_setting("CLC_CAPTURE_MAX_BYTES");
    g_max_bytes = cap ? strtoull(cap, NULL, 10) : 0;
    clc_capture_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CLC_CAPTURE_MAGIC, 8);
    h.version = CLC_CAPTURE_VERSION;
    h.header_size = sizeof h;
    h.pid = (uint32_t)getpid();
    h.ppid = (uint32_t)getppid();
    struct timespec rt;
    h.start_monotonic_ns = clc_now_ns();
    clock_gettime(CLOCK_REALTIME, &rt);
    h.start_realtime_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
    atomic_store(&g_reserve, END_RECORD);
    atomic_store(&g_end_room, 1);
    atomic_store(&g_claimed, sizeof h);
    keep(fd);
    append(g_fd, (const char *)&h, sizeof h);
    start_counts(g_fd);
    clc_announce(CLC_STATUS_CAPTURE, path);
    atomic_store(&g_state, 1);
    write_preamble();
    check_tsc();
    calibrate();

    pthread_t th;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the flusher takes no signal of the program */
    if (pthread_create(&th, NULL, flusher, NULL) == 0) pthread_detach(th);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int clc_capture_enabled(void) {
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (likely(s == 1)) return 1;
    if (s == 2) return 0;
    /* A record made inside a record (a signal handler's) never waits for the open: the thread
     * it interrupted may be opening the file. */
    if (t_depth) return 0;
    pthread_mutex_lock(&g_open_lock);
    if (atomic_load(&g_state) == 0) open_capture();
    pthread_mutex_unlock(&g_open_lock);
    return atomic_load(&g_state) == 1;
}

/* Room for n more bytes in b, flushing it here if the flusher has fallen a buffer behind. */
__attribute__((noinline)) static int flush_for_room(tbuf *b, size_t start, size_t n) {
    pthread_mutex_lock(&g_file_lock);
    flush_locked(b);
    pthread_mutex_unlock(&g_file_lock);
    return start + n - atomic_load_explicit(&b->tail, memory_order_acquire) <= BUF_SIZE;
}

static inline int make_room(tbuf *b, size_t start, size_t n) {
    if (likely(start + n - atomic_load_explicit(&b->tail, memory_order_acquire) <= BUF_SIZE))
        return 1;
    return flush_for_room(b, start, n);
}

/* Reserves one whole record of `size` bytes in the thread's buffer (the owner's path: nothing
 * else writes there), a PAD record before it when it would wrap; its body, or NULL (counted). */
static inline __attribute__((always_inline)) char *reserve(tbuf *b, uint16_t type, size_t size,
                                                           int essential, uint64_t also_reserve) {
    size_t start = b->reserved;
    size_t off = start % BUF_SIZE;
    size_t pad = BUF_SIZE - off < size ? BUF_SIZE - off : 0;
    if (unlikely(!make_room(b, start, pad + size))) {
        atomic_fetch_add(&g_dropped, 1);
        return NULL;
    }
    if (!fits(b, pad + size, essential, also_reserve)) return NULL;
    if (unlikely(pad)) {
        clc_record_header p = {.type = CLC_REC_PAD, .size = (uint32_t)pad};
        memcpy(b->data + off, &p, sizeof p);
        off = 0;
    }
    b->reserved = start + pad + size;
    char *rec = b->data + off;
    clc_record_header h = {.type = type, .size = (uint32_t)size};
    memcpy(rec, &h, sizeof h);
    memset(rec + size - 8, 0, 8); /* the padding after the body */
    return rec + sizeof h;
}

/* A signal handler's record while its thread fills one: set aside (its header's `reserved`
 * says whether the capture must keep it), moved into the buffer at the thread's commit. */
#define NESTED_ESSENTIAL 1
__attribute__((noinline, cold)) static void *reserve_nested(tbuf *b, uint16_t type, size_t size,
                                                            int essential) {
    nested_records *x = atomic_load_explicit(&b->nested, memory_order_acquire);
    if (!x) {
        nested_records *made = calloc(1, sizeof *made), *none = NULL;
        if (!made || !atomic_compare_exchange_strong(&b->nested, &none, made)) free(made);
        x = atomic_load(&b->nested);
    }
    uint32_t at = x ? atomic_fetch_add(&x->used, (uint32_t)size) : NESTED_SIZE;
    if (!x || at + size > NESTED_SIZE) {
        if (x) atomic_fetch_sub(&x->used, (uint32_t)size);
        atomic_fetch_add(&g_dropped, 1);
        return NULL;
    }
    char *rec = x->data + at;
    clc_record_header h = {
        .type = type, .reserved = essential ? NESTED_ESSENTIAL : 0, .size = (uint32_t)size};
    memcpy(rec, &h, sizeof h);
    memset(rec + size - 8, 0, 8);
    return rec + sizeof h;
}

/* Moves the records signal handlers set aside into the buffer (the owner, t_depth 1: handlers
 * that come meanwhile still set theirs aside, and the loop takes them too). */
__attribute__((noinline, cold)) static void take_nested(tbuf *b, nested_records *x) {
    uint32_t done = 0, used;
    while ((used = atomic_load_explicit(&x->used, memory_order_acquire)) > done) {
        while (done < used) {
            clc_record_header h;
            memcpy(&h, x->data + done, sizeof h);
            char *body = reserve(b, h.type, h.size, h.reserved & NESTED_ESSENTIAL, 0);
            if (body) memcpy(body, x->data + done + sizeof h, h.size - sizeof h);
            done += h.size;
        }
    }
    /* No handler can be between its reservation and its record's end here: each runs to its
     * end before the thread goes on. */
    atomic_store_explicit(&x->used, 0, memory_order_release);
}

/* Reserves one whole record in the calling thread's buffer and returns its body, to be filled
 * in place and published by clc_capture_commit(); NULL when it cannot be had (counted as
 * dropped, or as capped). A record never wraps around the buffer's end: a PAD record fills the
 * rest. A signal handler may begin and commit records of its own while the thread it
 * interrupted is filling one: those are set aside and published with the thread's. Nothing
 * here is an atomic read-modify-write on the thread's own path. */
static inline __attribute__((always_inline)) void *begin_record(uint16_t type, size_t body_size,
                                                                int essential,
                                                                uint64_t also_reserve) {
    tbuf *b = thread_buf();
    size_t size = (sizeof(clc_record_header) + body_size + 7) & ~(size_t)7;
    if (!essential && unlikely(atomic_load_explicit(&g_over_cap, memory_order_relaxed))) {
        atomic_fetch_add_explicit(&g_capped_bytes, size, memory_order_relaxed);
        return NULL;
    }
    if (unlikely(!b || size > BUF_SIZE / 2)) {
        atomic_fetch_add(&g_dropped, 1);
        return NULL;
    }
    unsigned depth = t_depth;
    t_depth = depth + 1;
    atomic_signal_fence(memory_order_seq_cst);
    void *body = depth ? reserve_nested(b, type, size, essential)
                       : reserve(b, type, size, essential, also_reserve);
    if (!body) clc_capture_commit(); /* nothing reserved: only the depth to give back */
    return body;
}

/* The records a program makes without bound (launches, timings) stop first at the cap. */
static inline int kept(uint16_t type) { return type != CLC_REC_LAUNCH && type != CLC_REC_TIMING; }

void *clc_capture_begin(uint16_t type, size_t body_size) {
    return begin_record(type, body_size, kept(type), 0);
}

/* Publishes the thread's record with the records signal handlers set aside meanwhile (t_depth
 * is 1 while they are taken: handlers that come meanwhile set theirs aside too). */
__attribute__((noinline, cold)) static void commit_nested(tbuf *b) {
    nested_records *x;
    while ((x = atomic_load_explicit(&b->nested, memory_order_relaxed)) != NULL &&
           atomic_load_explicit(&x->used, memory_order_acquire)) {
        t_depth = 1;
        atomic_signal_fence(memory_order_seq_cst);
        take_nested(b, x);
        atomic_store_explicit(&b->head, b->reserved, memory_order_release);
        atomic_signal_fence(memory_order_seq_cst);
        t_depth = 0;
        atomic_signal_fence(memory_order_seq_cst);
    }
}

void clc_capture_commit(void) {
    tbuf *b = t_buf;
    atomic_signal_fence(memory_order_seq_cst);
    if (unlikely(t_depth > 1)) { /* a signal handler's record, set aside */
        t_depth--;
        return;
    }
    atomic_store_explicit(&b->head, b->reserved, memory_order_release);
    atomic_signal_fence(memory_order_seq_cst);
    t_depth = 0;
    atomic_signal_fence(memory_order_seq_cst);
    /* Records a handler set aside while this one was being filled go out right after it. */
    nested_records *x = atomic_load_explicit(&b->nested, memory_order_relaxed);
    if (unlikely(x != NULL) && atomic_load_explicit(&x->used, memory_order_acquire))
        commit_nested(b);
}

static void write_record(uint16_t type, int essential, uint64_t also_reserve, const void *body,
                         size_t body_size, const char *text, size_t text_len) {
    size_t n = body_size + (text ? text_len + 1 : 0);
    char *p = begin_record(type, n, essential, also_reserve);
    if (!p) return;
    if (body_size) memcpy(p, body, body_size);
    if (text) {
        memcpy(p + body_size, text, text_len);
        p[body_size + text_len] = '\0';
    }
    clc_capture_commit();
}

void clc_capture_write(uint16_t type, const void *body, size_t body_size, const char *text,
                       size_t text_len) {
    write_record(type, kept(type), 0, body, body_size, text, text_len);
}

/* Each device's UUID, asked of the driver once per process by the first thread to see the
 * device (no lock: a first sight may run on any thread) and written once per capture, so that
 * a report names the GPU and not only its ordinal, which CUDA_VISIBLE_DEVICES makes 0 in
 * every job. A forked child writes its own file from what the parent asked. */
#define UUID_DEVICES 64
static char g_uuid[UUID_DEVICES][16];
static _Atomic uint64_t g_uuid_asked, g_uuid_known, g_uuid_written;

static void write_device_record(int device) {
    if (device < 0 || device >= UUID_DEVICES) return;
    uint64_t bit = 1ull << device;
    if (!(atomic_fetch_or(&g_uuid_asked, bit) & bit) && g_drv.device_get_uuid &&
        g_drv.device_get_uuid((unsigned char *)g_uuid[device], (CUdevice)device) == CUDA_SUCCESS)
        atomic_fetch_or(&g_uuid_known, bit);
    /* unknown, or another thread is asking: that thread writes it */
    if (!(atomic_load(&g_uuid_known) & bit) || atomic_fetch_or(&g_uuid_written, bit) & bit) return;
    clc_rec_device d = {.device = device};
    memcpy(d.uuid, g_uuid[device], sizeof d.uuid);
    clc_capture_write(CLC_REC_DEVICE, &d, sizeof d, NULL, 0);
}

static int may_be_wrapped(const clc_entry *e) {
    if (e->fallback.action == CLC_ACTION_REPLACE) return 1;
    for (unsigned i = 0; e->clauses && i < e->n_clauses; i++)
        if (e->clauses[i].outcome.action == CLC_ACTION_REPLACE) return 1;
    return 0;
}

/* A kernel's record, with room set aside for its counts (and its wrapper's), and its counts'
 * slot (given later, by the next write of the counts, when another thread holds the slots now).
 */
static void write_kernel_record(const clc_entry *e, const char *name) {
    write_device_record(e->device);
    clc_rec_kernel k = {.kernel_id = e->kernel_id,
                        .device = e->device,
                        .handle = e->handle,
                        .ctx = e->ctx,
                        .t_ns = clc_now_ns()};
    const char *n = name ? name : "<unnamed>";
    write_record(CLC_REC_KERNEL, 1, KERNEL_ROOM + (may_be_wrapped(e) ? WRAP_ROOM : 0), &k, sizeof k,
                 n, strlen(n));
    if (pthread_mutex_trylock(&g_slots_lock) == 0) {
        give_slot(e->kernel_id);
        pthread_mutex_unlock(&g_slots_lock);
    }
}

/* A warning or error of the log (clc_log_set_sink), or any message of the engine. */
void clc_capture_message(int level, const char *text, size_t len) {
    if (clc_capture_enabled()) {
        clc_rec_message body = {.level = (uint32_t)level, .t_ns = clc_now_ns()};
        write_record(CLC_REC_MESSAGE, level > CLC_MSG_INFO, 0, &body, sizeof body, text, len);
    }
}

/* A message from the engine: into the capture, and on stderr from warnings up. */
CLC_EXPORT void clc_shim_message(int level, const char *text) {
    if (level > CLC_MSG_INFO)
        clc_log(level, "%s", text);
    else
        clc_capture_message(level, text, strlen(text));
}

/* The room under the cap of a WRAP_STATS record whose names are k and w bytes long: what its
 * kernel set aside, given back to the cap for it; the length of the kernel's name that fits (the
 * whole name, or less when the cap has no more room than that). */
static size_t wrap_room(size_t k, size_t w) {
    uint64_t room = atomic_load(&g_counts_room), take;
    do take = room < WRAP_ROOM ? room : WRAP_ROOM;
    while (!atomic_compare_exchange_weak(&g_counts_room, &room, room - take));
    atomic_fetch_sub(&g_reserve, take);
    uint64_t used = atomic_load(&g_claimed) + atomic_load(&g_reserve);
    uint64_t left = g_max_bytes > used ? g_max_bytes - used : 0;
    uint64_t size =
        (sizeof(clc_record_header) + sizeof(clc_rec_wrap_stats) + k + w + 2 + 7) & ~7ull;
    if (size <= left) return k;
    uint64_t over = size - left + 7;
    return over + 3 < k ? k - (size_t)over : (k < 3 ? k : 3);
}

CLC_EXPORT void clc_shim_wrap_stats(const clc_rec_wrap_stats *stats, const char *kernel,
                                    const char *wrapper) {
    if (!clc_capture_enabled() || !stats || !kernel || !wrapper) return;
    char text[8192];
    size_t k = strnlen(kernel, sizeof text / 2 - 1), w = strnlen(wrapper, sizeof text / 2 - 1);
    size_t fits = g_max_bytes ? wrap_room(k, w) : k;
    memcpy(text, kernel, fits);
    if (fits < k && fits >= 3) memcpy(text + fits - 3, "...", 3);
    k = fits;
    text[k] = '\0';
    memcpy(text + k + 1, wrapper, w); /* write_record ends it */
    clc_rec_wrap_stats body = *stats;
    body.t_ns = clc_now_ns();
    clc_capture_write(CLC_REC_WRAP_STATS, &body, sizeof body, text, k + 1 + w);
}

void clc_capture_kernel(const clc_entry *e, const char *name) {
    if (clc_capture_enabled()) write_kernel_record(e, name);
}

void clc_capture_gpu_time(clc_entry *e, uint64_t seq, uint64_t gpu_ns, uint32_t source) {
    atomic_fetch_add_explicit(&e->timed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->gpu_ns, gpu_ns, memory_order_relaxed);
    if (clc_capture_enabled()) {
        clc_rec_timing rec = {
            .seq = seq, .kernel_id = e->kernel_id, .source = source, .gpu_ns = gpu_ns};
        clc_capture_write(CLC_REC_TIMING, &rec, sizeof rec, NULL, 0);
    }
}

static void rewrite_known_kernel(clc_entry *e, void *arg) {
    (void)arg;
    write_kernel_record(e, clc_kernel_name(e->handle));
}

/* The process, the policy it ran under, and (in a forked child) the kernels it inherited. */
static void write_preamble(void) {
    char cmd[4096];
    size_t n = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t r = read(fd, cmd, sizeof cmd - 1);
        n = r > 0 ? (size_t)r : 0;
        close(fd);
    }
    while (n && cmd[n - 1] == '\0') n--;
    for (size_t i = 0; i < n; i++)
        if (cmd[i] == '\0') cmd[i] = ' ';
    cmd[n] = '\0';
    clc_rec_process p = {.pid = (uint32_t)getpid(), .ppid = (uint32_t)getppid()};
    clc_capture_write(CLC_REC_PROCESS, &p, sizeof p, cmd, n);
    const char *policy = clc_setting("CLC_POLICY");
    if (policy) clc_capture_write(CLC_REC_POLICY, NULL, 0, policy, strlen(policy));
    const char *run = clc_setting("CLC_RUN");
    if (run) clc_capture_write(CLC_REC_RUN, NULL, 0, run, strlen(run));
    clc_cache_each(rewrite_known_kernel, NULL);
}

/* ---- the end ----------------------------------------------------------------------------------
 * The counts, then an END record, written to the file directly, not through a thread's buffer.
 * A fatal signal's handler writes them too: no allocation, and locks waited for a bounded time
 * (the counts stay as last written when their lock cannot be had).
 */

void clc_capture_undecided(void) {
    atomic_fetch_add_explicit(&g_undecided, 1, memory_order_relaxed);
}

/* Room under the cap for an END record: the first one's was set aside at the start; a later one
 * (launches after the first) may find none left, and leave the capture incomplete rather than
 * over its cap. */
static int end_room(void) {
    if (!g_max_bytes) return 1;
    if (atomic_exchange(&g_end_room, 0)) {
        if (claim(END_RECORD, atomic_load(&g_reserve) - END_RECORD)) {
            atomic_fetch_sub(&g_reserve, END_RECORD);
            return 1;
        }
        atomic_store(&g_end_room, 1);
        return 0;
    }
    return claim(END_RECORD, atomic_load(&g_reserve));
}

void clc_capture_finish(uint32_t how, int32_t status, int in_signal) {
    if (atomic_load(&g_state) != 1 || g_cfg.pid != getpid()) return;
    int wait_ms = in_signal ? 200 : 0;
    int counting = clc_lock_within(&g_counts_lock, wait_ms);
    if (counting) gather(1, in_signal);
    int locked = clc_lock_within(&g_file_lock, wait_ms);
    if (locked) flush_locked(NULL);
    int fd = g_file_ok ? open_capture_fd() : -1;
    if (counting) put_out(fd, in_signal);
    struct {
        clc_record_header h;
        clc_rec_end end;
    } rec = {{.type = CLC_REC_END, .size = END_RECORD},
             {.t_ns = clc_now_ns(),
              .dropped = atomic_load(&g_dropped),
              .write_lost_bytes = g_lost_bytes,
              .capped_bytes = atomic_load(&g_capped_bytes),
              .write_errno = g_write_errno,
              .how = how,
              .status = status,
              .flags = (clc_cache_table_full() ? CLC_END_TABLE_FULL : 0) |
                       (atomic_load(&g_truncated) ? CLC_END_TRUNCATED : 0),
              .undecided = atomic_load(&g_undecided)}};
    if (!end_room())
        atomic_fetch_add(&g_capped_bytes, END_RECORD);
    else if (fd >= 0)
        append(fd, (const char *)&rec, sizeof rec);
    if (locked) pthread_mutex_unlock(&g_file_lock);
    if (counting) pthread_mutex_unlock(&g_counts_lock);
}

/* The parent's file and buffers are not the child's: it opens its own capture on first use. */
void clc_capture_after_fork_child(void) {
    if (is_capture(g_fd)) close(g_fd);
    g_fd = -1;
    pthread_mutex_init(&g_file_lock, NULL);
    pthread_mutex_init(&g_open_lock, NULL);
    g_file_ok = 0;
    g_written = g_lost_bytes = 0;
    atomic_store(&g_claimed, 0);
    atomic_store(&g_reserve, 0);
    atomic_store(&g_over_cap, 0);
    atomic_store(&g_truncated, 0);
    atomic_store(&g_capped_bytes, 0);
    g_write_errno = 0;
    atomic_store(&g_bufs, NULL);
    t_buf = NULL;
    t_tid = 0;
    atomic_store(&g_dropped, 0);
    atomic_store(&g_undecided, 0);
    /* The parent's counts and slots are not the child's (its copies, referenced no more, are
     * left as they are: another thread of the parent may have been changing them): the child
     * makes its own when it opens its capture. */
    pthread_mutex_init(&g_counts_lock, NULL);
    pthread_mutex_init(&g_slots_lock, NULL);
    g_segments = NULL;
    g_slot_map = NULL;
    g_slot_map_size = g_slots_given = g_slots_made = 0;
    g_generation = 0;
    memset(&g_counts_written, 0, sizeof g_counts_written);
    atomic_store(&g_counts_room, 0);
    atomic_store(&g_end_room, 0);
    atomic_store(&g_state, 0);
    atomic_store(&g_cal, NULL); /* the flusher that calibrated it is the parent's */
    atomic_store(&g_uuid_written, 0);
    g_cal_first_tsc = 0;
}
