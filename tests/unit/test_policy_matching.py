# SPDX-License-Identifier: Apache-2.0
"""The policy format: matching: kernel_regex, and the process's identity (user, group, cgroup)."""

import os
import random
import re
import subprocess
import sys
import textwrap

import pytest

from clc import abi
from clc.policy import (
    KernelInfo, Policy,
    parse_policy,
)

from policy_cases import REPO, TEMPLATE_BASE, kernel, policy


# ---- kernel_regex -------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, names", [
    ("gemm_.*_f16$", {"gemm_tn_f16": True, "gemm_tn_f16x": False, "xgemm_nn_f16": True}),
    ("^(sgemm|dgemm)", {"sgemm_128": True, "dgemm": True, "hgemm": False, "my_sgemm": False}),
    ("[a-z]+_kernel", {"add_kernel": True, "_kernel": False, "ADD_kernel": False}),
    ("(?i)^VecAdd\\b", {"vecadd": True, "VECADD_2": False, "vecAdd": True}),
    ("^at::native::\\w+<4,", {TEMPLATE_BASE: True, "at::native::x<8, 4>": False}),
])
def test_ordinary_regexes_match_as_in_python(pattern, names):
    # GIVEN a deny rule with an ordinary kernel_regex
    loaded = parse_policy(f"version: 1\non_error: deny\nrules:\n"
                          f"  - match: {{kernel_regex: '{pattern}'}}\n    action: deny\n")
    for name, denied in names.items():
        # WHEN a kernel of that name is decided
        outcome = loaded.decide(kernel(name, name)).fallback
        # THEN the rule matches exactly when re.search finds the pattern
        assert (outcome.rule == 0) is denied is (re.search(pattern, name) is not None)


def test_backtracking_regex_is_checked_and_decided_quickly():
    # GIVEN '^(a+)+$', which re.search takes exponential time on, and a long name of a's that
    # does not match it
    code = textwrap.dedent("""\
        from clc.policy import KernelInfo, parse_policy
        loaded = parse_policy("version: 1\\nrules:\\n  - match: {kernel_regex: '^(a+)+$'}\\n"
                              "    action: deny\\n")
        for name in ("a" * 100_000 + "b", "a" * 100_000):
            print(loaded.decide(KernelInfo(name, name, 0)).fallback.rule)
        """)
    # WHEN the policy is checked and the kernels decided, in a process that may be killed
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=60)
    # THEN it finishes: the first falls to the default, the second is denied by the rule
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(abi.RULE_DEFAULT), "0"]


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", "_", ".", "[ab]", "[^a]", "[a-c_]", "\\w", "\\W", "\\d", "\\s", "\\b",
             "\\B", "^", "$", "\\A", "\\Z", "A", "\\.", "[]a]", "\\n", "1", "[\\d_]", "\\x61"]
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice(atoms)
    if roll < 0.6:
        return "".join(random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3)))
    if roll < 0.75:
        return "(" + rng.choice(["", "?:", "?P<g>"]) + "|".join(
            random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3))) + ")"
    inner = random_pattern(rng, depth + 1)
    return f"({inner})" + rng.choice(["*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}", "*?", "{}"])


def test_regexes_find_what_python_finds():
    # GIVEN random regexes of every construct clc supports, with and without flags, and names
    from clc.policy.regex import _regex
    rng = random.Random(7)
    compared = 0
    for _ in range(1500):
        pattern = rng.choice(["", "", "(?i)", "(?m)", "(?s)", "(?a)"]) + random_pattern(rng)
        try:
            expected = re.compile(pattern)
        except re.error:
            continue
        for name in ["", "a", "ab", "A_b", "a\n", "\nb", "é1", "x.y z"] + [
                "".join(rng.choice("abA_\n.1 ") for _ in range(rng.randint(0, 8)))
                for _ in range(4)]:
            # WHEN clc searches each name
            # THEN it finds the pattern exactly when re.search does
            assert _regex(pattern).search(name) is (expected.search(name) is not None), \
                (pattern, name)
            compared += 1
    assert compared > 5000


# ---- identity: user, group, cgroup -------------------------------------------------------------

PASSWD = {1000: "alice", 0: "root"}
GROUPS = {1000: "alice", 44: "video", 0: "root"}


@pytest.fixture
def identity_db(monkeypatch):
    """A user and group database holding PASSWD and GROUPS."""
    import grp
    import pwd

    def user(uid):
        if uid not in PASSWD:
            raise KeyError(f"getpwuid(): uid not found: {uid}")
        return pwd.struct_passwd((PASSWD[uid], "x", uid, uid, "", "/", "/bin/sh"))

    def group(gid):
        if gid not in GROUPS:
            raise KeyError(f"getgrgid(): gid not found: {gid}")
        return grp.struct_group((GROUPS[gid], "x", gid, []))

    monkeypatch.setattr(pwd, "getpwuid", user)
    monkeypatch.setattr(grp, "getgrgid", group)


