# SPDX-License-Identifier: Apache-2.0
"""Fixtures the unit tests share (a test file's own fixture of the same name wins)."""

import os

import pytest

from policy_cases import GUARD


@pytest.fixture
def hook_dir(tmp_path, monkeypatch):
    """A current directory holding guard.py, myhooks.py and more.py; its resolved path."""
    for name in ("guard.py", "myhooks.py", "more.py"):
        (tmp_path / name).write_text(GUARD)
    monkeypatch.chdir(tmp_path)
    return os.path.realpath(tmp_path)
