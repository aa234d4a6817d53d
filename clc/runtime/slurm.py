# SPDX-License-Identifier: Apache-2.0
"""What clc-run takes from clc-slurm-exec, the launcher of the tasks that the SPANK plugin
(shim/slurm/) puts under clc: the loader's variables of the job, which the launcher moved out
of clc-run's way, given back to the program. The names are those of shim/slurm/clc_slurm.h
(tests/unit/test_slurm_contract.py checks that they agree)."""

SAVED = "CLC_SLURM_SAVED"
SAVED_PREFIX = "CLC_SLURM_SAVED_"
LOADER_VARS = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH")


def restore_loader_vars(env):
    """env (a dict, changed in place) with the loader's variables the launcher saved put back
    and the saved copies removed. Anyone can set these names; they only ever reach the
    environment of the program that clc-run starts, which its starter sets anyway."""
    names = set(env.pop(SAVED, "").split(","))
    for name in LOADER_VARS:
        value = env.pop(SAVED_PREFIX + name, None)
        if name in names and value is not None:
            env[name] = value
    return env