def test_process_identity_comes_from_the_kernel(identity_db, monkeypatch, tmp_path):
    # GIVEN a process of uid 1000 with groups 1000, 44 and 4242 (no name), in a cgroup, and
    # environment variables that claim to be root
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    monkeypatch.setattr(os, "getgroups", lambda: [44, 1000, 4242])
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("12:cpu,cpuacct:/v1/ignored\n0::/user.slice/user-1000.slice/s-3.scope\n")
    monkeypatch.setattr("clc.policy.names._PROC_CGROUP", str(cgroup))
    for name in ("USER", "LOGNAME", "CLC_TENANT"):
        monkeypatch.setenv(name, "root")
    # WHEN its identity is read
    from clc.policy import Identity, process_identity
    identity = process_identity()
    # THEN names and ids come from the ids the kernel gives, the path from the v2 line
    assert identity == Identity(users=("alice", "1000"),
                                groups=("alice", "1000", "video", "44", "4242"),
                                cgroup="/user.slice/user-1000.slice/s-3.scope")


def test_process_identity_of_a_set_user_id_program_without_cgroup_v2(identity_db, monkeypatch,
                                                                     tmp_path):
    # GIVEN a set-user-ID root program run by uid 1000, on a machine with cgroup v1 only
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "getgid", lambda: 5000)
    monkeypatch.setattr(os, "getegid", lambda: 5000)
    monkeypatch.setattr(os, "getgroups", lambda: [])
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("12:cpu,cpuacct:/\n1:name=systemd:/user.slice\n")
    monkeypatch.setattr("clc.policy.names._PROC_CGROUP", str(cgroup))
    # WHEN its identity is read
    from clc.policy import process_identity
    identity = process_identity()
    # THEN both users count, the group without a name is its id, and there is no cgroup
    assert (identity.users, identity.groups, identity.cgroup) == (
        ("alice", "1000", "root", "0"), ("5000",), None)
    # AND without /proc/self/cgroup there is none either
    monkeypatch.setattr("clc.policy.names._PROC_CGROUP", str(tmp_path / "absent"))
    assert process_identity().cgroup is None


IDENTITY_RULES = """\
    version: 1
    on_error: deny
    rules:
      - name: alice
        match: {user: alice}
        action: deny
        error: 1
      - name: service-uid
        match: {user: 990}
        action: deny
        error: 2
      - name: video
        match: {group: [44, "gpu-*"]}
        action: deny
        error: 3
      - name: batch
        match: {cgroup: "/system.slice/slurmstepd.scope/*"}
        action: deny
        error: 4
    """


def with_identity(users=(), groups=(), cgroup=None) -> KernelInfo:
    from clc.policy import Identity
    return KernelInfo("_Z6vecAddPKfS0_Pfi", "vecAdd(float const*, float const*, float*, int)",
                      0, ("a.out",), "", Identity(tuple(users), tuple(groups), cgroup))


@pytest.mark.parametrize("identity, rule", [
    (dict(users=("alice", "1000")), 0),
    (dict(users=("bob", "1001"), groups=("bob", "1001")), abi.RULE_DEFAULT),
    (dict(users=("svc", "990")), 1),
    (dict(users=("990x",)), abi.RULE_DEFAULT),
    (dict(users=("bob", "1001"), groups=("bob", "1001", "video", "44")), 2),
    (dict(users=("bob", "1001"), groups=("gpu-users", "2000")), 2),
    (dict(users=("bob", "1001"), cgroup="/system.slice/slurmstepd.scope/job_7/step_0"), 3),
    (dict(users=("bob", "1001"), cgroup="/user.slice/system.slice/slurmstepd.scope/x"),
     abi.RULE_DEFAULT),
    (dict(), abi.RULE_DEFAULT),
])
def test_identity_keys_match(identity, rule):
    # GIVEN rules on a user name, a numeric uid, groups and a cgroup
    loaded = policy(IDENTITY_RULES)
    # WHEN a kernel of a process with this identity is decided
    outcome = loaded.decide(with_identity(**identity)).fallback
    # THEN the expected rule decides
    assert outcome.rule == rule


def test_identity_keys_are_explained():
    # GIVEN the identity rules and a process of bob in group video, and one of unknown identity
    loaded = policy(IDENTITY_RULES)
    known = loaded.explain(with_identity(("bob", "1001"), ("bob", "1001", "video", "44"),
                                         "/user.slice"))
    unknown = loaded.explain(with_identity())
    # THEN each step says what was matched against what
    assert [s.reason for s in known.steps[:3]] == [
        "user glob 'alice' does not match 'bob', '1001'",
        "user glob '990' does not match 'bob', '1001'",
        "group glob '44' matches '44'",
    ]
    assert [s.reason for s in unknown.steps] == [
        "user glob 'alice' does not match (no user known)",
        "user glob '990' does not match (no user known)",
        "group globs '44', 'gpu-*' do not match (no group known)",
        "cgroup glob '/system.slice/slurmstepd.scope/*' does not match (no cgroup v2 path)",
    ]
    # AND the identity is shown under the process
    assert known.format().splitlines()[4] == (
        "user 'bob', '1001'; groups 'bob', '1001', 'video', '44'; cgroup '/user.slice'")
    assert not any(line.startswith("user ") for line in unknown.format().splitlines())


def test_identity_rules_round_trip_through_json():
    # GIVEN the identity rules
    loaded = policy(IDENTITY_RULES)
    assert loaded.rules[1].user == ("990",) and loaded.rules[2].group == ("44", "gpu-*")
    # WHEN they go to JSON and back
    again = Policy.from_json(loaded.to_json())
    # THEN they are the same and decide the same
    assert again == loaded
    info = with_identity(("bob", "1001"), ("gpu-a",))
    assert again.decide(info) == loaded.decide(info)
