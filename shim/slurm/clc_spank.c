/* SPDX-License-Identifier: Apache-2.0
 *
 * clc_spank.c: a SPANK plugin that runs every task of every job step on a node under clc, as
 * the administrator's plugstack.conf line says (docs/deploy.md):
 *
 *     required /path/to/clc/libclc_spank.so policy=/etc/clc/policy.yaml python=/opt/clc/bin/python
 *              [captures=/var/spool/clc] [tenant=account|partition|qos|user|none] [strict=1]
 *              [user_policy=1] [user_hooks=1]
 *
 * In slurmstepd, for each task, just before its program is executed (slurm_spank_task_init,
 * in the task's own process, as the job's user), the plugin writes the task's settings into a
 * sealed memfd and replaces the task's program by clc-slurm-exec (beside this library), which
 * starts clc-run on the task's own program and arguments. Everything slurmstepd does after this
 * point (task prologs, TMPDIR, the user's limits) still happens, to clc-slurm-exec.
 *
 * What the job cannot change: the policy (an administrator's file, owned by root and writable
 * by nobody else; a policy the job names, --clc-policy, is refused unless user_policy=1), the
 * tenant (read from the controller's record of the job, not from the job's environment, which
 * the user sets), where the captures go (CAPTURES/<job id>/, made here by root and given to the
 * job's user) and --strict.
 *
 * Options it adds to srun, sbatch and salloc: --clc-report (clc-run's report at the end of each
 * task, on its standard error), --clc-policy=FILE (where allowed), --clc-hooks=FILE (where
 * allowed).
 *
 * A mistake in the plugstack.conf line stops every step with the reason in slurmd's log and the
 * job's standard error: a node that the administrator put under clc runs nothing without it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "clc_multi_prog.h"
#include "clc_slurm.h"

SPANK_PLUGIN(clc, 1);

#define PATH_LEN 4096
#define LAUNCHER "clc-slurm-exec"
#define N_OF(a) (sizeof(a) / sizeof *(a))

static struct {
    char policy[PATH_LEN], python[PATH_LEN], captures[PATH_LEN], launcher[PATH_LEN];
    enum { TENANT_ACCOUNT, TENANT_PARTITION, TENANT_QOS, TENANT_USER, TENANT_NONE } tenant_from;
    int strict, user_policy, user_hooks;
    int bad;                  /* the line has a mistake: every task stops */
    char why[PATH_LEN + 128]; /* ... this one */
} g_cfg = {.tenant_from = TENANT_ACCOUNT};

/* what the job asked for (srun/sbatch options) */
static struct {
    int report;
    char policy[PATH_LEN], hooks[PATH_LEN];
} g_opt;

/* the step, as the controller knows it (slurm_spank_init_post_opt, as root) */
static struct {
    int skip;  /* the extern step: no task of the user's runs in it */
    int batch; /* the batch step: its launch comes from the controller, never --multi-prog */
    char tenant[256], output_dir[PATH_LEN + 64], step[32], job[16];
    uint32_t restarts;
} g_step;

static int opt_report(int val, const char *arg, int remote) {
    g_opt.report = 1;
    return 0;
}

static int opt_path(char *out, const char *arg) {
    if (!arg || !*arg || strlen(arg) >= PATH_LEN) return -1;
    snprintf(out, PATH_LEN, "%s", arg);
    return 0;
}

static int opt_policy(int val, const char *arg, int remote) { return opt_path(g_opt.policy, arg); }
static int opt_hooks(int val, const char *arg, int remote) { return opt_path(g_opt.hooks, arg); }

static struct spank_option g_options[] = {
    {"clc-report", NULL, "print clc's report of each task at its end", 0, 0,
     (spank_opt_cb_f)opt_report},
    {"clc-policy", "FILE",
     "run the job's tasks under this clc policy (where the administrator "
     "allows it)",
     1, 0, (spank_opt_cb_f)opt_policy},
    {"clc-hooks", "FILE",
     "add this Python hook file to clc's policy (where the administrator "
     "allows it)",
     1, 0, (spank_opt_cb_f)opt_hooks},
    SPANK_OPTIONS_TABLE_END};

