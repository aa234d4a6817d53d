# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_colocate.py's arithmetic and parsing: what it reads from the two programs
and how it summarizes rounds (the runs themselves need a GPU and PyTorch)."""

import contextlib
import json
import os
import sys
import types
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
    def fails(name, target, args, tmp, mps_env, gpu_env=None):
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
    reserved = load_policy(bc.priority_policy(tmp_path / "v.yaml", tmp_path / "board", 0.125,
                                              reserve=0.25))
    assert [(c.reserve, c.held_share) for c in reserved.priority.classes] == [(0, 0),
                                                                             (0.25, 0.125)]
    slo = load_policy(bc.priority_policy(tmp_path / "o.yaml", tmp_path / "board", 0.25,
                                         slo=bc.PRIORITY_SLO))
    assert [(c.slo, c.held_share) for c in slo.priority.classes] == [(1.1, 0), (0, 0.25)]
    assert all(bc.under_mps(c, {}) for c in ("priority-slo-mps", "priority-slo-share-mps"))
    assert "priority-slo" in bc.PRIORITY_CONFIGS and not bc.under_mps("priority-slo", {})


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


# ---- what is asked for --------------------------------------------------------------------

def test_pairs_are_the_three_services_by_the_two_trainings():
    assert bc.PAIRS == ("sync-light", "sync-heavy", "copy-light", "copy-heavy", "graph-light",
                        "graph-heavy")
    assert bc.parse_pairs("all") == list(bc.PAIRS)
    assert bc.parse_pairs(" graph-heavy,sync-light,graph-heavy ") == ["graph-heavy",
                                                                       "sync-light"]
    with pytest.raises(ValueError, match="unknown pair.*graph-medium: choose from sync-light"):
        bc.parse_pairs("sync-light,graph-medium")
    with pytest.raises(ValueError, match=r"\(none given\)"):
        bc.parse_pairs(",")


def test_configurations_default_all_and_alone_first():
    assert bc.parse_configs("default") == list(bc.DEFAULT_CONFIGS)
    assert bc.parse_configs("all") == list(bc.CONFIGS)
    assert bc.parse_configs("mps,priority,mps", ["mine"]) == ["alone", "mps", "priority",
                                                              "mine"]
    with pytest.raises(ValueError, match="unknown configuration.*mps-10"):
        bc.parse_configs("mps-10")


POLICY = """version: 1
default: allow
priority:
  classes:
    - name: serving
      class: latency-critical
      match: {tenant: serving}
    - name: training
      class: best-effort
      match: {tenant: batch}
      held_share: 0.25
