# SPDX-License-Identifier: Apache-2.0
"""The names a policy's `process` glob is tried on, from a program's command line."""

import pytest

from clc.runtime.engine import process_names


@pytest.mark.parametrize("argv,expected", [
    (["./train", "--epochs", "3"], ("train", "python3.12")),
    (["python3", "train.py", "-W", "x"], ("python3", "python3.12", "train.py")),
    (["python3", "-W", "ignore", "train.py"], ("python3", "python3.12", "train.py")),
    (["python3", "-X", "dev", "-u", "/srv/job/train.py"], ("python3", "python3.12", "train.py")),
    (["python3", "-m", "torch.distributed.run"], ("python3", "python3.12",
                                                  "torch.distributed.run")),
    (["python3", "-mpytest", "-q"], ("python3", "python3.12", "pytest")),
    (["python3", "-c", "import x"], ("python3", "python3.12")),
    (["python3", "--", "-odd-name.py"], ("python3", "python3.12", "-odd-name.py")),
])
def test_python_programs_are_named_by_their_script_or_module(argv, expected):
    assert process_names(argv, "/usr/bin/python3.12") == expected
