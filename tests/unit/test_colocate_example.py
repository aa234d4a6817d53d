# SPDX-License-Identifier: Apache-2.0
"""examples/colocate.py's options: the services' wait modes and the training sizes that
benchmarks/bench_colocate.py asks for, read without PyTorch (running them needs a GPU)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.bench_colocate import SCRIPT, _colocate  # noqa: E402


def _torch_missing():
    return importlib.util.find_spec("torch") is None


def test_the_help_is_read_without_pytorch():
    # GIVEN this Python (PyTorch or not) WHEN each role's help is asked for
    for role in ("infer", "train"):
        got = subprocess.run([sys.executable, SCRIPT, role, "--help"], capture_output=True,
                             text=True, timeout=60)
        # THEN it is printed, naming the new choices
        assert got.returncode == 0, got.stderr
        assert ("{sync,copy,graph}" if role == "infer" else "{light,heavy}") in got.stdout


def test_the_modes_and_sizes_are_parsed():
    colocate = _colocate()
    assert colocate.MODES == ("sync", "copy", "graph")
    parser = colocate.build_parser()
    for mode in colocate.MODES:
        args = parser.parse_args(["infer", "--mode", mode, "--requests", "200"])
        assert (args.role, args.mode, args.requests, args.gap_ms) == ("infer", mode, 200, 10.0)
    # the defaults the earlier benchmarks ran: a synchronizing service, the encoder training
    assert parser.parse_args(["infer"]).mode == "sync"
    assert parser.parse_args(["train"]).size is None
    assert parser.parse_args(["train", "--size", "heavy"]).size == "heavy"
    assert colocate.TRAIN_SIZES["heavy"] == {"layers": 16, "width": 2048, "heads": 16,
                                             "batch": 16, "tokens": 1024}
    assert colocate.TRAIN_SIZES["light"]["layers"] == 12
    assert colocate.TRAIN_SIZES["light"]["width"] == 768


@pytest.mark.parametrize("argv,said", [
    (["infer", "--mode", "events"], "invalid choice: 'events'"),
    (["train", "--size", "medium"], "invalid choice: 'medium'"),
    (["train", "--size", "light", "--layers", "4"], "--size light sets its own layers"),
    (["infer", "--requests", "0"], "--requests must be at least 1"),
])
def test_bad_options_are_said(argv, said):
    got = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 2 and said in got.stderr, got.stderr


@pytest.mark.skipif(not _torch_missing(), reason="PyTorch is installed here")
def test_running_without_pytorch_says_so():
    got = subprocess.run([sys.executable, SCRIPT, "train", "--size", "light"],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 1
    assert got.stderr.strip() == "colocate: PyTorch is not installed in this Python"
