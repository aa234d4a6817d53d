# SPDX-License-Identifier: Apache-2.0
"""bench_launch's per-kernel hook: asked once per kernel, its answer cached in the shim."""

import clc


@clc.on_launch
def allow_all(launch):
    return clc.allow()
