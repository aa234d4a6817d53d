/* SPDX-License-Identifier: Apache-2.0
 *
 * clc_slurm.h: what the SPANK plugin (clc_spank.c) hands a task's launcher (clc_slurm_exec.c),
 * and what the launcher hands clc-run (clc/runtime/slurm.py reads the same names from clc.abi,
 * generated from this header when clc is built: shim/abi_gen.py).
 *
 * The plugin writes the task's settings into a sealed memfd named CLC_SLURM_MEMFD, as
 * "KEY=VALUE\0" records, and names its descriptor in CLC_SLURM_FD. Only the plugin, inside the
 * task's own process before the exec, can have made that descriptor: a task prolog or the job's
 * environment can change the variable, not the file, and a variable that names anything else
 * stops the task.
 */
#ifndef CLC_SLURM_H
#define CLC_SLURM_H

#define CLC_SLURM_MEMFD "clc-slurm-task"
#define CLC_SLURM_FD "CLC_SLURM_FD"
#define CLC_SLURM_MAX (1u << 20)

/* The settings' keys */
#define CLC_SLURM_PYTHON "python"   /* the Python clc is installed in */
#define CLC_SLURM_POLICY "policy"   /* the policy file */
#define CLC_SLURM_TENANT "tenant"   /* the tenant, from the job (may be absent) */
#define CLC_SLURM_OUTPUT "output"   /* the capture's path (absent: no capture) */
#define CLC_SLURM_STRICT "strict"   /* "1": clc-run --strict */
#define CLC_SLURM_REPORT "report"   /* "1": the report printed at the end */
#define CLC_SLURM_HOOKS "hooks"     /* a hook file the job asked for and may use */
#define CLC_SLURM_ARGV0 "argv0"     /* the task's own program */
#define CLC_SLURM_JOB "job"         /* the job's id: clc-run --label job=... */
#define CLC_SLURM_STEP "step"       /* the step: a number, batch or interactive */
#define CLC_SLURM_TASK "task"       /* the task's global id */

/* clc-run starts in an environment of the launcher's own (PATH, LANG=C.UTF-8, HOME, TMPDIR):
 * nothing of the job's (LD_PRELOAD, GCONV_PATH, LOCPATH, ...) reaches clc's Python. The job's
 * environment, whole, is in a memfd named CLC_SLURM_ENV_MEMFD ("KEY=VALUE\0" records) whose
 * descriptor CLC_SLURM_ENV_FD names; clc-run gives it to the program. */
#define CLC_SLURM_ENV_MEMFD "clc-slurm-env"
#define CLC_SLURM_ENV_FD "CLC_SLURM_ENV_FD"

#endif
