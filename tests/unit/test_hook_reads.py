# SPDX-License-Identifier: Apache-2.0
"""A hook that reads what changes between the launches it is not asked about is named before
the program runs, with the option that would judge each launch."""

from clc.runtime.hook_reads import stale_read_warning
from clc.runtime.hooks import load_hook_file

HOOKS = '''\
import clc

@clc.on_launch(kernel="*softmax*")
def by_grid(launch):
    return clc.deny("big") if launch.grid.blocks > 4 else None

@clc.on_launch(per_shape=True)
def by_argument(l):
    return clc.deny("n") if l.params[3].as_int() > 9 else None

@clc.on_launch(per_shape=True)
def by_shape(launch):
    return clc.deny("big") if launch.block.threads * launch.shared_mem > 1 else None

@clc.on_launch(every_launch=True)
def every(launch):
    return None if launch.params and launch.grid else None

@clc.on_launch
def by_name(launch):
    return clc.deny("debug") if "debug" in launch.name else None
'''


def test_each_hook_is_said_to_judge_only_what_it_is_asked_about(tmp_path):
    path = tmp_path / "hooks.py"
    path.write_text(HOOKS)
    warnings = {h.name.split(":")[1]: stale_read_warning(h) for h in load_hook_file(path).hooks}
    assert "reads launch.grid but is asked once per kernel" in warnings["by_grid"]
    assert "per_shape=True" in warnings["by_grid"]
    assert "reads launch.params but is asked once per shape" in warnings["by_argument"]
    assert "every_launch=True" in warnings["by_argument"]
    assert warnings["by_shape"] is None
    assert warnings["every"] is None
    assert warnings["by_name"] is None
