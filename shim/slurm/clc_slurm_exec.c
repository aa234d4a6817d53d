/* SPDX-License-Identifier: Apache-2.0
 *
 * clc-slurm-exec: the first program of every task that the SPANK plugin (clc_spank.c) puts
 * under clc. The plugin replaces the task's program by this one (argv[0]) and leaves the
 * task's settings in a sealed memfd; this program starts
 *
 *     PYTHON -I -m clc run --policy P --tenant T [-o CAPTURE | --no-capture] [--strict]
 *                          [--no-report] [--hooks H] -- PROGRAM ARGS...
 *
 * with PROGRAM the task's own and ARGS those the task was given. It is linked statically, so
 * that the loader's variables of the job (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH, which a task
 * prolog may set) run nothing inside it. clc-run starts in an environment of this program's
 * own, so that nothing of the job's environment (the loader's variables, glibc's GCONV_PATH and
 * LOCPATH, Python's own) runs code inside clc; the job's environment, whole, goes to clc-run in
 * a memfd, and clc-run gives it to the program.
 *
 * When clc cannot be started, the task stops (exit 127) with the reason on its standard error:
 * a task that the administrator put under clc never runs without it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clc_slurm.h"

#define REQUIRED_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static void die(const char *fmt, const char *what) {
    fprintf(stderr, "clc-slurm-exec: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    exit(127);
}

static char *g_block;
static size_t g_len;

static const char *setting(const char *key) {
    size_t klen = strlen(key);
    for (size_t off = 0; off < g_len;) {
        const char *rec = g_block + off;
        size_t n = strnlen(rec, g_len - off);
        if (n > klen && rec[klen] == '=' && memcmp(rec, key, klen) == 0) return rec + klen + 1;
        off += n + 1;
    }
    return NULL;
}

/* The settings, from the descriptor CLC_SLURM_FD names: only a sealed memfd of the plugin's
 * name is believed. */
static void read_settings(void) {
    const char *v = getenv(CLC_SLURM_FD);
    if (!v || !*v) die("%s is not set: start tasks through the clc SPANK plugin", CLC_SLURM_FD);
    char *end;
    errno = 0;
    long fd = strtol(v, &end, 10);
    if (errno || *end || fd < 0 || fd > INT_MAX) die("%s is not a descriptor", CLC_SLURM_FD);
    char link[64], target[128];
    snprintf(link, sizeof link, "/proc/self/fd/%ld", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) die("%s names no open descriptor", CLC_SLURM_FD);
    target[n] = 0;
    struct stat st;
    int seals = fcntl((int)fd, F_GET_SEALS);
    if (strncmp(target, "/memfd:" CLC_SLURM_MEMFD " ", strlen("/memfd:" CLC_SLURM_MEMFD " ")) !=
            0 ||
        seals < 0 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS || fstat((int)fd, &st) != 0 ||
        !S_ISREG(st.st_mode) || st.st_size <= 0 || (size_t)st.st_size > CLC_SLURM_MAX)
        die("%s names no settings of the clc SPANK plugin", CLC_SLURM_FD);
    g_len = (size_t)st.st_size;
    g_block = malloc(g_len + 1);
    if (!g_block || pread((int)fd, g_block, g_len, 0) != (ssize_t)g_len)
        die("cannot read the task's settings (%s)", strerror(errno));
    g_block[g_len] = 0;
    close((int)fd);
    unsetenv(CLC_SLURM_FD);
}

extern char **environ;

/* The job's environment, whole, in a memfd clc-run reads (and gives to the program). */
static int job_environment(void) {
    int fd = memfd_create(CLC_SLURM_ENV_MEMFD, 0); /* kept across the exec */
    if (fd < 0) die("cannot keep the job's environment (%s)", strerror(errno));
    for (char **e = environ; *e; e++) {
        size_t n = strlen(*e) + 1;
        for (const char *p = *e; n;) {
            ssize_t w = write(fd, p, n);
            if (w <= 0) die("cannot keep the job's environment (%s)", strerror(errno));
            p += w, n -= (size_t)w;
        }
    }
    return fd;
}

/* clc-run's own environment: what Python and clc need, nothing else of the job's. */
static char **own_environment(int env_fd) {
    static char fd_var[48];
    static char *out[8];
    int k = 0;
    out[k++] = "PATH=/usr/local/bin:/usr/bin:/bin";
    out[k++] = "LANG=C.UTF-8";
    static const char *keep[] = {"HOME", "TMPDIR"};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
        const char *v = getenv(keep[i]);
        if (!v) continue;
        char *kv = malloc(strlen(keep[i]) + strlen(v) + 2);
        if (!kv) die("%s", strerror(errno));
        sprintf(kv, "%s=%s", keep[i], v);
        out[k++] = kv;
    }
    snprintf(fd_var, sizeof fd_var, CLC_SLURM_ENV_FD "=%d", env_fd);
    out[k++] = fd_var;
    out[k] = NULL;
    return out;
}

int main(int argc, char **argv) {
    read_settings();
    const char *python = setting(CLC_SLURM_PYTHON), *policy = setting(CLC_SLURM_POLICY);
    const char *argv0 = setting(CLC_SLURM_ARGV0);
    if (!python || *python != '/') die("the task's settings name no Python (%s)", "python=");
    if (!policy || !argv0) die("the task's settings name no %s", !policy ? "policy" : "program");
    int env_fd = job_environment();

    char **args = calloc((size_t)argc + 32, sizeof *args);
    if (!args) die("%s", strerror(errno));
    int k = 0;
    args[k++] = (char *)python;
    args[k++] = "-I";
    args[k++] = "-m";
    args[k++] = "clc";
    args[k++] = "run";
    args[k++] = "--policy";
    args[k++] = (char *)policy;
    const char *v;
    /* always said, even empty: clc-run would otherwise take $CLC_TENANT, which the job sets */
    v = setting(CLC_SLURM_TENANT);
    args[k++] = "--tenant";
    args[k++] = (char *)(v ? v : "");
    if ((v = setting(CLC_SLURM_OUTPUT)) && *v)
        args[k++] = "-o", args[k++] = (char *)v;
    else
        args[k++] = "--no-capture";
    if ((v = setting(CLC_SLURM_STRICT)) && strcmp(v, "1") == 0) args[k++] = "--strict";
    if (!(v = setting(CLC_SLURM_REPORT)) || strcmp(v, "1") != 0) args[k++] = "--no-report";
    if ((v = setting(CLC_SLURM_HOOKS)) && *v) args[k++] = "--hooks", args[k++] = (char *)v;
    /* the job, step and task, kept in the capture (clc metrics counts by them) */
    static const char *labels[][2] = {
        {CLC_SLURM_JOB, "job="}, {CLC_SLURM_STEP, "step="}, {CLC_SLURM_TASK, "task="}};
    for (size_t i = 0; i < sizeof labels / sizeof *labels; i++) {
        if (!(v = setting(labels[i][0])) || !*v) continue;
        char *label = malloc(strlen(labels[i][1]) + strlen(v) + 1);
        if (!label) die("%s", strerror(errno));
        strcpy(label, labels[i][1]);
        strcat(label, v);
        args[k++] = "--label";
        args[k++] = label;
    }
    args[k++] = "--";
    args[k++] = (char *)argv0;
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    execve(python, args, own_environment(env_fd));
    fprintf(stderr,
            "clc-slurm-exec: cannot start clc: python=%s: %s (every user of the cluster "
            "must be able to run it)\n",
            python, strerror(errno));
    exit(127);
    return 127;
}
