# SPDX-License-Identifier: Apache-2.0
"""A per-tenant launch budget: each tenant may launch at most CLC_BUDGET kernels.

Shows a hook that keeps state across launches and an @clc.on_exit hook that reports it. The
tenant is the one clc-run is told about (`--tenant NAME`, or CLC_TENANT in the environment;
"default" without either); once a tenant has used its budget (CLC_BUDGET, default 1000
launches), every further launch is refused with CUDA_ERROR_NOT_PERMITTED. At exit one line per
tenant goes to stderr:

    clc-budget: tenant=<name> launches=<n> allowed=<n> denied=<n> budget=<n>

    CLC_BUDGET=500 clc-run --tenant team-a --hooks examples/hooks/tenant_budget.py -- ./app
"""

import collections
import os
import sys
import threading

import clc

BUDGET = int(os.environ.get("CLC_BUDGET", "1000"))

# Hooks can be called from several of the program's threads at once: guard the counters.
_lock = threading.Lock()
_launches = collections.Counter()  # tenant -> launches asked about
_denied = collections.Counter()  # tenant -> launches refused


def _tenant():
    return os.environ.get("CLC_TENANT") or "default"


# every_launch=True: a budget counts launches, so the hook must see each one (by default a
# hook is asked once per kernel and its answer reused for all of that kernel's launches).
@clc.on_launch(kernel="*", every_launch=True)
def budget(launch):
    tenant = _tenant()
    with _lock:
        _launches[tenant] += 1
        if _launches[tenant] <= BUDGET:
            return None  # within budget: let the policy decide as usual
        _denied[tenant] += 1
    return clc.deny(f"tenant {tenant!r} has used its budget of {BUDGET} kernel launches "
                    f"(CLC_BUDGET)")


# Called once when the program ends, with clc's own per-kernel counts (not needed here: the
# hook keeps its own per tenant).
@clc.on_exit
def report(stats):
    with _lock:
        for tenant in sorted(_launches):
            launches, denied = _launches[tenant], _denied[tenant]
            print(f"clc-budget: tenant={tenant} launches={launches} allowed={launches - denied} "
                  f"denied={denied} budget={BUDGET}", file=sys.stderr)
