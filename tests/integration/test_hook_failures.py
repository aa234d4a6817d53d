# SPDX-License-Identifier: Apache-2.0
"""Python hooks that fail, in real processes over the fake driver: a hook that raises, a hook
file that does not import."""

import re
import sys

import pytest

from hook_runs import ALLOW_ALL, COUNT, DEBUG, STRUCT, VECADD, logged, ok, rcs, write_hooks


# ---- (d) a hook that raises --------------------------------------------------------------------

@pytest.mark.parametrize("on_error, expect", [("allow", 0), ("deny", 800)])
@pytest.mark.parametrize("mode", ["", "every_launch=True"])
def test_hook_exception_gives_on_error(run_params, tmp_path, on_error, expect, mode):
    # GIVEN a hook that raises for debug kernels
    hooks = write_hooks(tmp_path, f"""\
        @clc.on_launch(kernel="*debug*"{", " + mode if mode else ""})
        def explode_on_debug(launch):
            raise ValueError("boom from a hook")
    """)
    policy = f"version: 1\ndefault: allow\non_error: {on_error}\n"
    run = run_params(policy, [hooks])
    # THEN the program runs to the end
    ok(run)
    # AND the debug launches get the policy's on_error, the others run
    assert rcs(run, DEBUG) == [expect] * 3
    assert rcs(run, VECADD) == [0] * (2 * COUNT) and rcs(run, STRUCT) == [0] * 2
    assert run.fake_counts()[DEBUG] == (3 if expect == 0 else 0)
    # AND the failure is reported once, with the hook's name and the traceback (clc-run's
    # summary at exit lists it again among the capture's messages, without the traceback)
    assert run.stderr.count("Traceback (most recent call last)") == 1, run.stderr
    assert re.findall(r"^ValueError: boom from a hook$", run.stderr, re.M) == \
        ["ValueError: boom from a hook"], run.stderr
    assert re.search(r"^clc: .*explode_on_debug.*boom from a hook", run.stderr, re.M), run.stderr
    assert f'File "{hooks}", line' in run.stderr  # the traceback's frame in the hook file


# (mode, policy default, on_error, what debug_kernel's launches return). An every_launch hook
# followed by an allowing default is called through the engine's folded dispatcher; before a
# deny default, through its generic one, and there on_error: allow is what tells the two
# outcomes apart.
ENDING_HOOKS = {
    "cached": ("", "allow", "deny", 800),
    "per_shape": ("per_shape=True", "allow", "deny", 800),
    "every_launch": ("every_launch=True", "allow", "deny", 800),
    "every_launch_generic": ("every_launch=True", "deny", "allow", 0),
}


@pytest.mark.parametrize("how", sorted(ENDING_HOOKS))
def test_hook_that_calls_sys_exit_is_a_hook_failure(run_params, tmp_path, how):
    mode, default, on_error, expect = ENDING_HOOKS[how]
    # GIVEN a hook that calls sys.exit(3) when asked about debug_kernel
    hooks = write_hooks(tmp_path, f"""\
        import sys

        @clc.on_launch(kernel="*debug*"{", " + mode if mode else ""})
        def quit_on_debug(launch):
            sys.exit(3)
    """)
    run = run_params(f"version: 1\ndefault: {default}\non_error: {on_error}\n", [hooks])
    # THEN the program runs to its end and exits with its own status, not the hook's
    ok(run)
    # AND debug_kernel's launches get the policy's on_error
    assert rcs(run, DEBUG) == [expect] * 3
    assert run.fake_counts().get(DEBUG, 0) == (3 if expect == 0 else 0)
    # AND the failure is reported once, naming the hook and saying that it called sys.exit
    assert re.search(r"^clc: hook hooks\.py:quit_on_debug called sys\.exit\(3\) at a launch of "
                     rf"debug_kernel\(int\*\); its launches get on_error={on_error} \(a hook "
                     r"cannot end the program: it goes on\)$", run.stderr, re.M), run.stderr
    assert run.stderr.count("Traceback (most recent call last)") == 1, run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


def test_hook_that_raises_keyboard_interrupt_is_a_hook_failure(run_params, tmp_path):
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*debug*", every_launch=True)
        def interrupt(launch):
            raise KeyboardInterrupt
    """)
    run = run_params("version: 1\ndefault: allow\non_error: deny\n", [hooks])
    ok(run)
    assert rcs(run, DEBUG) == [800] * 3
    assert re.search(r"^clc: hook hooks\.py:interrupt raised KeyboardInterrupt at a launch of "
                     r"debug_kernel\(int\*\); its launches get on_error=deny", run.stderr,
                     re.M), run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


EXITING = """\
    import sys

    @clc.on_exit
    def leave(stats):
        sys.exit(3)

    @clc.on_exit
    def after(stats):
        log("after", stats.total.launches)
