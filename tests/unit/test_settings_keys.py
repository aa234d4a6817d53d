# SPDX-License-Identifier: Apache-2.0
"""The sealed settings' keys are shim/clc_abi.h's CLC_SETTING_KEYS (clc.abi.SETTINGS), once:
every key the shim reads is there, every key there is used, and clc-run writes no other
(clc.runtime.shim.settings_fd refuses it)."""

import os
import pathlib
import re

import pytest

from clc import abi
from clc.runtime.shim import settings_fd

ROOT = pathlib.Path(__file__).resolve().parents[2]
READS = re.compile(r'\b(?:clc_setting|setting_on)\("(CLC_\w+)"\)')


def shim_sources() -> list[pathlib.Path]:
    """The C files of both stages (the layers' folders and bridge/; not the Slurm programs)."""
    paths = [p for p in (ROOT / "shim").glob("*/*.c") if p.parent.name != "slurm"]
    assert paths, "no C files found under shim/"
    return paths


def shim_reads():
    return {key for path in shim_sources() for key in READS.findall(path.read_text())}


def test_every_key_the_shim_reads_is_declared():
    assert shim_reads() - abi.SETTINGS == set()


def test_every_declared_key_is_used():
    texts = [p.read_text() for p in shim_sources()]
    texts += [p.read_text() for p in (ROOT / "clc").rglob("*.py") if p.name != "abi.py"]
    unused = [key for key in sorted(abi.SETTINGS) if not any(f'"{key}"' in t for t in texts)]
    assert unused == []


def test_clc_run_writes_only_declared_keys():
    fd = settings_fd({"CLC_POLICY": "{}", "CLC_VERBOSE": "1"})
    os.close(fd)
    with pytest.raises(ValueError, match="not a clc setting .*: CLC_NOT_A_KEY"):
        settings_fd({"CLC_POLICY": "{}", "CLC_NOT_A_KEY": "1"})