"""


def test_a_policy_configuration_is_checked_and_kept(tmp_path):
    path = tmp_path / "a:b.yaml"  # a colon in the path is not the :mps suffix
    path.write_text(POLICY)
    pc = bc.parse_policy_config(f"share25={path}:mps")
    assert (pc.name, pc.path, pc.mps, pc.text) == ("share25", str(path), True, POLICY)
    assert bc.parse_policy_config(f"plain={path}").mps is False


@pytest.mark.parametrize("spec,said", [
    ("noequals", "expected NAME=POLICY.yaml"),
    ("name=", "expected NAME=POLICY.yaml"),
    ("Bad/Name={p}", "a name is 1 to 40 of a-z"),
    ("mps={p}", "mps is a name of the bench's own"),
    ("alone-service={p}", "alone-service is a name of the bench's own"),
    ("x={missing}", "cannot read the policy"),
    ("x={folder}", "is not a regular file"),
    ("x={bad}", r"bad.yaml:\d+:\d+: "),
])
def test_a_bad_policy_configuration_is_said(tmp_path, spec, said):
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "bad.yaml").write_text(POLICY.replace("held_share: 0.25", "held_share: 2"))
    spec = spec.format(p=tmp_path / "p.yaml", missing=tmp_path / "none.yaml",
                       bad=tmp_path / "bad.yaml", folder=tmp_path)
    with pytest.raises(ValueError, match=said):
        bc.parse_policy_config(spec)


def test_the_options_are_checked(tmp_path, capsys):
    (tmp_path / "p.yaml").write_text(POLICY)
    args = bc.parse_args(["--pairs", "copy-heavy", "--configs", "mps", "--policy-config",
                          f"mine={tmp_path / 'p.yaml'}:mps"])
    assert (args.pairs, args.configs) == (["copy-heavy"], ["alone", "mps", "mine"])
    assert (args.rounds, args.requests) == (3, 400)
    quick = bc.parse_args(["--quick"])
    assert (quick.rounds, quick.requests, quick.pairs) == (1, 200, list(bc.PAIRS))
    assert bc.parse_args(["--quick", "--rounds", "2"]).rounds == 2
    for argv, said in ((["--pairs", "sync-medium"], "unknown pair(s) sync-medium"),
                       (["--rounds", "0"], "--rounds 0: expected at least 1"),
                       (["--run-ahead", "2"], "--run-ahead 2: expected 4 to 256"),
                       (["--policy-config", f"a={tmp_path / 'p.yaml'}",
                         "--policy-config", f"a={tmp_path / 'p.yaml'}"], "a given twice")):
        with pytest.raises(SystemExit) as e:
            bc.parse_args(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err


def test_a_round_runs_under_mps_first_and_each_alone_once(tmp_path):
    (tmp_path / "p.yaml").write_text(POLICY)
    policies = {"mine": bc.parse_policy_config(f"mine={tmp_path / 'p.yaml'}:mps"),
                "plain": bc.parse_policy_config(f"plain={tmp_path / 'p.yaml'}")}
    mps, plain = bc.plan_round(["sync-light", "graph-light", "graph-heavy"],
                               ["alone", "shared", "mps", "clc-0.25-first", "priority-mps",
                                "mine", "plain"], policies)
    assert mps == [(c, p) for p in ("sync-light", "graph-light", "graph-heavy")
                   for c in ("mps", "clc-0.25-first", "priority-mps", "mine")]
    assert plain == [("alone-service", "sync"), ("alone-service", "graph"),
                     ("alone-training", "light"), ("alone-training", "heavy"),
                     *((c, p) for p in ("sync-light", "graph-light", "graph-heavy")
                       for c in ("shared", "plain"))]


def test_a_pair_runs_its_service_and_its_training(tmp_path):
    args = bc.parse_args(["--requests", "70", "--gap-ms", "10"])
    args.clc_run = "clc-run"
    progs = bc.programs("graph", "heavy", args)
    assert [str(a) for a in progs.infer[1:]] == [str(bc.SCRIPT), "infer", "--mode", "graph",
                                                 "--requests", "70", "--gap-ms", "10.0"]
    assert [str(a) for a in progs.second[-4:]] == ["--requests", "100", "--gap-ms", "7.0"]
    assert [str(a) for a in progs.train[1:]] == [str(bc.SCRIPT), "train", "--size", "heavy"]
    assert not hasattr(bc.programs("copy", None, args), "train")
    # the encoder training of the figures before the GPT-2 pairs: colocate.py's default
    assert bc.parse_pairs("sync-encoder") == ["sync-encoder"]
    assert "sync-encoder" not in bc.parse_pairs("all")
    assert [str(a) for a in bc.programs("sync", "encoder", args).train[1:]] == [
        str(bc.SCRIPT), "train"]


# ---- the report ---------------------------------------------------------------------------

def _data():
    """A run's figures as main keeps them: two pairs, two rounds, one failed run."""
    def pairs(mps_p99, mps_steps, priority):
        return {"sync-light": {"mps": {**_row(mps_p99, mps_steps), "wall_s": 20.0},
                               "priority-mps": priority},
                "graph-heavy": {"mps": {**_row(mps_p99 * 2, mps_steps / 10), "wall_s": 40.0},
                                "priority-mps": {"error": "the training exited 1",
                                                 "wall_s": 5.0}}}

    held = {"holds": 400, "held_ms": 1000.0, "by_floor": 0, "lag_us_p50": 30.0}
    rounds = []
    for alone_p99, mps_p99, steps in ((4.0, 6.0, 30.0), (5.0, 5.5, 28.0)):
        r = {"alone": {"service": {"sync": {"infer": _row(alone_p99, 0)["infer"], "wall_s": 8.0},
                                   "graph": {"infer": _row(alone_p99, 0)["infer"],
                                             "wall_s": 8.0}},
                       "training": {"light": {"train": steps, "wall_s": 10.0},
                                    "heavy": {"train": steps / 8, "wall_s": 30.0}}},
             "pairs": pairs(mps_p99, steps * 0.9,
                            {**_row(alone_p99, steps * 0.85), "held": held, "wall_s": 25.0})}
        rounds.append(r)
    return {"device": "NVIDIA H200", "requests": 400, "gap_ms": 10.0,
            "pairs": ["sync-light", "graph-heavy"], "configs": ["alone", "mps", "priority-mps"],
            "policy_configs": {}, "rounds": rounds, "notes": []}