static void bad(const char *fmt, const char *what) {
    if (g_cfg.bad) return;
    g_cfg.bad = 1;
    snprintf(g_cfg.why, sizeof g_cfg.why, fmt, what);
}

/* An administrator's file: a regular file (or directory) owned by root and writable by nobody
 * else, reached through directories owned by root that nobody else can write to (or that are
 * sticky, as /tmp: nobody else can replace root's entries there). */
static int admin_owned(const char *path, int want_dir) {
    size_t n = strlen(path);
    char buf[PATH_LEN];
    if (path[0] != '/' || n >= sizeof buf) return 0;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && path[i] != '/') continue;
        memcpy(buf, path, i);
        buf[i] = 0;
        struct stat st;
        if (lstat(buf, &st) != 0 || st.st_uid != 0) return 0;
        if (i == n) /* the file itself */
            return (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) &&
                   !(st.st_mode & (S_IWGRP | S_IWOTH));
        if (!S_ISDIR(st.st_mode) || ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)))
            return 0;
    }
    return 0;
}

/* The plugstack.conf line's keys: where each one's value goes, and what it must be. */
enum key_kind { KEY_PATH, KEY_FLAG, KEY_TENANT };
static const struct key {
    const char *name;
    enum key_kind kind;
    void *dst; /* a PATH_LEN buffer, an int, or the tenant's source */
} KEYS[] = {
    {"policy", KEY_PATH, g_cfg.policy},          {"python", KEY_PATH, g_cfg.python},
    {"captures", KEY_PATH, g_cfg.captures},      {"tenant", KEY_TENANT, &g_cfg.tenant_from},
    {"strict", KEY_FLAG, &g_cfg.strict},         {"user_policy", KEY_FLAG, &g_cfg.user_policy},
    {"user_hooks", KEY_FLAG, &g_cfg.user_hooks},
};
static const char *const TENANT_FROM[] = {[TENANT_ACCOUNT] = "account",
                                          [TENANT_PARTITION] = "partition",
                                          [TENANT_QOS] = "qos",
                                          [TENANT_USER] = "user",
                                          [TENANT_NONE] = "none"};

/* The edit distance of a[0..n) and b, up to 3 (more is "not close"). */
static size_t distance(const char *a, size_t n, const char *b) {
    size_t m = strlen(b), row[32], prev;
    if (n >= 31 || m >= 31) return 3;
    for (size_t j = 0; j <= m; j++) row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t here = row[j], best = prev + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            prev = here;
        }
    }
    return row[m] < 3 ? row[m] : 3;
}

static void set_key(const struct key *key, const char *a, const char *v) {
    switch (key->kind) {
    case KEY_PATH:
        if (*v != '/' || strlen(v) >= PATH_LEN)
            bad("clc plugstack.conf: `%s`: expected an absolute path", a);
        else
            snprintf(key->dst, PATH_LEN, "%s", v);
        return;
    case KEY_FLAG:
        if (strcmp(v, "0") && strcmp(v, "1")) bad("clc plugstack.conf: `%s`: expected 0 or 1", a);
        *(int *)key->dst = !strcmp(v, "1");
        return;
    case KEY_TENANT:
        for (size_t t = 0; t < N_OF(TENANT_FROM); t++)
            if (!strcmp(v, TENANT_FROM[t])) {
                g_cfg.tenant_from = t;
                return;
            }
        bad("clc plugstack.conf: `%s`: expected account, partition, qos, user or none", a);
    }
}

