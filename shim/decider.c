/* SPDX-License-Identifier: Apache-2.0
 *
 * decider.c: asks clc-run about the first sight of a kernel, for policies without Python hooks.
 *
 * The question leaves the program: no interpreter of the program's is entered (whatever its
 * Python version, or none), no GIL is waited for, and a forked child asks like its parent,
 * over a connection of its own (clc-run reads the asker's identity from the kernel, so a
 * connection is never shared between processes). One connection per process, one question at
 * a time; the descriptor is checked to be the socket this process connected before each use,
 * since the program may close or reuse descriptors.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim.h"

/* Longer than any first sight should take in clc-run; past it the launch gets on_error. */
#define REPLY_TIMEOUT_MS 30000

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_fd = -1;
static pid_t g_pid;   /* the process that connected g_fd */
static dev_t g_dev;   /* and the socket's identity, to tell it from a descriptor the program */
static ino_t g_ino;   /* put at the same number */

int clc_decider_configured(void) {
    const char *path = clc_setting("CLC_DECIDER");
    return path && *path;
}

static int is_ours(void) {
    struct stat st;
    return g_fd >= 0 && g_pid == getpid() && fstat(g_fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
           st.st_dev == g_dev && st.st_ino == g_ino;
}

static int connect_decider(void) {
    const char *path = clc_setting("CLC_DECIDER");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct stat st;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    g_fd = fd;
    g_pid = getpid();
    g_dev = st.st_dev;
    g_ino = st.st_ino;
    return 0;
}

static void drop(void) {
    if (is_ours()) close(g_fd);
    g_fd = -1;
}

/* One question and its answer; -1 with errno on failure. */
static int ask(const char *name, size_t name_size, int device, clc_decide_reply *head,
               clc_decision *d, char *text, size_t text_cap) {
    clc_decide_request req = {.magic = CLC_DECIDE_MAGIC, .device = device,
                              .name_size = (uint32_t)name_size};
    struct iovec out[2] = {{&req, sizeof req}, {(void *)name, name_size}};
    struct msghdr m = {.msg_iov = out, .msg_iovlen = 2};
    ssize_t n;
    do n = sendmsg(g_fd, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)(sizeof req + name_size)) return -1;
    struct pollfd p = {.fd = g_fd, .events = POLLIN};
    int r;
    do r = poll(&p, 1, REPLY_TIMEOUT_MS);
    while (r < 0 && errno == EINTR);
    if (r == 0) errno = ETIMEDOUT;
    if (r <= 0) return -1;
    struct iovec in[3] = {{head, sizeof *head}, {d, sizeof *d}, {text, text_cap}};
    struct msghdr mi = {.msg_iov = in, .msg_iovlen = 3};
    do n = recvmsg(g_fd, &mi, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < (ssize_t)(sizeof *head + sizeof *d) || (mi.msg_flags & MSG_TRUNC) ||
        head->magic != CLC_DECIDE_MAGIC ||
        (size_t)n != sizeof *head + sizeof *d + head->text_size) {
        if (n >= 0) errno = EPROTO;
        return -1;
    }
    return 0;
}

int clc_decider_decide(const char *name, int device, clc_decision *out) {
    static _Atomic int said;
    size_t name_size = strlen(name);
    if (name_size > CLC_DECIDE_MAX_NAME) return CLC_DECIDE_ENGINE;
    clc_decide_reply head;
    char text[CLC_DECIDE_MAX_TEXT];
    int failed = 0, err = 0;
    pthread_mutex_lock(&g_lock);
    if (!is_ours()) {
        g_fd = -1; /* not this process's, or not the socket any more: never closed here */
        if (connect_decider() != 0) failed = 1;
    }
    if (!failed && ask(name, name_size, device, &head, out, text, sizeof text) != 0) {
        failed = 1;
        err = errno;
        drop(); /* a half-read answer must not be taken for the next question's */
    }
    if (failed && !err) err = errno;
    pthread_mutex_unlock(&g_lock);
    if (failed) {
        if (!atomic_exchange(&said, 1))
            clc_log(CLC_MSG_ERROR, "cannot ask clc-run about kernel launches (%s): kernels "
                    "first seen now get on_error=%s", strerror(err),
                    g_cfg.on_error.action == CLC_ACTION_DENY ? "deny" : "allow");
        return CLC_DECIDE_FAILED;
    }
    if (head.text_size) (void)!write(2, text, head.text_size);
    return head.status <= CLC_DECIDE_FAILED ? (int)head.status : CLC_DECIDE_FAILED;
}

/* Another thread may have held the lock at the fork; the connection is the parent's. */
void clc_decider_after_fork_child(void) {
    struct stat st;
    pthread_mutex_init(&g_lock, NULL);
    if (g_fd >= 0 && fstat(g_fd, &st) == 0 && st.st_dev == g_dev && st.st_ino == g_ino)
        close(g_fd);
    g_fd = -1;
}
