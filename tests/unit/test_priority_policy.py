# SPDX-License-Identifier: Apache-2.0
"""The policy's `priority:` section: what it accepts, what it refuses (file, line, what was
expected), how a process's class is found and explained, and the settings clc-run seals."""

import os
import pwd
import subprocess
import sys

import pytest

from clc.policy import Identity, KernelInfo, Policy, PolicyError, parse_policy
from clc.policy.model import BEST_EFFORT, DEFAULT_BOARD, LATENCY_CRITICAL
from clc.runtime.priority_class import priority_settings

GOOD = """\
version: 1
default: allow
priority:
  board: /run/clc/board
  idle_after_ms: 15
  classes:
    - name: serving
      class: latency-critical
      match: {process: "infer*", user: [alice, "1001"]}
    - name: training
      class: best-effort
      match: {tenant: batch}
      floor: 0.2
      run_ahead: 8
"""


def info(process="prog", tenant="", users=(), groups=()):
    return KernelInfo(mangled="", demangled="", device=0, process_names=(process,),
                      tenant=tenant, identity=Identity(users=tuple(users), groups=tuple(groups)))


def errors_of(text):
    with pytest.raises(PolicyError) as e:
        parse_policy(text, "p.yaml")
    return [f"{err.line}:{err.column}: {err.message}" for err in e.value.errors]


def test_a_priority_section_is_read_with_its_defaults():
    policy = parse_policy(GOOD, "p.yaml")
    serving, training = policy.priority.classes
    assert policy.priority.board == "/run/clc/board"
    assert policy.priority.idle_after_ms == 15.0
    assert (serving.name, serving.kind, serving.process, serving.user, serving.line) == \
        ("serving", LATENCY_CRITICAL, ("infer*",), ("alice", "1001"), 7)
    assert (training.kind, training.floor, training.run_ahead, training.tenant) == \
        (BEST_EFFORT, 0.2, 8, ("batch",))
    bare = parse_policy("version: 1\npriority:\n  classes:\n    - {name: b, class: best-effort}\n")
    assert bare.priority.board == DEFAULT_BOARD
    assert (bare.priority.idle_after_ms, bare.priority.classes[0].floor,
            bare.priority.classes[0].run_ahead) == (20.0, 0.1, 32)
    assert parse_policy("version: 1\n").priority is None
    assert bare.priority.mps == "off"
    start = parse_policy(GOOD.replace("  idle_after_ms: 15\n",
                                      "  idle_after_ms: 15\n  mps: start\n"))
    assert start.priority.mps == "start"
    slo = parse_policy("version: 1\npriority:\n  classes:\n"
                       "    - {name: s, class: latency-critical, slo: 1.1}\n")
    assert slo.priority.classes[0].slo == 1.1
    assert slo.priority.classes[0].describe() == \
        "'s' (latency-critical: p99 at most 1.1x its p99 while best-effort work is held)"
    assert Policy.from_json(slo.to_json()).priority == slo.priority
    assert Policy.from_json(start.to_json()).priority == start.priority


def test_the_section_survives_the_trip_to_the_program():
    policy = parse_policy(GOOD, "p.yaml")
    assert Policy.from_json(policy.to_json()).priority == policy.priority


def test_the_first_class_that_holds_is_the_process_class():
    priority = parse_policy(GOOD, "p.yaml").priority
    assert priority.class_of(info("infer.py", users=("alice",))).name == "serving"
    assert priority.class_of(info("infer.py", users=("bob",))) is None
    assert priority.class_of(info("train.py", tenant="batch")).name == "training"
    assert priority.class_of(info("infer.py", tenant="batch", users=("1001",))).name == "serving"


def test_explain_walks_the_classes():
    priority = parse_policy(GOOD, "p.yaml").priority
    lines = priority.explain(info("train.py", tenant="batch"))
    assert lines[1].startswith("  1. serving: no match: process glob 'infer*' does not match")
    assert lines[2] == "  2. training: match: tenant glob 'batch' matches 'batch'"
    assert lines[3].startswith("=> class 'training' (best-effort: held while")
    assert "never for more than 80% of any 100 ms" in lines[3]
    assert priority.explain(info("x"))[-1].startswith("=> no class")


