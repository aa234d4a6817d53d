/* SPDX-License-Identifier: Apache-2.0
 *
 * capture_internal.h: what the files of the capture share, inside the records layer only:
 * capture.c (the threads' buffers, the flusher, the records, the end), counts.c (the
 * COUNTS records), capture_cap.c (the size cap), capture_file.c (the file), clock.c (the
 * records' time); each calls only those after it in this list.
 */
#ifndef CLC_CAPTURE_INTERNAL_H
#define CLC_CAPTURE_INTERNAL_H

#include <pthread.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "records.h"

/* ---- the threads' buffers (capture.c) and the records' sizes ---- */
#define BUF_SIZE (256u * 1024u)
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

/* ---- the counts (counts.c) ---- */
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

/* ---- the records' time (clock.c) ---- */
typedef struct {
    uint64_t tsc0, ns0; /* one moment on both clocks */
    uint64_t mult;      /* ns per TSC tick, times 2^32 */
} tsc_calibration;

/* counts.c: the counts, written by the flusher and at the end, reset in a forked child */
extern CLC_HIDDEN pthread_mutex_t g_counts_lock;
extern CLC_HIDDEN capture_counts g_counts_written;
extern CLC_HIDDEN _Atomic uint64_t g_dropped;
extern CLC_HIDDEN uint64_t g_generation;
extern CLC_HIDDEN segment *g_segments;
extern CLC_HIDDEN slot_entry *g_slot_map;
extern CLC_HIDDEN uint32_t g_slot_map_size, g_slots_given, g_slots_made;
extern CLC_HIDDEN pthread_mutex_t g_slots_lock;
extern CLC_HIDDEN _Atomic uint64_t g_undecided;
void gather(int all, int in_signal);
int give_slot(uint32_t id);
void put_out(int fd, int in_signal);
void start_counts(int fd);
void write_counts(void);

/* capture_cap.c: the size cap, which every record and the counts are claimed against */
void capped(uint64_t n, int essential);
int claim(uint64_t n, uint64_t keep);
int fits_slow(tbuf *b, uint64_t n, int essential, uint64_t also_reserve);
extern CLC_HIDDEN _Atomic uint64_t g_capped_bytes;
extern CLC_HIDDEN _Atomic uint64_t g_claimed, g_reserve;
extern CLC_HIDDEN _Atomic uint64_t g_counts_room;
extern CLC_HIDDEN _Atomic int g_end_room;
extern CLC_HIDDEN uint64_t g_max_bytes;
extern CLC_HIDDEN _Atomic int g_over_cap;
extern CLC_HIDDEN _Atomic int g_truncated;

/* capture_file.c: the file, its kept descriptor, and the writes to it */
void append(int fd, const char *p, size_t n);
off_t append_parts(int fd, const char *const *p, const size_t *n, int parts);
void flush_locked(tbuf *b);
extern CLC_HIDDEN tbuf *_Atomic g_bufs;
extern CLC_HIDDEN int g_fd;
extern CLC_HIDDEN struct stat g_file;
extern CLC_HIDDEN pthread_mutex_t g_file_lock;
extern CLC_HIDDEN int g_file_ok;
extern CLC_HIDDEN uint64_t g_written, g_lost_bytes;
extern CLC_HIDDEN char g_path[4200];
extern CLC_HIDDEN int g_write_errno;
int is_capture(int fd);
void keep(int fd);
void lost(size_t n, int e);
int open_capture_fd(void);
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* clock.c: the TSC calibration, refreshed by the flusher */
void calibrate(void);
void check_tsc(void);
extern CLC_HIDDEN tsc_calibration *_Atomic g_cal;
extern CLC_HIDDEN uint64_t g_cal_first_tsc, g_cal_first_ns;

#endif /* CLC_CAPTURE_INTERNAL_H */
