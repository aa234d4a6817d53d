# SPDX-License-Identifier: Apache-2.0
"""An argument-based guard: refuse vecAdd launches whose element count is too large.

Shows how a hook reads a launch's arguments. clc asks the driver where each parameter of the
kernel lies (cuKernelGetParamInfo) and reads the values the program passed, whether it
launched with `kernelParams` or with a packed `extra` buffer; `launch.params[i]` is the i-th
parameter, read as the kernel's C signature says it is: here
`vecAdd(const float *a, const float *b, float *c, int n)`, so `n` is params[3], an int.

    CLC_MAX_N=500000 clc-run --hooks examples/hooks/arg_guard.py -- ./vecadd

The limit comes from the environment (CLC_MAX_N, default 1000000). The same function can be
named by a policy rule instead (`action: hook`, `hook: examples/hooks/arg_guard.py:guard`,
see policies/hook-example.yaml), which then asks it only about the kernels its `match` takes.
"""

import os

import clc

# Read once, when clc-run loads this file into the program.
MAX_N = int(os.environ.get("CLC_MAX_N", "1000000"))


# every_launch=True: the answer depends on the arguments, which change from launch to launch,
# so the hook is asked at every launch of a matching kernel instead of once per kernel. That
# costs a call into Python per launch: keep such hooks to the kernels that need them.
@clc.on_launch(kernel="*vecAdd*", every_launch=True)
def guard(launch):
    n = launch.params[3].as_int()
    if n > MAX_N:
        # The program's launch call returns CUDA_ERROR_NOT_PERMITTED and the message is
        # printed on its stderr.
        return clc.deny(f"{launch.name}: n={n} is over the limit of {MAX_N} (CLC_MAX_N)")
    # No opinion: the policy's rules (or its default) decide this launch as usual.
    return None
