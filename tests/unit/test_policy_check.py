# SPDX-License-Identifier: Apache-2.0
"""`clc policy check` and `clc policy explain` as an admin sees them: every error, warnings,
--strict, and the identity options."""

import pathlib

import pytest

from clc.cli.main import main
from clc.cli.run import load_policy_and_hooks
from clc.errors import ClcError

POLICIES = pathlib.Path(__file__).resolve().parents[2] / "policies"

THREE_ERRORS = """\
version: 1
default: maybe
rules:
  - match: {device: -1}
    action: deny
  - action: wrap
    wrapper: sm_share
    params: {share: .nan}
"""

WARNED = """\
version: 1
default: deny
rules:
  - name: all
    action: allow
  - name: never
    match: {kernel: "*debug*"}
    action: deny
    record: true
"""


@pytest.fixture
def files(tmp_path):
    """errors.yaml, warned.yaml and good.yaml in tmp_path: their paths as strings."""
    paths = {}
    for name, text in (("errors", THREE_ERRORS), ("warned", WARNED),
                       ("good", "version: 1\non_error: deny\ndefault: deny\n")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        paths[name] = str(path)
    return paths


def test_check_reports_every_error_of_a_file(files, capsys):
    # GIVEN a policy with three mistakes, and a good one
    # WHEN both are checked
    code = main(["policy", "check", files["errors"], files["good"]])
    out, err = capsys.readouterr()
    # THEN all three mistakes are printed with their positions, then how many there were
    bad = files["errors"]
    assert err.splitlines() == [
        f"{bad}:2:10: default must be 'allow' or 'deny', got the string 'maybe'",
        f"{bad}:4:21: device must not be negative, got -1",
        f"{bad}:8:21: params.share must be a finite number, got .nan",
        f"{bad}: 3 errors",
    ]
    # AND the good file is ok, and the status is 2
    assert out.splitlines() == [f"{files['good']}: ok (0 rules, default deny, on_error deny)"]
    assert code == 2


def test_check_prints_warnings_and_passes(files, capsys):
    # GIVEN a policy that loads with warnings
    # WHEN it is checked
    code = main(["policy", "check", files["warned"]])
    out, err = capsys.readouterr()
    # THEN each warning is printed with its position, the file is ok, and the status is 0
    path = files["warned"]
    assert [line.split(": warning: ")[0] for line in err.splitlines()] == [
        f"{path}:1:1", f"{path}:6:5", f"{path}:9:5"]
    assert "rule 'never' is never reached: rule 'all' (line 4)" in err.splitlines()[1]
    assert out == f"{path}: ok (2 rules, default deny, on_error allow, 3 warnings)\n"
    assert code == 0


def test_strict_check_fails_on_warnings(files, capsys):
    # GIVEN the same policy, and one without warnings
    # WHEN they are checked with --strict
    code = main(["policy", "check", "--strict", files["warned"], files["good"]])
    out, err = capsys.readouterr()
    # THEN the warned one fails, the other is ok, and the status is 2
    assert err.splitlines()[-1] == f"{files['warned']}: 3 warnings, which --strict makes errors"
    assert out.splitlines() == [f"{files['good']}: ok (0 rules, default deny, on_error deny)"]
    assert code == 2


def test_strict_check_passes_the_shipped_policies(capsys):
    # GIVEN the shipped policies
    paths = [str(path) for path in sorted(POLICIES.glob("*.yaml"))]
    # WHEN they are checked with --strict
    code = main(["policy", "check", "--strict", *paths])
    out, err = capsys.readouterr()
    # THEN every one is ok
    assert (code, err) == (0, "")
    assert [line.split(": ok (")[0] for line in out.splitlines()] == paths


def test_clc_run_refuses_a_policy_with_all_its_errors(files):
    # GIVEN the policy with three mistakes
    # WHEN clc-run loads it, before starting the program
    with pytest.raises(ClcError) as caught:
        load_policy_and_hooks(files["errors"], [])
    # THEN it is a usage error naming all three
    assert caught.value.exit_code == 2
    assert [line.split(": ")[0] for line in str(caught.value).splitlines()] == [
        f"{files['errors']}:2:10", f"{files['errors']}:4:21", f"{files['errors']}:8:21"]


def test_explain_takes_the_identity_to_explain(tmp_path, capsys):
    # GIVEN a policy that allows group 0 and user 0 only
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\ndefault: deny\non_error: deny\nrules:\n"
                    "  - name: root-group\n    match: {group: 0}\n    action: allow\n"
                    "  - name: root-user\n    match: {user: 0, cgroup: /batch/*}\n"
                    "    action: allow\n")
    argv = ["policy", "explain", str(path), "--kernel", "_Z1kv"]
    # WHEN a launch is explained as uid 0 outside group 0, in a batch cgroup
    code = main(argv + ["--user", "0", "--group", "12345", "--cgroup", "/batch/job1"])
    out = capsys.readouterr().out
    # THEN the identity given is shown, and the user rule decides
    assert code == 0
    assert "; groups " in out and "'12345'; cgroup '/batch/job1'" in out
    assert out.splitlines()[-1] == "=> allow by rule 'root-user'"
    # WHEN the same user is explained in another cgroup
    main(argv + ["--user", "0", "--group", "12345", "--cgroup", "/user.slice"])
    # THEN the default decides
    assert capsys.readouterr().out.splitlines()[-1] == "=> deny (CUDA_ERROR_NOT_PERMITTED) " \
                                                        "by default"


