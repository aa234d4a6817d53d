# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_colocate.py's arithmetic and parsing: what it reads from the two programs
and how it summarizes rounds (the runs themselves need a GPU and PyTorch)."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import bench_colocate as bc  # noqa: E402
from clc.policy.loader import load_policy  # noqa: E402


def test_percentiles_interpolate_between_ranks():
    values = list(range(100, 0, -1))  # 100 .. 1, unsorted
    assert bc.percentile(values, 0.5) == pytest.approx(50.5)
    assert bc.percentile(values, 0.99) == pytest.approx(99.01)
    assert bc.percentile(values, 1.0) == 100
    assert bc.percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        bc.percentile([], 0.5)


def test_the_programs_output_is_read():
    out = "ready\nwindow 10.000000 14.000000\nlatencies_ms 5.100,6.200,30.000\n"
    assert bc.parse_infer(out) == (10.0, 14.0, [5.1, 6.2, 30.0])
    assert bc.parse_train("ready\nsteps 1.5,2.5,3.5\n") == [1.5, 2.5, 3.5]
    assert bc.parse_train("ready\nsteps \n") == []
    with pytest.raises(ValueError, match="no window"):
        bc.parse_infer("ready\nTraceback ...\n")
    with pytest.raises(ValueError, match="no steps"):
        bc.parse_train("ready\n")


def test_training_rate_counts_steps_inside_the_window():
    ends = [9.9, 10.0, 10.5, 11.0, 12.0, 13.9, 14.0, 14.1]
    assert bc.rate_in_window(ends, 10.0, 14.0) == pytest.approx(6 / 4)
    with pytest.raises(ValueError, match="empty window"):
        bc.rate_in_window(ends, 3.0, 3.0)


def _row(p99, steps):
    return {"infer": {"p50": p99 / 2, "p99": p99, "max": p99 * 2, "n": 400}, "train": steps}


def _round(alone_p99, alone_steps, pairs):
    """A round's figures: the sync service and the light training alone, and pairs."""
    return {"alone": {"service": {"sync": {"infer": _row(alone_p99, 0)["infer"]}},
                      "training": {"light": {"train": alone_steps}}},
            "pairs": pairs}


def test_rounds_are_summarized_against_the_alone_runs_of_their_own_round():
    rounds = [_round(8.0, 25.0, {"sync-light": {"mps": _row(12.0, 20.0), "clc-0.5-first": {}}}),
              _round(7.0, 26.0, {"sync-light": {"mps": _row(11.0, 22.0), "clc-0.5-first": {}}}),
              _round(9.0, 24.0, {"sync-light": {"mps": _row(16.0, 21.0), "clc-0.5-first": {}}})]
    s = bc.summarize(rounds, ["sync-light"], ["alone", "mps", "clc-0.5-first"])["sync-light"]
    assert s["alone"]["p99"] == (8.0, 7.0, 9.0)
    assert s["alone"]["p99_vs_alone"] == (1.0, 1.0, 1.0)
    assert s["mps"]["p99"] == (12.0, 11.0, 16.0)
    # each round's p99 against that round's alone: 1.5, 11/7, 16/9
    assert s["mps"]["p99_vs_alone"] == pytest.approx((11 / 7, 1.5, 16 / 9))
    assert s["mps"]["steps_s"] == (21.0, 20.0, 22.0)
    assert s["mps"]["train_vs_alone"] == pytest.approx((22 / 26, 20 / 25, 21 / 24))
    # a configuration that could not run (no MPS daemon) has no figures, not zeros
    assert s["clc-0.5-first"] == {}


@pytest.mark.parametrize("share,place", [(0.5, "first"), (0.25, "last")])
def test_the_share_policies_are_valid(tmp_path, share, place):
    policy = load_policy(bc.share_policy(tmp_path / "p.yaml", share, place))
    (rule,) = policy.rules
    assert rule.wrap.wrapper == "sm_share" and rule.wrap.mechanism == "green"
    params = dict(rule.wrap.params)
    assert params["scope"] == "program" and params["place"] == place


# Stand-ins for examples/colocate.py that speak its protocol without a GPU: the orchestration
# (start, ready, go, the window, the signal that stops the training) runs for real.
FAKE_INFER = """
import sys, time
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
start = time.monotonic()
time.sleep(0.3)
print(f"window {start:.6f} {time.monotonic():.6f}")
print("latencies_ms 5.0,6.0,7.0,8.0", flush=True)
"""

FAKE_TRAIN = """
import signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
sys.stderr.write("x" * 200000)  # more than a pipe holds: must not stop the program
ends = []
while not stop:
    time.sleep(0.01)
    ends.append(time.monotonic())
print("steps " + ",".join(f"{t:.6f}" for t in ends), flush=True)
"""


def _args(tmp_path, infer=FAKE_INFER, train=FAKE_TRAIN):
    (tmp_path / "infer.py").write_text(infer)
    (tmp_path / "train.py").write_text(train)

    class Args:
        pass

    a = Args()
    a.infer = [sys.executable, tmp_path / "infer.py"]
    a.train = [sys.executable, tmp_path / "train.py"]
    return a


def test_two_programs_run_together_and_are_measured_in_one_window(tmp_path):
    got = bc.run_together(_args(tmp_path), {})
    assert got["infer"]["n"] == 4 and got["infer"]["max"] == 8.0
    # about one step per 10 ms inside the 0.3 s window (fewer on a loaded machine)
    assert 10 <= got["train"] <= 110, got


