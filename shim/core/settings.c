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
 * in the environment. A process that finds no settings, but CLC_FALLBACK beside LD_PRELOAD,
 * was started for the run past clc's hooks after the descriptor was closed: it fails closed (the
 * on_error CLC_FALLBACK names) and tells clc-run. The execve system call made through libc's
 * syscall() goes through the exec hooks here (leave.c).
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "core.h"

#define SETTINGS_NAME CLC_SETTINGS_NAME
#define SETTINGS_VAR CLC_SETTINGS_VAR
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

/* What the policy does with green contexts, read from the settings as they load: whether it
 * confines at all (CLC_POLICY_CONFINES) and whether program-wide (CLC_POLICY_PROGRAM). */
static int g_policy_confines, g_policy_program_wide;

static int setting_on(const char *key) {
    const char *v = clc_setting(key);
    return v && strcmp(v, "1") == 0;
}

int clc_policy_confines(void) { return g_policy_confines; }
int clc_policy_program_wide(void) { return g_policy_program_wide; }

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

/* ---- telling clc-run -------------------------------------------------------------------------
 * clc-run listens on a datagram socket in its private directory (CLC_STATUS): each process in
 * which the shim starts says so, and what it does that clc-run must account for (the programs it
 * executes, the capture it opens or cannot), so that clc-run can say which processes ran
 * unseen and which captures are missing. The kernel names the sender (SCM_CREDENTIALS): a
 * process speaks only for itself. A socket is made for each message, so that a program that
 * closes every descriptor loses nothing; a vfork child may send too. */
static char g_self[4096]; /* the preload library's own path, for the processes it executes */

/* CLC_FALLBACK as clc-run set it ("ON_ERROR STATUS"): the sealed setting, or, in a process that
 * found no settings, the environment's at start. */
#define FALLBACK_MAX 256
static char g_fallback[FALLBACK_MAX];
static const char *g_fallback_status; /* inside g_fallback: the status socket, "" when none */

void clc_announce(const char *what, const char *text) {
    const char *path = g_block ? clc_setting("CLC_STATUS") : g_fallback_status;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!path || !*path || strlen(path) >= sizeof addr.sun_path) return;
    memcpy(addr.sun_path, path, strlen(path) + 1);
    char msg[4200];
    int n = snprintf(msg, sizeof msg, "%s %s", what, text ? text : "");
    if (n <= 0) return;
    if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    /* The listener's queue may be full for a moment (many processes starting at once). */
    struct timeval wait = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
    (void)!sendto(fd, msg, (size_t)n, MSG_NOSIGNAL, (struct sockaddr *)&addr, sizeof addr);
    close(fd);
}

/* The process's name (its comm), for clc-run's messages. */
static void process_name(char comm[32]) {
    strcpy(comm, "?");
    int c = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (c >= 0) {
        ssize_t n = read(c, comm, 31);
        comm[n > 0 ? n : 0] = '\0';
        close(c);
        comm[strcspn(comm, "\n")] = '\0';
    }
}

static void keep_fallback(const char *v) {
    size_t n = v ? strlen(v) : 0;
    if (!v || n >= sizeof g_fallback) return;
    memcpy(g_fallback, v, n + 1);
    const char *space = strchr(g_fallback, ' ');
    g_fallback_status = space ? space + 1 : "";
}

static void find_self(void) {
    Dl_info self;
    if (dladdr((void *)&clc_announce, &self) && self.dli_fname && self.dli_fname[0] == '/')
        snprintf(g_self, sizeof g_self, "%s", self.dli_fname);
}

