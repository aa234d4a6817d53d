/* SPDX-License-Identifier: Apache-2.0
 *
 * decider.c: asks clc-run about the first sight of a kernel, for policies without Python hooks.
 *
 * The question leaves the program: no interpreter of the program's is entered (whatever its
 * Python version, or none), no GIL is waited for, and a forked child asks like its parent,
 * over a connection of its own (clc-run reads the asker's identity from the kernel, so a
 * connection is never shared between processes). One connection per process, one question at
 * a time.
 *
 * What the shim trusts of it:
 * - the answering process must be clc-run itself: its pid and user, from SO_PEERCRED, are the
 *   ones clc-run put in the sealed settings (whoever makes a socket at the same path once
 *   clc-run is gone is not asked);
 * - the connection is moved to a high descriptor (a program with 0, 1 or 2 closed would
 *   otherwise get it there, and write into it), checked to be the socket this process
 *   connected before each use, and each answer must carry its question's number;
 * - an answer can only allow or deny (record, time): a wrap is the program's engine's to make.
 * Whatever fails, the caller asks the program's own engine instead (decision_cache.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "deciding.h"

/* Longer than any first sight should take in clc-run; past it the question has failed. */
#define TIMEOUT_MS 30000
/* Where the connection is moved: out of the way of descriptors programs number themselves. */
#define HIGH_FD 512

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_fd = -1;
static pid_t g_pid;   /* the process that connected g_fd */
static dev_t g_dev;   /* and the socket's identity, to tell it from a descriptor the program */
static ino_t g_ino;   /* put at the same number */
static uint32_t g_seq;

int clc_decider_configured(void) {
    const char *path = clc_setting("CLC_DECIDER");
    return path && *path;
}

static int is_ours_fd(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == g_dev &&
           st.st_ino == g_ino;
}

static int is_ours(void) { return g_pid == getpid() && is_ours_fd(g_fd); }

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for `events` on fd until the deadline (a signal does not restart the wait whole). */
static int wait_for(int fd, short events, long long deadline) {
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)left);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* The setting as a number; -1 when missing or not a number. */
static long setting_number(const char *key) {
    const char *v = clc_setting(key);
    char *end;
    if (!v || !*v) return -1;
    long n = strtol(v, &end, 10);
    return *end ? -1 : n;
}

static int connect_decider(void) {
    const char *path = clc_setting("CLC_DECIDER");
    long want_pid = setting_number("CLC_DECIDER_PID"), want_uid = setting_number("CLC_DECIDER_UID");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path || want_pid <= 0 || want_uid < 0) {
        errno = EINVAL;
        return -1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct ucred cred;
    socklen_t len = sizeof cred;
    struct stat st;
    int err = 0, high = -1;
    socklen_t elen = sizeof err;
    /* Not blocking: a backlog that is full must not hang the program's launch. */
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) goto fail;
        if (wait_for(fd, POLLOUT, now_ms() + TIMEOUT_MS) != 0) goto fail;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) goto fail;
        if (err) {
            errno = err;
            goto fail;
        }
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) goto fail;
    if (cred.pid != (pid_t)want_pid || cred.uid != (uid_t)want_uid) {
        errno = EPERM;
        goto fail;
    }
    high = fcntl(fd, F_DUPFD_CLOEXEC, HIGH_FD);
    if (high < 0) high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (high < 0 || fstat(high, &st) != 0) goto fail;
    close(fd);
    g_fd = high;
    g_pid = getpid();
    g_dev = st.st_dev;
    g_ino = st.st_ino;
    return 0;
fail:
    err = errno;
    if (high >= 0) close(high);
    close(fd);
    errno = err;
    return -1;
}

static void drop(void) {
    if (is_ours()) close(g_fd);
    g_fd = -1;
}

/* An answer the shim takes: allow or deny (with record, time), cached, nothing to launch
 * instead; or confine, whose word is a share and flags, never an address. */
static int acceptable_outcome(const clc_outcome *o) {
    if (o->flags & ~(uint32_t)(CLC_FLAG_RECORD | CLC_FLAG_TIME)) return 0;
    if (o->action == CLC_ACTION_CONFINE) {
        uint64_t kind = (o->replacement >> CLC_CONFINE_KIND_SHIFT) & 0xff;
        uint64_t rest =
            o->replacement & ~(uint64_t)(0xffffffffull | 0xffull << CLC_CONFINE_KIND_SHIFT |
                                         CLC_CONFINE_LAST | CLC_CONFINE_DENY);
        return (kind == CLC_CAP_SHARE || kind == CLC_CAP_SMS) && rest == 0 &&
               (o->replacement & 0xffffffffull) != 0;
    }
    return (o->action == CLC_ACTION_ALLOW || o->action == CLC_ACTION_DENY) && o->replacement == 0;
}

static int acceptable(const clc_decision *d) {
    if (d->mode != CLC_MODE_CACHED || d->n_clauses > CLC_MAX_CLAUSES) return 0;
    for (uint32_t i = 0; i < d->n_clauses; i++)
        if (!acceptable_outcome(&d->clauses[i].outcome)) return 0;
    return acceptable_outcome(&d->fallback);
}