def test_the_summary_has_a_row_per_pair_and_a_cell_per_configuration():
    lines = bc.report(_data())
    at = lines.index("| pair | alone | mps | priority-mps |")
    # sync-light: mps p99 6/4 and 5.5/5 -> median 1.30x; training 0.90 both rounds
    assert lines[at + 2] == "| sync-light | 1.00x / 1.00 | 1.30x / 0.90 | 1.00x / 0.85 |"
    # graph-heavy: mps p99 12/4 and 11/5 -> 2.60x; training 0.9 * 8 / 10 = 0.72
    assert lines[at + 3] == "| graph-heavy | 1.00x / 1.00 | 2.60x / 0.72 | failed |"
    assert ("| mps | 2.88 (2.75 .. 3.00) | 5.75 (5.50 .. 6.00) | 11.50 (11.00 .. 12.00) | "
            "1.30x (1.10 .. 1.50) | 26.10 (25.20 .. 27.00) | 0.90 (0.90 .. 0.90) |") in lines
    assert "| priority-mps (failed 2x) | - | - | - | - | - | - |" in lines
    assert ("sync-light, priority-mps: the training held 400 times per run (1000 ms in all, "
            "0 let go by the floor); from the inference going busy to the hold: 30 us (median "
            "of the runs' medians)") in lines
    # wall time: alone is the 4 alone runs of each round; mps the two pairs' runs
    assert "| alone | 8 | 112 | 14.0 |" in lines
    assert "| mps | 4 | 120 | 30.0 |" in lines
    assert "| priority-mps | 4 | 60 | 15.0 |" in lines
    assert "| all | | 292 | |" in lines


def test_a_saved_run_reports_the_same_tables(tmp_path, capsys):
    data = _data()
    data["summary"] = bc.summarize(data["rounds"], data["pairs"], data["configs"])
    (tmp_path / "run.json").write_text(json.dumps(data))
    bc.main(["--report", str(tmp_path / "run.json")])
    assert capsys.readouterr().out == "\n".join(bc.report(data)) + "\n"


@pytest.mark.parametrize("content,said", [
    (None, "cannot read"), ("{", "is not JSON"), ('{"device": 1}', "no requests, gap_ms"),
    ("[]", "no device"),
    ('{"device": "", "requests": 1, "gap_ms": 1, "pairs": ["sync-light"], "configs": ["alone"],'
     ' "rounds": [1]}', "is not what bench_colocate --json writes (TypeError"),
])
def test_a_report_of_a_file_that_is_not_a_run_is_said(tmp_path, content, said):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as e:
        bc.main(["--report", str(path)])
    assert said in str(e.value.code)


# ---- a whole run, over stand-ins for the two programs -------------------------------------