int clc_settings_fallback(int *deny) {
    const char *v = getenv(CLC_FALLBACK_VAR);
    if (!v) return 0;
    /* Only a whole "allow STATUS" lets launches through: anything else fails closed. */
    *deny = strncmp(v, "allow ", 6) != 0;
    keep_fallback(v);
    find_self();
    char comm[32];
    process_name(comm);
    clc_announce(CLC_STATUS_NO_SETTINGS, comm);
    return 1;
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
    if (ok) {
        g_policy_confines = setting_on("CLC_POLICY_CONFINES");
        g_policy_program_wide = setting_on("CLC_POLICY_PROGRAM");
        /* Clear FD_CLOEXEC: children inherit the descriptor whatever the program's spawn. */
        fcntl(g_fd, F_SETFD, 0);
        find_self();
        keep_fallback(clc_setting("CLC_FALLBACK"));
        char comm[32];
        process_name(comm);
        clc_announce(CLC_STATUS_START, comm);
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

/* Whether LD_PRELOAD's value names the shim. */
static int preloads_shim(const char *value) {
    size_t n = strlen(g_self);
    for (const char *p = value; *p;) {
        size_t len = strcspn(p, ": ");
        if (len == n && memcmp(p, g_self, n) == 0) return 1;
        p += len;
        if (*p) p++;
    }
    return 0;
}

/* envp without any SETTINGS_VAR or CLC_FALLBACK, plus ours, into out (room for n + 4), with the
 * shim first in LD_PRELOAD (into `preload`, room for `preload_size`): a program that runs a
 * process without it (env -i, env -u LD_PRELOAD, an environment of its own) does not run it
 * unseen. A process without settings passes on the shim and CLC_FALLBACK alone. envp itself
 * when the process is not of a clc-run run. */
static char *const *child_env(char *const *envp, char **out, char *var, size_t var_size,
                              char *preload, size_t preload_size, char *fallback,
                              size_t fallback_size) {
    if (!g_block && !g_fallback[0]) return envp;
    int fd = g_block ? child_fd() : -1;
    size_t k = 0;
    int preloaded = 0;
    for (size_t i = 0; envp && envp[i]; i++) {
        if (strncmp(envp[i], SETTINGS_VAR "=", sizeof SETTINGS_VAR) == 0) continue;
        if (g_fallback[0] && strncmp(envp[i], CLC_FALLBACK_VAR "=", sizeof CLC_FALLBACK_VAR) == 0)
            continue;
        if (g_self[0] && strncmp(envp[i], "LD_PRELOAD=", 11) == 0) {
            if (preloaded) continue;
            preloaded = 1;
            if (!preloads_shim(envp[i] + 11)) {
                snprintf(preload, preload_size, "LD_PRELOAD=%s%s%s", g_self, envp[i][11] ? ":" : "",
                         envp[i] + 11);
                out[k++] = preload;
                continue;
            }
        }
        out[k++] = envp[i];
    }
    if (g_self[0] && !preloaded) {
        snprintf(preload, preload_size, "LD_PRELOAD=%s", g_self);
        out[k++] = preload;
    }
    if (fd >= 0) {
        snprintf(var, var_size, SETTINGS_VAR "=%d", fd);
        out[k++] = var;
    }
    if (g_fallback[0]) {
        snprintf(fallback, fallback_size, CLC_FALLBACK_VAR "=%s", g_fallback);
        out[k++] = fallback;
    }
    out[k] = NULL;
    return out;
}

static size_t env_count(char *const *envp) {
    size_t n = 0;
    while (envp && envp[n]) n++;
    return n;
}

/* The longest LD_PRELOAD value in envp. */
static size_t preload_length(char *const *envp) {
    size_t n = 0;
    for (size_t i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], "LD_PRELOAD=", 11) == 0 && strlen(envp[i]) > n) n = strlen(envp[i]);
    return n;
}

#define CHILD_ENV(envp)                                                                         \
    size_t n_env_ = env_count(envp);                                                             \
    char *env_buf_[n_env_ + 4];                                                                  \
    char var_[32];                                                                               \
    char preload_[preload_length(envp) + sizeof g_self + 16];                                    \
    char fallback_[sizeof CLC_FALLBACK_VAR + FALLBACK_MAX];                                      \
    char *const *env_ = child_env(envp, env_buf_, var_, sizeof var_, preload_, sizeof preload_,  \
                                  fallback_, sizeof fallback_)

/* The process is about to become `path`: said to clc-run, which then expects the new image's
 * shim to start (and hears of a failed exec). */
static void announce_exec(const char *path) { clc_announce(CLC_STATUS_EXEC, path); }

static int exec_failed(int r) {
    char e[16];
    int saved = errno;
    snprintf(e, sizeof e, "%d", saved);
    clc_announce(CLC_STATUS_EXEC_FAILED, e);
    errno = saved;
    return r;
}

/* A process spawned: clc-run expects its shim to start. */
static int spawned(int r, const pid_t *pid, const char *path) {
    if (r == 0 && pid) {
        char text[4200];
        snprintf(text, sizeof text, "%d %s", (int)*pid, path);
        clc_announce(CLC_STATUS_SPAWN, text);
    }
    return r;
}

/* The next definition after the shim's: libc's. */
#define REAL(name) ((__typeof__(&name))clc_next_symbol(#name))

/* An exec hands `call` the child's environment (env_) and tells clc-run first, since a process
 * that becomes another never returns to say so; only a failed one comes back. */
#define EXEC_AS(envp, shown, call)                                                              \
    CHILD_ENV(envp);                                                                             \
    announce_exec(shown);                                                                        \
    return exec_failed(call)

CLC_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    EXEC_AS(envp, path, REAL(execve)(path, argv, env_));
}

CLC_EXPORT int execv(const char *path, char *const argv[]) {
    EXEC_AS(environ, path, REAL(execve)(path, argv, env_));
}

CLC_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    EXEC_AS(envp, file, REAL(execvpe)(file, argv, env_));
}

CLC_EXPORT int execvp(const char *file, char *const argv[]) {
    EXEC_AS(environ, file, REAL(execvpe)(file, argv, env_));
}

CLC_EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
    EXEC_AS(envp, "(a file descriptor)", REAL(fexecve)(fd, argv, env_));
}

CLC_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
                        int flags) {
    EXEC_AS(envp, path, REAL(execveat)(dirfd, path, argv, env_, flags));
}

CLC_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    CHILD_ENV(envp);
    return spawned(REAL(posix_spawn)(pid, path, fa, attr, argv, env_), pid, path);
}

CLC_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                            const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    CHILD_ENV(envp);
    return spawned(REAL(posix_spawnp)(pid, file, fa, attr, argv, env_), pid, file);
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