"""


def test_exit_hook_that_calls_sys_exit_leaves_the_exit_status_alone(run_params, tmp_path):
    # GIVEN an on_exit hook that calls sys.exit(3), and another after it
    hooks = write_hooks(tmp_path, EXITING)
    run = run_params(ALLOW_ALL, [hooks])
    # THEN the program's exit status is its own
    ok(run)
    # AND the next on_exit hook still runs, with every launch counted
    assert logged(tmp_path / "hooks.log") == [["after", str(2 * COUNT + 5)]]
    # AND the failure is reported, naming the hook
    assert re.search(r"^clc: on_exit hook hooks\.py:leave called sys\.exit\(3\) \(ignored: the "
                     r"program's exit status stays its own\)$", run.stderr, re.M), run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


def test_exit_hook_that_calls_sys_exit_in_a_python_program(clc_run, tmp_path):
    from build import PYHOST
    # GIVEN a Python program (clc's engine joins its interpreter) and the same exit hooks
    hooks = write_hooks(tmp_path, EXITING)
    run = clc_run(ALLOW_ALL, [sys.executable, PYHOST], options=["--hooks", str(hooks)],
                  env={"CLC_TEST_OUT": str(tmp_path / "hooks.log")})
    # THEN its exit status is its own too, and the next exit hook runs
    ok(run)
    assert [f[0] for f in logged(tmp_path / "hooks.log")] == ["after"]
    assert re.search(r"^clc: on_exit hook hooks\.py:leave called sys\.exit\(3\)", run.stderr,
                     re.M), run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


def test_what_hooks_print_reaches_a_pipe(run_params, tmp_path):
    # GIVEN a C program (clc starts its own Python in it) whose stdout is a pipe, and hooks
    # that print
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*vecAdd*")
        def note(launch):
            print("hook saw", launch.base)

        @clc.on_exit
        def summary(stats):
            print(f"on_exit: {stats.total.launches} launches")
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    lines = run.stdout.splitlines()
    # THEN what they printed is in the program's stdout, the exit hook's line after everything
    # the program printed
    assert "hook saw vecAdd" in lines
    assert lines[-1] == f"on_exit: {2 * COUNT + 5} launches", run.stdout[-2000:]
    assert lines.index("hook saw vecAdd") > max(i for i, line in enumerate(lines)
                                                if line.startswith("fake:"))


def test_every_launch_hook_that_is_slow_or_answers_wrongly_is_reported(run_params, tmp_path):
    # GIVEN an every_launch hook on debug_kernel that takes 5 ms at its first launch and
    # answers something that is not a decision at its second
    hooks = write_hooks(tmp_path, """\
        import time
        calls = []

        @clc.on_launch(kernel="*debug*", every_launch=True)
        def moody(launch):
            calls.append(1)
            if len(calls) == 1:
                time.sleep(0.005)
            if len(calls) == 2:
                return "allow"
            return None
    """)
    run = run_params("version: 1\ndefault: allow\non_error: deny\n", [hooks])
    ok(run)
    # THEN the slow call is reported with its time, the wrong answer with what it was, and
    # that launch gets on_error; the others run
    assert re.search(r"^clc: .*hook hooks.py:moody took [5-9]\.\d ms at a launch of "
                     r"debug_kernel", run.stderr, re.M), run.stderr
    assert re.search(r"hook hooks.py:moody returned 'allow'; expected", run.stderr), run.stderr
    assert rcs(run, DEBUG) == [0, 800, 0]


def test_a_kept_launch_keeps_its_fields_and_refuses_argument_reads(run_params, tmp_path):
    # GIVEN an every_launch hook that keeps every Launch of vecAdd (against the docs' advice)
    # and one that keeps only the Param of n
    hooks = write_hooks(tmp_path, """\
        kept, params = [], []

        @clc.on_launch(kernel="*vecAdd*", every_launch=True)
        def keep(launch):
            kept.append(launch)
            params.append(launch.params[3])
            log("n", launch.params[3].as_int())

        @clc.on_exit
        def later(stats):
            for launch in kept:
                try:
                    launch.params[3].as_int()
                    read = "read"
                except clc.HookError as e:
                    read = "refused" if "valid only during the hook call" in str(e) else str(e)
                log("kept", launch.grid.x, read)
            log("param", sum(1 for p in params if _refuses(p)))

        def _refuses(param):
            try:
                param.as_int()
                return False
            except clc.HookError:
                return True
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    got = logged(tmp_path / "hooks.log")
    # THEN each launch's hook read its own n, and each kept Launch still gives its own grid
    # but refuses to read arguments after its hook returned; so do the kept Params
    assert [int(g[1]) for g in got if g[0] == "n"] == [100 * (i + 1) for i in range(COUNT)] * 2
    assert [g[1:] for g in got if g[0] == "kept"] == \
        [[str(i + 1), "refused"] for i in range(COUNT)] * 2
    assert [g[1] for g in got if g[0] == "param"] == [str(2 * COUNT)]


# ---- (e) a hook file that does not import ------------------------------------------------------

BROKEN = {
    # kind -> (file text, the line at fault)
    "raises": ("import clc\n\n\n\nraise RuntimeError('this hook file is broken')\n", 5),
    "syntax": ("import clc\n\n\ndef oops(launch:\n    return None\n", 4),
    "import": ("import clc\nimport clc_no_such_module_anywhere\n", 2),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
@pytest.mark.parametrize("via", ["--hooks", "rule"])
def test_hook_file_that_does_not_import_stops_clc_run(clc_run, tmp_path, native, kind, via):
    text, line = BROKEN[kind]
    hooks = tmp_path / "broken_hooks.py"
    hooks.write_text(text)
    marker = tmp_path / "program-started"
    if via == "--hooks":
        policy, options = ALLOW_ALL, ["--hooks", str(hooks)]
    else:
        policy = ALLOW_ALL + f"""\
rules:
  - name: ask-python
    match: {{kernel: "*"}}
    action: hook
    hook: {hooks}:oops
"""
        options = []
    run = clc_run(policy, ["/bin/sh", "-c", f'touch "{marker}"; exec "$0" 2',
                           native["prog_params"]], options=options)
    # THEN clc-run stops with status 2 before the program starts
    assert run.proc.returncode == 2, (run.proc.returncode, run.stderr)
    assert not marker.exists()
    assert "fake:" not in run.stdout
    # AND says which file and which line
    assert str(hooks) in run.stderr or hooks.name in run.stderr, run.stderr
    assert re.search(rf"\bline {line}\b|:{line}\b", run.stderr), run.stderr