@pytest.mark.parametrize("section, expected", [
    ("priority: [1]", "3:11: priority must be a mapping with 'classes'"),
    ("priority: {board: /b}", "3:11: priority has no 'classes'"),
    ("priority: {classes: []}", "3:21: classes must not be an empty list"),
    ("priority: {board: rel, classes: [{name: a, class: best-effort}]}",
     "3:19: board must be an absolute path"),
    ("priority: {idle_after_ms: -1, classes: [{name: a, class: best-effort}]}",
     "3:27: idle_after_ms must be more than 0 and at most 10000, got -1"),
    ("priority: {classes: [{name: a, class: best}]}",
     "3:39: unknown class 'best' (expected one of: latency-critical, best-effort)"),
    ("priority: {classes: [{name: a}]}",
     "3:22: class 'a' has no 'class' (expected latency-critical or best-effort)"),
    ("priority: {classes: [{class: best-effort}]}", "3:22: class 1 has no 'name'"),
    ("priority: {classes: [{name: a, class: best-effort, floor: 0}]}",
     "3:59: floor must be at least 0.001 (a best-effort process held without a floor could "
     "starve) and at most 1, got 0"),
    ("priority: {classes: [{name: a, class: best-effort, run_ahead: 1000}]}",
     "3:63: run_ahead must be at most 256, got 1000"),
    ("priority: {classes: [{name: a, class: best-effort, run_ahead: 2}]}",
     "3:63: run_ahead must be at least 4, got 2"),
    ("priority: {classes: [{name: a, class: latency-critical, floor: 0.5}]}",
     "3:57: 'floor' is only allowed on a best-effort class (class 'a' is latency-critical)"),
    ("priority: {classes: [{name: a, class: best-effort, match: {kernel: k}}]}",
     "3:60: unknown key 'kernel' in the match of class 'a' (a class holds for whole "
     "processes: it may match only process, tenant, user, group, cgroup)"),
    ("priority: {classes: [{name: a, class: best-effort}, {name: a, class: best-effort}]}",
     "3:60: duplicate class name 'a' (first used at line 3)"),
    ("priority: {classes: [{name: a, class: best-effort, weight: 2}]}",
     "3:52: unknown key 'weight' in class 1"),
    ("priority: {classes: [{name: a, class: best-effort, slo: 1.2}]}",
     "3:52: 'slo' is only allowed on a latency-critical class (class 'a' is best-effort)"),
    ("priority: {classes: [{name: a, class: latency-critical, slo: 1}]}",
     "3:62: slo must be more than 1 (the p99 of its busy periods against their p99 while "
     "best-effort work is held) and at most 10, got 1"),
    ("priority: {mps: auto, classes: [{name: a, class: best-effort}]}",
     "3:17: mps must be off, join or start (whether clc-run joins or starts this user's MPS "
     "control daemon), got the string 'auto'"),
])
def test_mistakes_are_named_with_their_place(section, expected):
    found = errors_of(f"version: 1\ndefault: allow\n{section}\n")
    assert any(e.startswith(expected) for e in found), found


def test_a_class_without_a_match_hides_the_classes_after_it():
    policy = parse_policy("version: 1\npriority:\n  classes:\n"
                          "    - {name: all, class: best-effort}\n"
                          "    - {name: late, class: latency-critical, match: {tenant: t}}\n",
                          "p.yaml")
    (warning,) = policy.warnings
    assert (warning.line, warning.message) == (
        5, "class 'late' is never reached: class 'all' (line 4) has no match, so every "
           "process is of that class")


def test_clc_run_seals_the_class_of_the_command_it_starts():
    policy = parse_policy(GOOD, "p.yaml")
    assert priority_settings(policy, ["/usr/bin/train.py"], "batch") == {
        "CLC_PRIORITY": "be", "CLC_PRIORITY_NAME": "training",
        "CLC_PRIORITY_BOARD": "/run/clc/board", "CLC_PRIORITY_IDLE_MS": "15.0",
        "CLC_PRIORITY_FLOOR": "0.2", "CLC_PRIORITY_RUN_AHEAD": "8",
        # the users the latency-critical classes name: by number, and by name when known
        "CLC_PRIORITY_TRUST": ",".join(f"u{u}" for u in sorted(
            {1001} | {e.pw_uid for e in pwd.getpwall() if e.pw_name == "alice"})),
    }
    assert priority_settings(policy, ["/usr/bin/train.py"], "other") == {}
    assert priority_settings(parse_policy("version: 1\n"), ["x"], "") == {}


def test_the_process_name_is_the_command_clc_run_starts(tmp_path):
    policy = parse_policy(GOOD.replace("match: {process: \"infer*\", user: [alice, \"1001\"]}",
                                       "match: {process: \"infer*\"}"), "p.yaml")
    script = tmp_path / "infer.py"
    script.write_text("")
    got = priority_settings(policy, [sys.executable, str(script)], "")
    assert got["CLC_PRIORITY"] == "lc" and "CLC_PRIORITY_TRUST" not in got