static void parse_line(int ac, char **av) {
    for (int i = 0; i < ac; i++) {
        const char *a = av[i], *eq = strchr(a, '=');
        if (!eq) {
            bad("clc plugstack.conf: `%s`: expected KEY=VALUE", a);
            continue;
        }
        size_t k = (size_t)(eq - a), best = 3;
        const struct key *key = NULL, *close = NULL;
        for (size_t n = 0; n < N_OF(KEYS) && !key; n++) {
            size_t d = distance(a, k, KEYS[n].name);
            if (d == 0) key = &KEYS[n];
            if (d < best) best = d, close = &KEYS[n];
        }
        if (key) {
            set_key(key, a, eq + 1);
        } else if (close && !g_cfg.bad) {
            g_cfg.bad = 1;
            snprintf(g_cfg.why, sizeof g_cfg.why,
                     "clc plugstack.conf: `%.*s`: unknown key (did you mean `%s`?)", (int)k, a,
                     close->name);
        } else {
            bad("clc plugstack.conf: `%s`: unknown key (policy, python, captures, tenant, strict, "
                "user_policy, user_hooks)",
                a);
        }
    }
    if (!*g_cfg.policy) bad("clc plugstack.conf: %s", "policy=FILE is missing");
    if (!*g_cfg.python) bad("clc plugstack.conf: %s", "python=PATH is missing");
    if (g_cfg.strict && !*g_cfg.captures)
        bad("clc plugstack.conf: %s", "strict=1 needs captures=DIR (--strict judges a task by "
                                      "its captures)");
    if (g_cfg.bad) return;
    if (!admin_owned(g_cfg.policy, 0))
        bad("clc plugstack.conf: policy=%s: expected a file owned by root and writable by nobody "
            "else, through such directories",
            g_cfg.policy);
    if (*g_cfg.captures && !admin_owned(g_cfg.captures, 1))
        bad("clc plugstack.conf: captures=%s: expected a directory owned by root and writable by "
            "nobody else, through such directories",
            g_cfg.captures);
    /* what every task executes: root's, through root's directories (its real path: a venv's
     * python is a link) */
    char real[PATH_MAX];
    if (access(g_cfg.python, X_OK) != 0 || !realpath(g_cfg.python, real))
        bad("clc plugstack.conf: python=%s: not an executable", g_cfg.python);
    else if (!admin_owned(real, 0))
        bad("clc plugstack.conf: python=%s: expected a file owned by root and writable by nobody "
            "else, through such directories",
            g_cfg.python);
    /* clc-slurm-exec: beside this library */
    Dl_info info;
    if (!dladdr((void *)parse_line, &info) || !info.dli_fname) {
        bad("clc: %s", "cannot tell where the plugin lies, so cannot find " LAUNCHER);
        return;
    }
    snprintf(g_cfg.launcher, sizeof g_cfg.launcher, "%s", info.dli_fname);
    char *slash = strrchr(g_cfg.launcher, '/');
    if (!slash || (size_t)(slash - g_cfg.launcher) + sizeof LAUNCHER + 1 > sizeof g_cfg.launcher)
        bad("clc: %s", "cannot find " LAUNCHER);
    else
        strcpy(slash + 1, LAUNCHER);
    if (!g_cfg.bad && access(g_cfg.launcher, X_OK) != 0)
        bad("clc: %s: not an executable (reinstall clc)", g_cfg.launcher);
    else if (!g_cfg.bad && !admin_owned(g_cfg.launcher, 0))
        bad("clc: %s: expected a file owned by root and writable by nobody else, through such "
            "directories",
            g_cfg.launcher);
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
    for (struct spank_option *o = g_options; o->name; o++)
        if (spank_option_register(sp, o) != ESPANK_SUCCESS) return -1;
    if (spank_context() == S_CTX_REMOTE) parse_line(ac, av);
    return 0;
}

/* The tenant, from the controller's record of the job (the job's environment is the user's). */
static void find_tenant(uint32_t job_id, uid_t uid) {
    if (g_cfg.tenant_from == TENANT_NONE) return;
    if (g_cfg.tenant_from == TENANT_USER) {
        struct passwd *pw = getpwuid(uid);
        if (pw)
            snprintf(g_step.tenant, sizeof g_step.tenant, "%s", pw->pw_name);
        else
            snprintf(g_step.tenant, sizeof g_step.tenant, "%u", (unsigned)uid);
        return;
    }
    job_info_msg_t *msg = NULL;
    if (slurm_load_job(&msg, job_id, SHOW_ALL) != 0 || !msg || msg->record_count < 1) {
        bad("clc: cannot read job %s from the controller, so cannot tell its tenant", "");
        if (msg) slurm_free_job_info_msg(msg);
        return;
    }
    /* an array job's id lists its tasks: the record of this very job */
    slurm_job_info_t *job = NULL;
    for (uint32_t i = 0; i < msg->record_count && !job; i++)
        if (msg->job_array[i].job_id == job_id) job = &msg->job_array[i];
    if (!job) {
        bad("clc: the controller's reply has no record of this job, so cannot tell its tenant%s",
            "");
        slurm_free_job_info_msg(msg);
        return;
    }
    const char *t = g_cfg.tenant_from == TENANT_ACCOUNT     ? job->account
                    : g_cfg.tenant_from == TENANT_PARTITION ? job->partition
                                                            : job->qos;
    if (t) snprintf(g_step.tenant, sizeof g_step.tenant, "%s", t);
    slurm_free_job_info_msg(msg);
}