/* One question and its answer; -1 with errno on failure. */
static int ask(const clc_kernel_query *q, size_t name_size, clc_decide_reply *head, clc_decision *d,
               char *text, size_t text_cap) {
    long long deadline = now_ms() + TIMEOUT_MS;
    uint32_t seq = ++g_seq;
    clc_decide_request req = {.magic = CLC_DECIDE_MAGIC,
                              .device = q->device,
                              .name_size = (uint32_t)name_size,
                              .seq = seq,
                              .question = q->question};
    struct iovec out[2] = {{&req, sizeof req}, {(void *)q->name, name_size}};
    struct msghdr m = {.msg_iov = out, .msg_iovlen = 2};
    ssize_t n;
    for (;;) {
        n = sendmsg(g_fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0 || (errno != EINTR && errno != EAGAIN)) break;
        if (errno == EAGAIN && wait_for(g_fd, POLLOUT, deadline) != 0) return -1;
    }
    if (n != (ssize_t)(sizeof req + name_size)) {
        if (n >= 0) errno = EPROTO;
        return -1;
    }
    struct iovec in[3] = {{head, sizeof *head}, {d, sizeof *d}, {text, text_cap}};
    struct msghdr mi = {.msg_iov = in, .msg_iovlen = 3};
    for (;;) {
        n = recvmsg(g_fd, &mi, MSG_DONTWAIT);
        if (n >= 0 || (errno != EINTR && errno != EAGAIN)) break;
        if (errno == EAGAIN && wait_for(g_fd, POLLIN, deadline) != 0) return -1;
    }
    if (n < (ssize_t)(sizeof *head + sizeof *d) || (mi.msg_flags & MSG_TRUNC) ||
        head->magic != CLC_DECIDE_MAGIC || head->seq != seq ||
        (size_t)n != sizeof *head + sizeof *d + head->text_size) {
        if (n >= 0) errno = EPROTO;
        return -1;
    }
    return 0;
}

int clc_decider_decide(const clc_kernel_query *q, clc_decision *out, int *substitute) {
    *substitute = 0;
    size_t name_size = strlen(q->name);
    if (name_size > CLC_DECIDE_MAX_NAME) return CLC_DECIDE_ENGINE;
    clc_decide_reply head;
    char text[CLC_DECIDE_MAX_TEXT];
    int failed = 0, err = 0;
    pthread_mutex_lock(&g_lock);
    if (!is_ours()) {
        g_fd = -1; /* not this process's, or not the socket any more: never closed here */
        if (connect_decider() != 0) failed = 1;
    }
    if (!failed && ask(q, name_size, &head, out, text, sizeof text) != 0) {
        failed = 1;
        err = errno;
        drop(); /* a half-read answer must not be taken for the next question's */
    }
    if (failed && !err) err = errno;
    pthread_mutex_unlock(&g_lock);
    if (failed) {
        CLC_WARN_ONCE("cannot ask clc-run about kernel launches (%s): the "
                      "program's own engine decides them",
                      strerror(err));
        return CLC_DECIDE_FAILED;
    }
    if (head.status == CLC_DECIDE_ENGINE) *substitute = acceptable(out);
    if (head.status == CLC_DECIDE_OK && !acceptable(out)) {
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_ERROR, "clc-run answered a decision the shim does not take: the "
                                   "program's own engine decides such kernels");
        return CLC_DECIDE_FAILED;
    }
    /* The announcements are the program's stderr's, unless the program made fd 2 this
     * connection. */
    if (head.text_size && !is_ours_fd(2)) (void)!write(2, text, head.text_size);
    return head.status <= CLC_DECIDE_FAILED ? (int)head.status : CLC_DECIDE_FAILED;
}

/* The process's credentials, as a fingerprint: its three user ids, three group ids and its
 * supplementary groups. */
static uint64_t credentials(void) {
    uid_t r, e, s;
    gid_t rg, eg, sg, groups[256];
    uint64_t h = 0xcbf29ce484222325ull;
    int n = getgroups(256, groups);
    if (getresuid(&r, &e, &s) != 0 || getresgid(&rg, &eg, &sg) != 0) return 0;
    uint64_t ids[6] = {r, e, s, rg, eg, sg};
    for (int i = 0; i < 6; i++) h = (h ^ ids[i]) * 0x100000001b3ull;
    for (int i = 0; i < n; i++) h = (h ^ groups[i]) * 0x100000001b3ull;
    return h ^ (uint64_t)(n < 0 ? 0xffff : n);
}

static _Atomic uint64_t g_credentials;

int clc_identity_changed(void) {
    uint64_t now = credentials(), was = atomic_exchange(&g_credentials, now);
    if (!was || was == now) return 0;
    pthread_mutex_lock(&g_lock);
    drop();
    pthread_mutex_unlock(&g_lock);
    return 1;
}

/* Another thread may have held the lock at the fork; the connection is the parent's. */
void clc_decider_after_fork_child(void) {
    pthread_mutex_init(&g_lock, NULL);
    if (is_ours_fd(g_fd)) close(g_fd);
    g_fd = -1;
}