def test_policy_check_counts_the_classes(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    out = subprocess.run([sys.executable, "-m", "clc", "policy", "check", str(path)],
                         capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert "ok (0 rules, 2 priority classes, default allow" in out.stdout


def test_held_share_confines_held_launches_instead_of_holding_them():
    text = ("version: 1\npriority:\n  classes:\n"
            "    - {name: b, class: best-effort, held_share: 0.25}\n")
    (c,) = parse_policy(text, "p.yaml").priority.classes
    assert c.held_share == 0.25
    assert "held to 0.25 of the SMs, the device's last ones" in c.describe()
    got = priority_settings(parse_policy(text, "p.yaml"), ["x"], "")
    assert got["CLC_PRIORITY_HELD_SHARE"] == "0.25"
    waits = "version: 1\npriority:\n  classes:\n    - {name: b, class: best-effort}\n"
    assert "CLC_PRIORITY_HELD_SHARE" not in priority_settings(parse_policy(waits), ["x"], "")
    assert errors_of(text.replace("0.25", "1")) == [
        "4:49: held_share must be at least 0 (0: held launches wait) and less than 1, got 1"]
    assert errors_of(text.replace("best-effort, held_share: 0.25",
                                  "latency-critical, held_share: 0.5"))[0].endswith(
        "'held_share' is only allowed on a best-effort class (class 'b' is latency-critical)")
    warned = parse_policy(text.replace("}", ", floor: 0.2}"), "p.yaml")
    (warning,) = warned.warnings
    assert warning.message == ("floor on class 'b' has no effect: with held_share its held "
                               "launches run on a share of the SMs, they do not wait")


def test_a_reserve_leaves_a_share_of_the_sms_free_while_latency_critical_work_lives():
    text = ("version: 1\npriority:\n  classes:\n"
            "    - {name: b, class: best-effort, reserve: 0.25}\n")
    (c,) = parse_policy(text, "p.yaml").priority.classes
    assert c.reserve == 0.25 and c.held_share == 0
    assert "0.25 of the SMs left free while latency-critical work lives on its GPU" in \
        c.describe()
    got = priority_settings(parse_policy(text, "p.yaml"), ["x"], "")
    assert got["CLC_PRIORITY_RESERVE"] == "0.25"
    waits = "version: 1\npriority:\n  classes:\n    - {name: b, class: best-effort}\n"
    assert "CLC_PRIORITY_RESERVE" not in priority_settings(parse_policy(waits), ["x"], "")
    assert errors_of(text.replace("0.25", "1")) == [
        "4:46: reserve must be at least 0 (0: none) and less than 1, got 1"]
    assert errors_of(text.replace("best-effort, reserve: 0.25",
                                  "latency-critical, reserve: 0.5"))[0].endswith(
        "'reserve' is only allowed on a best-effort class (class 'b' is latency-critical)")
    (warning,) = parse_policy(text.replace("}", ", held_share: 0.8}"), "p.yaml").warnings
    assert warning.message.startswith("held_share on class 'b' is more than the 0.75 of the SMs")
    assert not parse_policy(text.replace("}", ", held_share: 0.5}"), "p.yaml").warnings


def test_groups_are_trusted_through_their_members(monkeypatch):
    import grp
    import pwd

    def user(name, uid, gid):
        return pwd.struct_passwd((name, "x", uid, gid, "", "/", "/bin/sh"))
    users = [user("ann", 2001, 3000), user("bob", 2002, 3001), user("cat", 2003, 3002)]
    group = grp.struct_group(("svc", "x", 3001, ["ann"]))
    monkeypatch.setattr(pwd, "getpwall", lambda: users)
    monkeypatch.setattr(pwd, "getpwnam", lambda n: next(u for u in users if u.pw_name == n))
    monkeypatch.setattr(grp, "getgrall", lambda: [group])
    monkeypatch.setattr(grp, "getgrnam", lambda n: group if n == "svc" else None)
    policy = parse_policy("version: 1\npriority:\n  classes:\n"
                          "    - {name: s, class: latency-critical, match: {group: [svc]}}\n"
                          "    - {name: b, class: best-effort}\n", "p.yaml")
    # ann is a listed member, bob's primary group is svc; cat is neither
    assert priority_settings(policy, ["x"], "")["CLC_PRIORITY_TRUST"] == "u2001,u2002"


def test_too_many_trusted_users_is_an_error(monkeypatch):
    import pwd
    users = [pwd.struct_passwd((f"u{i}", "x", 5000 + i, 5000, "", "/", "/bin/sh"))
             for i in range(300)]
    monkeypatch.setattr(pwd, "getpwall", lambda: users)
    policy = parse_policy("version: 1\npriority:\n  classes:\n"
                          "    - {name: s, class: latency-critical, match: {user: ['u*']}}\n"
                          "    - {name: b, class: best-effort}\n", "p.yaml")
    from clc.errors import ClcError
    with pytest.raises(ClcError, match="name 300 users; a best-effort process reads the board "
                                       "slots of at most 254"):
        priority_settings(policy, ["x"], "")


def test_an_slo_is_sealed_for_the_latency_critical_process_only():
    text = ("version: 1\npriority:\n  classes:\n"
            "    - {name: s, class: latency-critical, slo: 1.1}\n")
    got = priority_settings(parse_policy(text, "p.yaml"), ["x"], "")
    assert got["CLC_PRIORITY"] == "lc" and got["CLC_PRIORITY_SLO"] == "1.1"
    bare = text.replace(", slo: 1.1", "")
    assert "CLC_PRIORITY_SLO" not in priority_settings(parse_policy(bare), ["x"], "")