def test_alone_runs_each_program_by_itself(tmp_path):
    args = _args(tmp_path)
    assert bc.run_service_alone(args, {})["infer"]["p50"] == pytest.approx(6.5)
    got = bc.run_train_alone(args, {}, 0.3)
    assert 10 <= got["train"] <= 110, got
    assert got["train_steps"] >= 1


def test_a_program_that_dies_before_it_is_ready_is_said(tmp_path):
    args = _args(tmp_path, train="import sys\nsys.exit('no GPU here')\n")
    with pytest.raises(RuntimeError, match="the training exited 1 before it was ready.*no GPU"):
        bc.run_together(args, {})


def test_a_failed_configuration_is_said_and_the_rounds_go_on(tmp_path, monkeypatch, capsys):
    def fails(name, target, args, tmp, mps_env):
        raise RuntimeError("the training exited 1 before it was ready: no GPU")

    monkeypatch.setattr(bc, "run_config", fails)
    got = bc.measured(0, "mps", "sync-light", None, tmp_path, {})
    assert got["error"] == "the training exited 1 before it was ready: no GPU"
    assert got["wall_s"] >= 0
    assert "round 1: sync-light: mps:" in capsys.readouterr().out
    rounds = [{"alone": {"service": {"sync": got}, "training": {"light": got}},
               "pairs": {"sync-light": {"mps": got}}}]
    assert bc.summarize(rounds, ["sync-light"], ["alone", "mps"]) == {
        "sync-light": {"alone": {"failed": 1}, "mps": {"failed": 1}}}


def test_the_priority_policy_classes_the_two_programs(tmp_path):
    from clc.policy.names import Identity, KernelInfo
    policy = load_policy(bc.priority_policy(tmp_path / "p.yaml", tmp_path / "board"))
    assert policy.priority.board == str(tmp_path / "board")

    def class_of(tenant):
        info = KernelInfo(mangled="", demangled="", device=0, process_names=("python3",),
                          tenant=tenant, identity=Identity())
        return policy.priority.class_of(info)
    assert class_of("serving").kind == "latency-critical"
    assert (class_of("batch").kind, class_of("batch").floor) == ("best-effort",
                                                                bc.PRIORITY_FLOOR)
    assert class_of("other") is None
    shared = load_policy(bc.priority_policy(tmp_path / "s.yaml", tmp_path / "board", 0.25))
    assert [c.held_share for c in shared.priority.classes] == [0.0, 0.25]
    assert shared.priority.classes[1].run_ahead == bc.PRIORITY_RUN_AHEAD
    assert load_policy(bc.priority_policy(tmp_path / "r.yaml", tmp_path / "board", 0, 128)
                       ).priority.classes[1].run_ahead == 128
    assert not shared.warnings


def test_holds_are_read_from_the_training_capture(tmp_path):
    from capture_writer import CaptureWriter
    from clc import abi
    w = CaptureWriter(pid=9)
    w.process("python3 train")
    w.hold(10**9, 2_000_000, lag_ns=20_000)
    w.hold(2 * 10**9, 3_000_000, lag_ns=40_000, why=abi.HOLD_BUSY | abi.HOLD_FLOOR)
    w.hold(3 * 10**9, 1_000_000, lag_ns=0)
    w.end()
    w.write(tmp_path / "train.clc")
    assert bc.hold_row(tmp_path / "train.clc") == {
        "holds": 3, "held_ms": 6.0, "by_floor": 1, "lag_us_p50": 30.0}


def test_a_second_service_runs_with_the_first_and_is_measured_apart(tmp_path):
    args = _args(tmp_path)
    second = FAKE_INFER.replace("5.0,6.0,7.0,8.0", "1.0,2.0,3.0")
    (tmp_path / "second.py").write_text(second)
    args.second = [sys.executable, tmp_path / "second.py"]
    got = bc.run_together(args, {}, second_prefix=())
    assert got["infer"]["n"] == 4 and (got["second"]["n"], got["second"]["max"]) == (3, 3.0)
    rounds = [{"alone": {"service": {"sync": {"infer": {"p50": 1.0, "p99": 2.0, "max": 3.0}}},
                         "training": {"light": {"train": 10.0}}},
               "pairs": {"sync-light": {"shared-two": got}}}]
    summary = bc.summarize(rounds, ["sync-light"], ["alone", "shared-two"])["sync-light"]
    assert summary["shared-two"]["second_p99"][0] == pytest.approx(got["second"]["p99"])
    assert summary["shared-two"]["second_p99_vs_alone"][0] == pytest.approx(
        got["second"]["p99"] / 2.0)
    assert "second_p99" not in summary["alone"]
    assert bc.second_table("sync-light", summary)[4].startswith("| shared-two | 2.00 (2.00")


def test_a_hold_line_says_who_was_held_and_how_long():
    held = [{"holds": 10, "held_ms": 40.0, "by_floor": 1, "lag_us_p50": 20.0},
            {"holds": 12, "held_ms": 44.0, "by_floor": 3, "lag_us_p50": None}]
    line = bc.hold_line("the second service", held)
    assert line.startswith("the second service held 11 times per run (42 ms in all, 2 let go")
    assert line.endswith("20 us (median of the runs' medians)")