def test_explain_refuses_an_unknown_user_name(tmp_path, capsys):
    # GIVEN a policy
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\n")
    # WHEN a user name the machine does not know is given
    code = main(["policy", "explain", str(path), "--kernel", "k", "--user", "no-such-user-x"])
    # THEN it is a usage error that says so
    assert code == 2
    assert "no user named 'no-such-user-x' on this machine" in capsys.readouterr().err


def test_the_readmes_policy_examples_pass_the_check():
    # The quick start's policy file, and its wrap rules each as a policy of its own
    import re
    from pathlib import Path

    from clc.policy import parse_policy

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert len(blocks) == 3
    parse_policy(blocks[0], "README.md")
    for rule in blocks[1:]:
        parse_policy("version: 1\nrules:\n" + rule, "README.md")


HOOK_RULE = """\
version: 1
rules:
  - name: guarded
    match: {kernel: "*"}
    action: hook
    hook: hooks.py:missing
"""


def test_check_finds_a_hook_rule_that_clc_run_would_refuse(tmp_path, capsys):
    # GIVEN a hook rule naming a function its file lacks
    (tmp_path / "hooks.py").write_text("def guard(launch):\n    return None\n")
    policy = tmp_path / "p.yaml"
    policy.write_text(HOOK_RULE)
    # THEN clc policy check fails with the position of the hook, as clc-run does
    assert main(["policy", "check", str(policy)]) == 2
    err = capsys.readouterr().err
    assert f"{policy}:6:11: hook 'hooks.py:missing': has no function 'missing'" in err
    with pytest.raises(ClcError) as refused:
        load_policy_and_hooks(str(policy), [])
    assert f"{policy}:6:11: hook 'hooks.py:missing'" in str(refused.value)
    # AND with the function there, both accept it
    policy.write_text(HOOK_RULE.replace("missing", "guard"))
    assert main(["policy", "check", str(policy)]) == 0
    load_policy_and_hooks(str(policy), [])


def test_explain_says_a_program_scope_rule_confines_the_whole_process(tmp_path, capsys):
    # GIVEN a rule confining tenant b's processes
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nrules:\n  - name: tenant-b-half\n    match: {tenant: b}\n"
                    "    action: wrap\n    wrapper: sm_share\n"
                    "    params: {share: 0.5, scope: program}\n")
    # WHEN a kernel of tenant b is explained
    assert main(["policy", "explain", str(path), "--kernel", "gemm", "--tenant", "b"]) == 0
    # THEN the verdict says the whole process is confined, by its primary context
    assert ("=> wrap with sm_share(scope=program, share=0.5) by green context, the whole "
            "process as its primary context") in capsys.readouterr().out
