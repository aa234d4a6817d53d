/* SPDX-License-Identifier: Apache-2.0
 *
 * clc_multi_prog.h: whether slurmstepd, running a step as `srun --multi-prog`, finds a program
 * for a task in the step's configuration text.
 *
 * slurmstepd knows a --multi-prog step by a flag of the launch request that SPANK does not show
 * (spank.h has no item for it, Slurm 20.11 to 25.11), and it resolves each task's program from
 * the step's second argument, the configuration's text as srun read it, before any plugin runs.
 * A plugin cannot reach the program resolved that way; what it can do is read the same text the
 * same way: where slurmstepd would find a line for the task, the step may run that line without
 * the plugin, so it must be refused; where it would find none, a --multi-prog step fails the
 * task before its exec, and any other step runs the program the plugin sees.
 */
#ifndef CLC_MULTI_PROG_H
#define CLC_MULTI_PROG_H

#include <stdint.h>

/* The number (from 1) of the line of `text` that gives task `task` its program as slurmstepd's
 * multi_prog_get_argv reads it, or 0 when slurmstepd would find none. A line that Slurm reads
 * with numbers beyond an int counts as found. */
int clc_multi_prog_line(const char *text, uint32_t task);

#endif
