/* SPDX-License-Identifier: Apache-2.0
 *
 * priority_internal.h: what the files of the priority classes share, inside the priority
 * layer only: priority.c (the process's start and end), best_effort.c, run_ahead.c,
 * latency_critical.c, board.c; each calls only those after it in this list.
 */
#ifndef CLC_PRIORITY_INTERNAL_H
#define CLC_PRIORITY_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "priority.h"

#define BOARD_MAGIC 0x3144524f42434c43ull /* "CLCBORD1" */
#define BOARD_VERSION 1
#define BOARD_DEVICES 16
#define MAX_SLOTS 64
#define MAX_ENTRIES 1024           /* directory entries one scan reads, all directories */
#define SCAN_NS 50000000ull        /* the directories are read again after 50 ms */
#define HOLD_STEP_NS 20000ull      /* a held launch looks again every 20 us */
#define WINDOW_NS 100000000ull     /* the floor: at most (1 - floor) x 100 ms held in any 100 ms */
#define FLOOR_BUCKET_NS 1000000ull /* held time is counted per millisecond */
#define FLOOR_BUCKETS (WINDOW_NS / FLOOR_BUCKET_NS + 1) /* a window, and the bucket it begins in */
#define RUN_AHEAD_STEP 4           /* an event every 4 launches */
#define RUN_AHEAD_STREAMS 32       /* streams kept from running ahead */
#define RUN_AHEAD_WAIT_NS 200000000ull /* a run-ahead wait gives up after 200 ms */
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

