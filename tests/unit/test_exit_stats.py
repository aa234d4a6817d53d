# SPDX-License-Identifier: Apache-2.0
"""What an @clc.on_exit function receives (clc.runtime.exit_stats)."""

import pytest

import clc
from clc import abi
from clc.runtime.hooks import ExitStats, Hook, HookError, KernelStats, Launch


# ---- exit statistics -----------------------------------------------------------------------------

def test_exit_stats_from_rows():
    # GIVEN the engine's rows: one kernel in two contexts, another once, and two hooks
    hook = Hook(lambda launch: None, "h.py:guard")
    hook.call(Launch())
    stats = ExitStats.from_rows(
        [("vecAdd(float*)", 10, 1, 0, 9, 2, 0, 500),
         ("vecAdd(float*)", 5, 0, 1, 5, 0, 3, 100),
         {"name": "gemm", "launches": 2, "gpu_ns": 40}],
        [hook, ("other.py:f", 3, 30, 20)])
    # THEN kernels are added up by name, with dict-like access and iteration
    assert stats["vecAdd(float*)"] == KernelStats("vecAdd(float*)", 15, 1, 1, 14, 2, 3, 600)
    assert stats.get("gemm").launches == 2 and stats.get("nope") is None
    assert "gemm" in stats and len(stats) == 2 and stats.names() == ["vecAdd(float*)", "gemm"]
    assert [k.name for k in stats] == ["vecAdd(float*)", "gemm"]
    assert stats.total.launches == 17 and stats.total.gpu_ns == 640
    # AND hooks keep their calls and times
    assert stats.hooks["h.py:guard"].calls == 1
    other = stats.hooks["other.py:f"]
    assert (other.calls, other.total_ns, other.max_ns, other.mean_ns) == (3, 30, 20, 10.0)


def test_sm_share_place_last_is_carried_to_the_shim():
    # WHEN a hook confines a kernel to the device's last 32 SMs
    outcome = clc.wrap("sm_share", sms=32, place="last").outcome(0)
    # THEN the confinement word says so
    assert outcome.replacement == abi.confine_word(abi.CAP_SMS, 32, last=True)
    with pytest.raises(HookError, match="place must be first or last"):
        clc.wrap("sm_share", sms=32, place="middle")
