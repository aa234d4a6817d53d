/* SPDX-License-Identifier: Apache-2.0
 *
 * capture.c: writes the capture file (layout in clc_abi.h).
 *
 * Each launching thread appends whole records to its own ring buffer and publishes them by
 * advancing `head` (release). A flusher thread writes what is published to the file every
 * FLUSH_MS, so what was flushed survives a crash of the program. A thread whose buffer is full
 * flushes it itself, under the file lock: that is the only lock a recording launch can meet,
 * and only when the flusher has fallen a whole buffer behind.
 *
 * The file itself is capture_file.c's, the size cap capture_cap.c's, the counts counts.c's, the
 * records' time clock.c's.
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

#include "records.h"
#include "capture_internal.h"

#define FLUSH_MS 100
/* The counts that changed are written every this many flushes: a process killed by SIGKILL loses
 * at most this long of its counts, and the records of its last flush interval. */
#define SNAPSHOT_ROUNDS 10
/* The most of the size cap a thread claims at once for its launch and timing records. */

static _Atomic int g_state; /* 0: not opened, 1: open, 2: failed or off */
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
static CLC_TLS tbuf *t_buf;
/* Records begun and not yet committed on this thread: more than one only when a signal handler
 * interrupted the thread's own record (its records then go aside, see nested_records). */
static CLC_TLS unsigned t_depth;
static CLC_TLS uint32_t t_tid;
static pthread_key_t g_thread_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

uint32_t clc_tid(void) {
    if (unlikely(!t_tid)) t_tid = (uint32_t)gettid();
    return t_tid;
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
