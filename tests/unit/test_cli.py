# SPDX-License-Identifier: Apache-2.0
"""CLI parsing: the `--` form and the bare form, default names, option errors."""

import argparse
import pathlib

import pytest

from clc.cli.main import build_parser, main
from clc.cli.policy import parse_dim3
from clc.cli.run import RunCommand, capture_files, default_output, split_program
from clc.errors import ClcError


def parse_run(argv):
    parser = argparse.ArgumentParser(prog="clc-run")
    RunCommand.add_arguments(parser)
    args = parser.parse_args(argv)
    return args, split_program(args.program)


def test_double_dash_form_separates_program_options():
    # GIVEN options after `--` that clc-run also has
    args, program = parse_run(["--policy", "p.yaml", "-o", "x.clc", "--", "./app", "-o", "y", "-v"])
    # THEN they belong to the program
    assert args.policy == "p.yaml" and args.output == "x.clc" and not args.verbose
    assert program == ["./app", "-o", "y", "-v"]


def test_bare_form_starts_program_at_first_positional():
    args, program = parse_run(["--force", "python", "train.py", "--force"])
    assert args.force
    assert program == ["python", "train.py", "--force"]


def test_no_program_is_a_usage_error(capsys):
    # WHEN clc-run is given options and no program
    code = main(["run", "--policy", "policies/audit.yaml"])
    # THEN it says how to call it, with the usage exit status
    assert code == 2
    assert "no program given" in capsys.readouterr().err


def test_default_output_is_named_after_program_and_pid():
    path = default_output("/usr/bin/python3.12", 4242)
    assert path.name == "clc-python3.12.4242.clc"
    assert path.is_absolute()
    assert default_output("./my app!", 7).name == "clc-my_app_.7.clc"


def test_capture_files_finds_children_and_reexecuted_images(tmp_path):
    main_file = tmp_path / "cap.clc"
    for name in ("cap.clc", "cap.child-12.clc", "cap.clc.1", "other.clc"):
        (tmp_path / name).write_bytes(b"")
    found = [p.name for p in capture_files(main_file)]
    assert found == ["cap.clc", "cap.child-12.clc", "cap.clc.1"]


@pytest.mark.parametrize("text,expected", [("256", (256, 1, 1)), ("8,4", (8, 4, 1)),
                                           ("2,3,4", (2, 3, 4))])
def test_parse_dim3(text, expected):
    assert parse_dim3(text) == expected


@pytest.mark.parametrize("text", ["", "0", "1,2,3,4", "a", "-1"])
def test_parse_dim3_rejects(text):
    with pytest.raises(ClcError) as e:
        parse_dim3(text)
    assert e.value.exit_code == 2


def test_subcommands_are_registered():
    parser = build_parser()
    for argv in (["report", "x.clc"], ["policy", "check", "p.yaml"], ["doctor"],
                 ["run", "--", "true"],
                 ["policy", "explain", "p.yaml", "--kernel", "k", "--grid", "1,2"]):
        args = parser.parse_args(argv)
        assert args.command == argv[0]


def test_policy_check_reports_each_file(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\ndefault: allow\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ndefualt: allow\n")
    # WHEN one good and one bad file are checked
    code = main(["policy", "check", str(good), str(bad)])
    out, err = capsys.readouterr()
    # THEN the good one is ok, the bad one is named with its position, and the status is 2
    assert code == 2
    assert f"{good}: ok" in out
    assert f"{bad}:2:1:" in err


def test_policy_explain_names_deciding_rule(capsys):
    policy = pathlib.Path(__file__).resolve().parents[2] / "policies" / "deny-example.yaml"
    code = main(["policy", "explain", str(policy), "--kernel", "_Z12debug_kernelPi"])
    assert code == 0
    assert "deny" in capsys.readouterr().out


def test_report_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "trace.json"
    out.write_text("{}")
    code = main(["report", str(tmp_path / "missing.clc"), "-o", str(out)])
    assert code == 2
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == "{}"


def test_report_of_a_missing_file_is_a_clear_error(tmp_path, capsys):
    code = main(["report", str(tmp_path / "missing.clc")])
    assert code == 2
    assert "missing.clc" in capsys.readouterr().err


def test_clc_run_says_its_version(capsys):
    import clc
    from clc.cli.run import main as run_main

    with pytest.raises(SystemExit) as e:
        run_main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"clc-run {clc.__version__}"
