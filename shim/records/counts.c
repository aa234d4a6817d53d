/* SPDX-License-Identifier: Apache-2.0
 *
 * counts.c: the counts in the capture (COUNTS records), overwritten in place (see below).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "records.h"
#include "capture_internal.h"

_Atomic uint64_t g_dropped;
_Atomic uint64_t g_undecided;

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

pthread_mutex_t g_counts_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_slots_lock = PTHREAD_MUTEX_INITIALIZER;
segment *g_segments;    /* the first segment, then the later ones in order */
slot_entry *g_slot_map; /* kernel id -> slot: open addressing, at most half full */
uint32_t g_slot_map_size, g_slots_given, g_slots_made;
static uint32_t g_rule_slots; /* RULE_STATS slots of the first segment */
uint64_t g_generation;
capture_counts g_counts_written; /* the capture's counts in the first segment's copy */
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
int give_slot(uint32_t id) {
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
void gather(int all, int in_signal) {
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
void put_out(int fd, int in_signal) {
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
void start_counts(int fd) {
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
void write_counts(void) {
    pthread_mutex_lock(&g_counts_lock);
    gather(0, 0);
    pthread_mutex_lock(&g_file_lock);
    put_out(g_file_ok ? open_capture_fd() : -1, 0);
    pthread_mutex_unlock(&g_file_lock);
    pthread_mutex_unlock(&g_counts_lock);
}