typedef struct {
    unsigned char uuid[16];
    _Atomic uint32_t used;    /* 1 once uuid is written */
    _Atomic uint32_t waiting; /* threads of the process inside a synchronization */
    _Atomic uint64_t launched;
    _Atomic uint64_t settled;
    _Atomic uint64_t busy_since_ns; /* CLOCK_MONOTONIC when the GPU last went busy */
    /* The class's slo (latency_critical.c "slo"); all 0 without one. A busy period runs from
     * the launch that finds the GPU idle to the settling that makes it idle again. */
    _Atomic uint32_t slo_milli;      /* the slo x 1000 */
    _Atomic uint32_t quiet_p99_us;   /* p99 of the busy periods of the probes; 0: not known */
    _Atomic uint32_t recent_p99_us;  /* p99 of the latest busy periods outside probes; 0: none */
    _Atomic uint32_t probe_until_ms; /* best-effort work is held whole until then (the low 32
                                        bits of CLOCK_MONOTONIC in ms) */
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

/* best_effort.c */
/* The time the process was held, by FLOOR_BUCKET_NS (best_effort.c says how). */
typedef struct {
    uint64_t held_ns[FLOOR_BUCKETS];
    uint64_t sum;        /* of held_ns: what the floor weighs */
    uint64_t latest;     /* the newest bucket in the ring, as now / FLOOR_BUCKET_NS */
    uint64_t counted_to; /* held time is counted up to here */
} held_window;
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
void close_kept(int fd, dev_t dev, ino_t ino);
/* A period of held_share's or reserve's, one HOLD record (best_effort.c) */
typedef struct {
    uint64_t start, since; /* start 0: none open */
    int device;
    uint32_t why;
    int counted; /* in the exit line's holds */
} hold_period;
extern CLC_HIDDEN hold_period g_shared_period[BOARD_DEVICES + 1],
    g_reserve_period[BOARD_DEVICES + 1];
/* A latency-critical class's slo, per device: how many levels below its class's bounds a
 * best-effort process's launches keep (best_effort.c "slo"), when that was last judged */
typedef struct {
    int down;
    uint64_t judged_ns;
} slo_level;
extern CLC_HIDDEN slo_level g_slo_level[BOARD_DEVICES + 1];
extern CLC_HIDDEN hold_period g_slo_period[BOARD_DEVICES + 1];
void period_close(hold_period *p, uint64_t now);
void periods_close(uint64_t now); /* every device's */
extern CLC_HIDDEN pthread_mutex_t g_be_lock;
extern CLC_HIDDEN uint64_t g_holds, g_held_ns, g_held_max_ns, g_floor_releases, g_run_ahead_waits;
extern CLC_HIDDEN int g_holding;
extern CLC_HIDDEN held_window g_window;
extern CLC_HIDDEN ahead_ring g_rings[RUN_AHEAD_STREAMS];

/* run_ahead.c */
/* Keeps the launch's stream at most the class's run_ahead launches ahead of the GPU (halved per
 * slo level `down`, RUN_AHEAD_STEP at level 3); called while slots of latency-critical
 * processes are read. */
void bound_run_ahead(CUcontext ctx, CUstream stream, int per_thread, int down);
void read_trust(void);

/* latency_critical.c */
#define LC_STREAMS 16
typedef struct {
    CUstream _Atomic key; /* stream_key's; NULL: a free place */
    _Atomic uint64_t last, done;
    /* `last` as a settling last saw it, and when it first saw that value: a stream with no
     * launch for idle_after_ms while others were waited for counts as done */
    _Atomic uint64_t seen_last, seen_ns;
} lc_stream;
typedef struct {
    lc_stream place[LC_STREAMS];
    /* a launch found no place (when, by CLC_MONOTONIC ns): only a device synchronization, or
     * idle_after_ms without another such launch, settles */
    _Atomic int untracked;
    _Atomic uint64_t untracked_ns;
} lc_streams;
extern CLC_HIDDEN lc_streams g_streams[BOARD_DEVICES];
void lc_events_after_fork(void);
extern CLC_HIDDEN uint32_t g_slo_milli; /* CLC_PRIORITY_SLO x 1000; 0: none */
/* The busy-period rings of the slo (latency_critical.c), per device */
#define SLO_RING 128
typedef struct {
    uint32_t quiet[SLO_RING], recent[SLO_RING]; /* busy periods, us */
    uint64_t recent_end[SLO_RING];              /* when each recent one ended */
    uint32_t n_quiet, n_recent; /* samples taken so far */
    uint64_t probe_start, probe_end, next_probe;
    _Atomic uint64_t period_of; /* busy_since_ns of the last period taken */
} slo_rings;
extern CLC_HIDDEN slo_rings g_slo[BOARD_DEVICES];
void lc_slo_said(void); /* at exit: the p99s the slot gave last, into the capture */
extern CLC_HIDDEN board_slot *_Atomic g_slot;
extern CLC_HIDDEN int g_slot_dir;
extern CLC_HIDDEN dev_t g_slot_dir_dev;
extern CLC_HIDDEN ino_t g_slot_dir_ino;
extern CLC_HIDDEN pthread_mutex_t g_slot_lock;
extern CLC_HIDDEN char g_slot_name[64];
extern CLC_HIDDEN pid_t g_slot_pid;
static inline board_slot *slot_now(void) {
    return atomic_load_explicit(&g_slot, memory_order_acquire);
}

/* board.c */
int board_fd(void);
void board_unusable(const char *why);
int device_uuid(int device, unsigned char out[16]);
extern CLC_HIDDEN int g_board;
extern CLC_HIDDEN int g_board_bad;
extern CLC_HIDDEN char g_board_path[256];
extern CLC_HIDDEN int g_class;
extern CLC_HIDDEN double g_floor;
extern CLC_HIDDEN uint64_t g_held_word, g_reserve_word;
/* held_share's word at each slo level: [0] none (wait), [1] a quarter of the share, [2] half,
 * [3] the class's (g_held_word) */
extern CLC_HIDDEN uint64_t g_held_words[4];
extern CLC_HIDDEN uint64_t g_idle_ns;
extern CLC_HIDDEN unsigned g_run_ahead;
int slot_alive(int32_t pid, uint64_t start_time);
uint64_t start_time_of(pid_t pid);
int user_dir(uid_t uid, int create);

/* A stream as the board tells streams apart: the per-thread default stream is the thread's
 * own, the legacy one the process's. Inline, as it is on every launch of a class. */
extern CLC_HIDDEN CLC_TLS char t_stream_key;
static inline CUstream stream_key(CUstream stream, int ptsz) {
    if (stream == NULL) return ptsz ? (CUstream)&t_stream_key : CU_STREAM_LEGACY;
    if (stream == CU_STREAM_PER_THREAD) return (CUstream)&t_stream_key;
    return stream;
}

#endif /* CLC_PRIORITY_INTERNAL_H */
