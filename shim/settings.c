/* SPDX-License-Identifier: Apache-2.0
 *
 * settings.c: what clc-run gave the program (the policy and every CLC_* setting), fixed when
 * the process starts and passed on to the processes it executes.
 *
 * clc-run writes the settings into a sealed memfd (F_SEAL_WRITE, SHRINK, GROW, SEAL: nobody can
 * change it any more) and names its descriptor in CLC_SETTINGS_FD. The shim's constructor
 * copies them before the program's main, and removes the variable from the program's view, so
 * that a program that sets CLC_POLICY, or CLC_SETTINGS_FD to a file of its own, changes nothing
 * of its own decisions. The processes it executes get the settings from the shim, not from
 * the environment the program passes: the exec family and posix_spawn are hooked to name the
 * descriptor again (made anew from the copy when the program closed it). A process started
 * without the variable (system() and popen() call glibc's internal spawn) finds the inherited
 * memfd by its name among its descriptors. No size limit comes from execve: the policy is not
 * in the environment.
 *
 * Format: "KEY=VALUE\0" records, as an environment block.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

#define SETTINGS_NAME "clc-settings"
#define SETTINGS_VAR "CLC_SETTINGS_FD"
#define SETTINGS_MAX (64u << 20)
#define REQUIRED_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static char *g_block;   /* the copy */
static size_t g_block_len;
static int g_fd = -1;   /* the memfd children inherit, while it is still ours */
static dev_t g_dev;
static ino_t g_ino;

const char *clc_setting(const char *key) {
    size_t klen = strlen(key);
    for (size_t off = 0; g_block && off < g_block_len;) {
        const char *rec = g_block + off;
        size_t n = strnlen(rec, g_block_len - off);
        if (n > klen && rec[klen] == '=' && memcmp(rec, key, klen) == 0) return rec + klen + 1;
        off += n + 1;
    }
    return NULL;
}

CLC_EXPORT const char *clc_shim_setting(const char *key) { return clc_setting(key); }

/* The block of a sealed memfd, copied; -1 when fd is not one. */
static int read_sealed(int fd) {
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS || fstat(fd, &st) != 0 ||
        !S_ISREG(st.st_mode) || st.st_size <= 0 || (uint64_t)st.st_size > SETTINGS_MAX)
        return -1;
    char *copy = malloc((size_t)st.st_size + 1);
    if (!copy) return -1;
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = pread(fd, copy + got, (size_t)st.st_size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(copy);
            return -1;
        }
        got += (size_t)r;
    }
    copy[got] = '\0';
    g_block = copy;
    g_block_len = got;
    g_fd = fd;
    g_dev = st.st_dev;
    g_ino = st.st_ino;
    return 0;
}

/* An inherited descriptor of a memfd named SETTINGS_NAME (a process started without the
 * variable, by a spawn clc cannot hook). */
static int find_inherited(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    struct dirent *de;
    char path[64], target[128];
    while (found < 0 && (de = readdir(d)) != NULL) {
        int fd = atoi(de->d_name);
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d)) continue;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (strncmp(target, "/memfd:" SETTINGS_NAME " ", 7 + sizeof SETTINGS_NAME) == 0 &&
            read_sealed(fd) == 0)
            found = fd;
    }
    closedir(d);
    return found;
}

/* Tells clc-run that the shim runs in this process ("pid name\n" into the status pipe it
 * named, when that descriptor is still its pipe), so that it can say when a program ran
 * without the shim (setuid, static, LD_PRELOAD removed) instead of "no kernel". */
static void announce(void) {
    const char *fd_s = clc_setting("CLC_STATUS_FD"), *ino_s = clc_setting("CLC_STATUS_INO");
    struct stat st;
    if (!fd_s || !ino_s) return;
    int fd = atoi(fd_s);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) ||
        (unsigned long long)st.st_ino != strtoull(ino_s, NULL, 10))
        return;
    char comm[32] = "?", line[64];
    int c = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (c >= 0) {
        ssize_t n = read(c, comm, sizeof comm - 1);
        comm[n > 0 ? n : 0] = '\0';
        close(c);
        comm[strcspn(comm, "\n")] = '\0';
    }
    int n = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), comm);
    if (n > 0) (void)!write(fd, line, (size_t)n); /* the pipe is non-blocking: never waits */
    fcntl(fd, F_SETFD, 0);
}

int clc_settings_load(void) {
    const char *v = getenv(SETTINGS_VAR);
    int ok = 0;
    if (v && *v) {
        char *end;
        long fd = strtol(v, &end, 10);
        ok = *end == '\0' && fd >= 0 && fd < (1L << 30) && read_sealed((int)fd) == 0;
        unsetenv(SETTINGS_VAR);
    } else {
        ok = find_inherited() >= 0;
    }
    /* Clear FD_CLOEXEC: children inherit the descriptor whatever the program's spawn. */
    if (ok) {
        fcntl(g_fd, F_SETFD, 0);
        announce();
    }
    return ok;
}