@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """main() over FAKE_INFER and FAKE_TRAIN: a PyTorch module that is never used, no
    nvidia-smi, no MPS daemon."""
    fake = _args(tmp_path)

    def programs(service, training, args):
        return types.SimpleNamespace(infer=fake.infer, train=fake.train, clc_run=args.clc_run,
                                     run_ahead=args.run_ahead)

    @contextlib.contextmanager
    def no_mps(tmp, name, daemon_env=None):
        raise bc.MpsUnavailable("nvidia-cuda-mps-control not found")
        yield

    monkeypatch.setattr(bc, "programs", programs)
    monkeypatch.setattr(bc, "mps_daemon", no_mps)
    monkeypatch.setattr(bc, "device_name", lambda: "a stand-in")
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    return tmp_path


def test_a_run_writes_its_figures_and_prints_them(stand_ins, capsys):
    out = stand_ins / "run.json"
    with pytest.raises(SystemExit) as e:
        bc.main(["--pairs", "sync-light,graph-heavy", "--configs", "shared,mps", "--rounds",
                 "2", "--requests", "30", "--json", str(out)])
    assert e.value.code == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (data["pairs"], data["configs"]) == (["sync-light", "graph-heavy"],
                                                ["alone", "shared", "mps"])
    assert len(data["rounds"]) == 2
    assert data["rounds"][0]["pairs"]["graph-heavy"]["shared"]["infer"]["n"] == 4
    assert set(data["rounds"][1]["alone"]["training"]) == {"light", "heavy"}
    assert data["notes"] == ["round 1: MPS configurations left out: nvidia-cuda-mps-control "
                             "not found", "round 2: MPS configurations left out: "
                             "nvidia-cuda-mps-control not found"]
    assert data["summary"]["sync-light"]["shared"]["p99_vs_alone"] == [1.0, 1.0, 1.0]
    # the tables printed are those of the file
    assert printed.endswith("\n".join(bc.report(data)) + "\n")
    assert "| graph-heavy | 1.00x / " in printed and " | - |" in printed


def test_an_existing_json_is_refused_before_anything_runs(stand_ins, monkeypatch):
    out = stand_ins / "run.json"
    out.write_text("earlier figures\n")
    monkeypatch.setattr(bc, "run_round", lambda *a: pytest.fail("ran"))
    with pytest.raises(SystemExit) as e:
        bc.main(["--quick", "--json", str(out)])
    assert "run.json exists (use --force to overwrite it)" in str(e.value.code)
    os.symlink(stand_ins / "elsewhere.json", stand_ins / "link.json")
    with pytest.raises(SystemExit) as e:
        bc.main(["--quick", "--json", str(stand_ins / "link.json"), "--force"])
    assert "is a symbolic link" in str(e.value.code)
    assert out.read_text() == "earlier figures\n"
    assert not (stand_ins / "elsewhere.json").exists()


def test_a_run_cut_short_keeps_what_it_measured(stand_ins, monkeypatch):
    out = stand_ins / "run.json"
    runs = []
    measured = bc.measured

    def cut_after_two(r, name, target, args, tmp, mps_env, gpu_env=None):
        if len(runs) == 2:
            raise KeyboardInterrupt  # as a time limit's signal would end it
        runs.append((name, target))
        return measured(r, name, target, args, tmp, mps_env, gpu_env)

    monkeypatch.setattr(bc, "measured", cut_after_two)
    with pytest.raises(KeyboardInterrupt):
        bc.main(["--pairs", "copy-light", "--configs", "shared", "--requests", "30", "--json",
                 str(out)])
    data = json.loads(out.read_text())
    assert runs == [("alone-service", "copy"), ("alone-training", "light")]
    assert data["rounds"][0]["alone"]["service"]["copy"]["infer"]["n"] == 4
    assert data["rounds"][0]["pairs"] == {"copy-light": {}}