/* CAPTURES/<job id>/, made by root for the job's user (mode 0700); one made before is used only
 * when it is a directory of that user's. */
static void make_output_dir(uint32_t job_id, uid_t uid, gid_t gid) {
    if (!*g_cfg.captures) return;
    int top = open(g_cfg.captures, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (top < 0) {
        bad("clc: captures=%s: cannot open it", g_cfg.captures);
        return;
    }
    char name[32];
    snprintf(name, sizeof name, "%u", (unsigned)job_id);
    if (mkdirat(top, name, 0700) == 0) {
        if (fchownat(top, name, uid, gid, AT_SYMLINK_NOFOLLOW) != 0) {
            unlinkat(top, name, AT_REMOVEDIR);
            bad("clc: cannot give the job's capture directory to its user under %s",
                g_cfg.captures);
        }
    } else if (errno != EEXIST) {
        bad("clc: cannot make the job's capture directory under %s", g_cfg.captures);
    }
    /* another step of the job on this node may be between its mkdirat and its fchownat: a
     * directory still root's is looked at again, for a second at most */
    struct stat st;
    int got = -1;
    for (int i = 0; i < 100 && !g_cfg.bad; i++) {
        got = fstatat(top, name, &st, AT_SYMLINK_NOFOLLOW);
        if (got != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 || uid == 0) break;
        usleep(10000);
    }
    if (!g_cfg.bad && (got != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid))
        bad("clc: the job's capture directory under %s is not a directory of the job's user",
            g_cfg.captures);
    close(top);
    if (!g_cfg.bad)
        snprintf(g_step.output_dir, sizeof g_step.output_dir, "%s/%s", g_cfg.captures, name);
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
    if (spank_context() != S_CTX_REMOTE || g_cfg.bad) return 0;
    uint32_t job_id = 0, step_id = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
        bad("clc: %s", "cannot read the job's id, step and user from slurmstepd");
        return 0;
    }
    if (step_id == SLURM_EXTERN_CONT) {
        g_step.skip = 1;
        return 0;
    }
    snprintf(g_step.job, sizeof g_step.job, "%u", (unsigned)job_id);
    if (spank_get_item(sp, S_SLURM_RESTART_COUNT, &g_step.restarts) != ESPANK_SUCCESS)
        g_step.restarts = 0;
    g_step.batch = step_id == SLURM_BATCH_SCRIPT;
    if (g_step.batch)
        snprintf(g_step.step, sizeof g_step.step, "batch");
    else if (step_id == SLURM_INTERACTIVE_STEP)
        snprintf(g_step.step, sizeof g_step.step, "interactive");
    else
        snprintf(g_step.step, sizeof g_step.step, "%u", (unsigned)step_id);
    if (*g_opt.policy && !g_cfg.user_policy)
        bad("clc: --clc-policy=%s: this cluster runs jobs under its administrator's policy only",
            g_opt.policy);
    if (*g_opt.hooks && !g_cfg.user_hooks)
        bad("clc: --clc-hooks=%s: this cluster does not take hook files from jobs", g_opt.hooks);
    if (g_cfg.bad) return 0;
    find_tenant(job_id, uid);
    make_output_dir(job_id, uid, gid);
    return 0;
}