/* The descriptor to name to a child: ours while it still is (the program may have closed it or
 * put another file at its number), else a new sealed memfd made from the copy. No malloc here:
 * an exec may follow a vfork. */
static int child_fd(void) {
    struct stat st;
    if (g_fd >= 0 && fstat(g_fd, &st) == 0 && st.st_dev == g_dev && st.st_ino == g_ino &&
        fcntl(g_fd, F_SETFD, 0) == 0)
        return g_fd;
    int fd = memfd_create(SETTINGS_NAME, MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < g_block_len) {
        ssize_t w = write(fd, g_block + done, g_block_len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    if (done != g_block_len || fcntl(fd, F_ADD_SEALS, REQUIRED_SEALS) != 0 || fstat(fd, &st)) {
        close(fd);
        return -1;
    }
    g_fd = fd;
    g_dev = st.st_dev;
    g_ino = st.st_ino;
    return fd;
}

/* envp without any SETTINGS_VAR, plus ours, into out (room for n + 2); envp itself when clc
 * has no settings to pass. */
static char *const *child_env(char *const *envp, char **out, char *var, size_t var_size) {
    if (!g_block) return envp;
    int fd = child_fd();
    size_t k = 0;
    for (size_t i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], SETTINGS_VAR "=", sizeof SETTINGS_VAR) != 0) out[k++] = envp[i];
    if (fd >= 0) {
        snprintf(var, var_size, SETTINGS_VAR "=%d", fd);
        out[k++] = var;
    }
    out[k] = NULL;
    return out;
}

static size_t env_count(char *const *envp) {
    size_t n = 0;
    while (envp && envp[n]) n++;
    return n;
}

#define CHILD_ENV(envp)                                                                         \
    size_t n_env_ = env_count(envp);                                                             \
    char *env_buf_[n_env_ + 2];                                                                  \
    char var_[32];                                                                               \
    char *const *env_ = child_env(envp, env_buf_, var_, sizeof var_)

/* The next definition after the shim's: libc's. */
#define REAL(name) ((__typeof__(&name))clc_next_symbol(#name))

CLC_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    CHILD_ENV(envp);
    return REAL(execve)(path, argv, env_);
}

CLC_EXPORT int execv(const char *path, char *const argv[]) {
    CHILD_ENV(environ);
    return REAL(execve)(path, argv, env_);
}

CLC_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    CHILD_ENV(envp);
    return REAL(execvpe)(file, argv, env_);
}

CLC_EXPORT int execvp(const char *file, char *const argv[]) {
    CHILD_ENV(environ);
    return REAL(execvpe)(file, argv, env_);
}

CLC_EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
    CHILD_ENV(envp);
    return REAL(fexecve)(fd, argv, env_);
}

CLC_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
                        int flags) {
    CHILD_ENV(envp);
    return REAL(execveat)(dirfd, path, argv, env_, flags);
}

CLC_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    CHILD_ENV(envp);
    return REAL(posix_spawn)(pid, path, fa, attr, argv, env_);
}

CLC_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                            const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    CHILD_ENV(envp);
    return REAL(posix_spawnp)(pid, file, fa, attr, argv, env_);
}

/* The execl family: their arguments as an argv on the stack, then the calls above. */
#define ARGV_FROM_VA(arg0, extra)                                                               \
    size_t argc_ = 1;                                                                            \
    va_list ap_;                                                                                 \
    va_start(ap_, arg0);                                                                         \
    while (va_arg(ap_, char *)) argc_++;                                                         \
    va_end(ap_);                                                                                 \
    char *argv_[argc_ + 1];                                                                      \
    argv_[0] = (char *)arg0;                                                                     \
    va_start(ap_, arg0);                                                                         \
    for (size_t i_ = 1; i_ <= argc_; i_++) argv_[i_] = va_arg(ap_, char *);                      \
    extra;                                                                                       \
    va_end(ap_)

CLC_EXPORT int execl(const char *path, const char *arg, ...) {
    ARGV_FROM_VA(arg, (void)0);
    return execv(path, argv_);
}

CLC_EXPORT int execlp(const char *file, const char *arg, ...) {
    ARGV_FROM_VA(arg, (void)0);
    return execvp(file, argv_);
}

CLC_EXPORT int execle(const char *path, const char *arg, ...) {
    char *const *envp;
    ARGV_FROM_VA(arg, envp = va_arg(ap_, char *const *));
    return execve(path, argv_, envp);
}