def test_pairs_run_on_several_gpus_at_once_each_against_its_own_alone_runs(stand_ins,
                                                                          monkeypatch):
    # GIVEN stand-ins that say which GPU they were given, and an MPS daemon per GPU
    seen, daemons = [], []
    real_run_config = bc.run_config

    def on_gpu(name, target, args, tmp, mps_env, gpu_env=None):
        seen.append((name, target, (gpu_env or {}).get("CUDA_VISIBLE_DEVICES"),
                     bool(mps_env)))
        return real_run_config(name, target, args, tmp, mps_env, gpu_env)

    @contextlib.contextmanager
    def one_daemon_per_gpu(tmp, name, daemon_env=None):
        daemons.append((name, dict(daemon_env or {})))
        yield {"CUDA_MPS_PIPE_DIRECTORY": str(tmp / f"{name}-pipe")}

    monkeypatch.setattr(bc, "run_config", on_gpu)
    monkeypatch.setattr(bc, "mps_daemon", one_daemon_per_gpu)
    out = stand_ins / "run.json"
    # WHEN three pairs run on two GPUs
    with pytest.raises(SystemExit) as e:
        bc.main(["--pairs", "sync-light,copy-heavy,graph-light", "--configs", "shared,mps",
                 "--requests", "30", "--rounds", "1", "--gpus", "2", "--json", str(out)])
    assert e.value.code == 0
    data = json.loads(out.read_text())
    (rnd,) = data["rounds"]
    # THEN each pair ran every run on one GPU, dealt out in turn, its alone runs there too
    assert rnd["gpu_of"] == {"sync-light": 0, "graph-light": 0, "copy-heavy": 1}
    gpu_of_run = {(n, t): g for n, t, g, _ in seen}
    assert gpu_of_run[("shared", "copy-heavy")] == "1"
    assert gpu_of_run[("alone-service", "copy")] == "1"
    assert gpu_of_run[("alone-training", "light")] == "0"
    assert {g for (n, t), g in gpu_of_run.items() if t in ("sync-light", "graph-light")} == {"0"}
    # AND each GPU had an MPS daemon of its own, serving that GPU alone
    assert sorted(daemons) == [("mps0-gpu0", {"CUDA_VISIBLE_DEVICES": "0"}),
                               ("mps0-gpu1", {"CUDA_VISIBLE_DEVICES": "1"})]
    assert set(rnd["alone_by_pair"]) == {"sync-light", "copy-heavy", "graph-light"}
    assert rnd["alone"]["service"].keys() == {"sync@gpu0", "graph@gpu0", "copy@gpu1"}
    assert data["summary"]["copy-heavy"]["mps"]["p99_vs_alone"] == [1.0, 1.0, 1.0]
    assert "### copy-heavy: the `copy` service beside the `heavy` training (GPU 1)" in \
        bc.report(data)


def test_runs_split_over_commands_are_reported_together(tmp_path, capsys):
    # GIVEN two runs of the same requests, one with a configuration the other lacks
    a, b = _data(), _data()
    b["configs"] = [*b["configs"], "extra"]
    for rnd in b["rounds"]:
        for runs in rnd["pairs"].values():
            runs["extra"] = next(iter(runs.values()))
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    # WHEN both are reported at once
    bc.main(["--report", str(tmp_path / "a.json"), "--report", str(tmp_path / "b.json")])
    printed = capsys.readouterr().out
    # THEN the rounds of both count, and the configuration of one alone is there
    assert f"{len(a['rounds']) + len(b['rounds'])} interleaved rounds" in printed
    assert "| extra |" in printed
    # AND runs of other requests are refused
    b["requests"] = a["requests"] + 1
    (tmp_path / "b.json").write_text(json.dumps(b))
    with pytest.raises(SystemExit) as e:
        bc.main(["--report", str(tmp_path / "a.json"), "--report", str(tmp_path / "b.json")])
    assert "differ in requests" in str(e.value.code)
