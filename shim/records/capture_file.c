/* SPDX-License-Identifier: Apache-2.0
 *
 * capture_file.c: the capture file itself: kept open at a high descriptor and checked before
 * each use, whole records appended at its end (or counted lost), the threads' buffers flushed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "records.h"
#include "capture_internal.h"

tbuf *_Atomic g_bufs; /* every buffer ever made, newest first; never freed */
pthread_mutex_t g_file_lock = PTHREAD_MUTEX_INITIALIZER;
/* The capture file, by path and identity. clc keeps a descriptor of it, at a high number, and
 * checks before each flush that it is still that file (device and inode); when the program has
 * closed it or put another file at its number, the file is opened again by its path (no link
 * another user controls followed) and checked, so that a program that closes or reuses
 * descriptors can neither lose the capture nor receive it. The kept descriptor outlives a change
 * of user that would forbid opening the file again. */
#define HIGH_FD 512
char g_path[4200];
struct stat g_file;
int g_fd = -1;
int g_file_ok; /* 0 once the file is gone or replaced: said once, nothing more written */
uint64_t g_written, g_lost_bytes;
int g_write_errno;

/* A line on stderr, at once: about the capture itself, so never into it. */
void say(const char *fmt, ...) {
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

int is_capture(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == g_file.st_dev &&
           st.st_ino == g_file.st_ino;
}

/* Keeps fd at a high number, out of the way of descriptors programs number themselves. */
void keep(int fd) {
    int high = fcntl(fd, F_DUPFD_CLOEXEC, HIGH_FD);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    g_fd = fd;
}

/* The capture, for writing (called with g_file_lock held, or from a fatal signal's handler);
 * -1 (said once) when it is no longer clc's file. Never closed by the caller. */
int open_capture_fd(void) {
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
void lost(size_t n, int e) {
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
off_t append_parts(int fd, const char *const *p, const size_t *n, int parts) {
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

void append(int fd, const char *p, size_t n) { (void)append_parts(fd, &p, &n, 1); }

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
void flush_locked(tbuf *b) {
    int any = b ? pending(b) : 0;
    for (tbuf *x = b ? NULL : atomic_load(&g_bufs); x && !any; x = x->next) any = pending(x);
    if (!any) return;
    int fd = g_file_ok ? open_capture_fd() : -1;
    if (b)
        flush_buf(b, fd);
    else
        for (tbuf *x = atomic_load(&g_bufs); x; x = x->next) flush_buf(x, fd);
}