/* "KEY=VALUE\0" */
static int put(char *buf, size_t cap, size_t *len, const char *key, const char *value) {
    int n = snprintf(buf + *len, cap - *len, "%s=%s", key, value);
    if (n < 0 || (size_t)n + 1 > cap - *len) return -1;
    *len += (size_t)n + 1;
    return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av) {
    if (spank_context() != S_CTX_REMOTE || g_step.skip) return 0;
    if (g_cfg.bad) {
        slurm_error("%s", g_cfg.why);
        return -1;
    }
    int argc = 0;
    char **argv = NULL;
    uint32_t task = 0;
    if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv ||
        !argv[0] || spank_get_item(sp, S_TASK_GLOBAL_ID, &task) != ESPANK_SUCCESS) {
        slurm_error("clc: cannot read the task's program from slurmstepd");
        return -1;
    }
    /* A --multi-prog step runs the task's line of its configuration, which its second
     * argument carries: the plugin cannot tell such a step from one whose own argument reads the
     * same (clc_multi_prog.h), and refuses both. */
    int line = g_step.batch || argc < 2 ? 0 : clc_multi_prog_line(argv[1], task);
    if (line) {
        slurm_error("clc: srun --multi-prog steps cannot run under clc: line %d of this step's "
                    "configuration (%s) gives task %u a program that slurmstepd runs itself, out "
                    "of the plugin's reach (a step whose second argument reads as such a "
                    "configuration is refused the same way). Run one program that picks its work "
                    "by $SLURM_PROCID instead",
                    line, argv[0], (unsigned)task);
        return -1;
    }
    char task_id[16];
    snprintf(task_id, sizeof task_id, "%u", (unsigned)task);
    static char buf[CLC_SLURM_MAX];
    size_t len = 0;
    char output[PATH_LEN + 64] = "";
    if (*g_step.output_dir) {
        int n = g_step.restarts
                    ? snprintf(output, sizeof output, "%s/%s.%u.r%u.clc", g_step.output_dir,
                               g_step.step, (unsigned)task, (unsigned)g_step.restarts)
                    : snprintf(output, sizeof output, "%s/%s.%u.clc", g_step.output_dir,
                               g_step.step, (unsigned)task);
        if (n < 0 || (size_t)n >= sizeof output) { /* a cut path would be another file */
            slurm_error("clc: the task's capture path under %s is too long", g_step.output_dir);
            return -1;
        }
    }
    if (put(buf, sizeof buf, &len, CLC_SLURM_PYTHON, g_cfg.python) ||
        put(buf, sizeof buf, &len, CLC_SLURM_POLICY, *g_opt.policy ? g_opt.policy : g_cfg.policy) ||
        put(buf, sizeof buf, &len, CLC_SLURM_TENANT, g_step.tenant) ||
        put(buf, sizeof buf, &len, CLC_SLURM_OUTPUT, output) ||
        put(buf, sizeof buf, &len, CLC_SLURM_STRICT, g_cfg.strict ? "1" : "0") ||
        put(buf, sizeof buf, &len, CLC_SLURM_REPORT, g_opt.report ? "1" : "0") ||
        put(buf, sizeof buf, &len, CLC_SLURM_HOOKS, g_opt.hooks) ||
        put(buf, sizeof buf, &len, CLC_SLURM_ARGV0, argv[0]) ||
        put(buf, sizeof buf, &len, CLC_SLURM_JOB, g_step.job) ||
        put(buf, sizeof buf, &len, CLC_SLURM_STEP, g_step.step) ||
        put(buf, sizeof buf, &len, CLC_SLURM_TASK, task_id)) {
        slurm_error("clc: the task's settings are too long");
        return -1;
    }
    int fd = memfd_create(CLC_SLURM_MEMFD, MFD_ALLOW_SEALING); /* kept across the exec */
    if (fd < 0 || write(fd, buf, len) != (ssize_t)len ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        slurm_error("clc: cannot hand the task its settings: %m");
        return -1;
    }
    char num[16];
    snprintf(num, sizeof num, "%d", fd);
    if (spank_setenv(sp, CLC_SLURM_FD, num, 1) != ESPANK_SUCCESS) {
        slurm_error("clc: cannot name the task's settings in its environment");
        return -1;
    }
    /* The task's program becomes clc-slurm-exec; its arguments stay. The array is this task
     * process's own copy, executed right after the plugins' task_init. */
    char *launcher = strdup(g_cfg.launcher);
    if (!launcher) {
        slurm_error("clc: out of memory");
        return -1;
    }
    argv[0] = launcher;
    return 0;
}
