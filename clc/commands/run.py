# SPDX-License-Identifier: Apache-2.0
"""`clc-run [--policy FILE] [-o FILE] [--force] [-v] [--no-report] -- PROGRAM ARGS...`

Runs PROGRAM with the shim preloaded, passes its exit status on (128+N when signal N killed
it), and afterwards reads the capture the program wrote and prints the per-kernel summary.
"""

import argparse
import glob
import json
import os
import pathlib
import re
import signal
import sys

from clc.capture import CaptureError, read_captures
from clc.errors import EXIT_USAGE, ClcError
from clc.hooks import HookError, load_hook_file, resolve_hook_ref
from clc.policy import PolicyError, load_policy, parse_policy
from clc.reports import summary
from clc.shim import SETTINGS_VAR, preload_environment, settings_fd

__all__ = ["RunCommand", "main", "split_program", "default_output", "capture_files",
           "load_policy_and_hooks"]

# Used when no --policy is given: let everything run and record every launch.
DEFAULT_POLICY = """\
version: 1
default: allow
rules:
  - name: record-all
    match: {kernel: "*"}
    action: allow
    record: true
"""

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# si_code values above 0 (SI_KERNEL...) mean the terminal sent the signal to the whole
# foreground process group, so the program got it too; 0 and below, a process sent it to us.
_SENT_BY_A_PROCESS = 0


def split_program(argv):
    """`--` ends clc-run's options; without it the program starts at the first word that is
    not an option (argparse.REMAINDER), so both `clc-run -- prog` and `clc-run prog` work."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    return argv


def load_policy_and_hooks(policy_path, hook_files):
    """The policy with the --hooks files, every hook file imported once here so that one that
    does not import stops clc-run before the program starts; and the policy as the program's
    engine gets it (JSON), naming the --hooks files' hooks for the reports."""
    try:
        policy = load_policy(policy_path) if policy_path else parse_policy(
            DEFAULT_POLICY if not hook_files else "version: 1\n")
        policy = policy.with_cli_hooks(hook_files or [])
    except PolicyError as e:
        raise ClcError(str(e), EXIT_USAGE) from None
    try:
        names = [hook.name for ref in policy.hooks for hook in load_hook_file(ref.path).hooks]
        for rule in policy.rules:
            if rule.hook is not None:
                resolve_hook_ref(f"{rule.hook.path}:{rule.hook.function}", os.sep)
    except HookError as e:
        raise ClcError(str(e), EXIT_USAGE) from None
    data = json.loads(policy.to_json())
    data["hook_deciders"] = names
    return policy, json.dumps(data, separators=(",", ":"))


def default_output(program, pid):
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(program)) or "program"
    return pathlib.Path(f"clc-{name}.{pid}.clc").resolve()


def capture_files(output):
    """The program's capture and those of its child processes and re-executed images."""
    output = pathlib.Path(output)
    stem = str(output)[:-4] if str(output).endswith(".clc") else str(output)
    files = [output] if output.exists() else []
    files += sorted(pathlib.Path(p) for p in glob.glob(glob.escape(stem) + ".child-*.clc"))
    files += sorted(pathlib.Path(p) for p in glob.glob(glob.escape(str(output)) + ".[0-9]*"))
    return files


class RunCommand:
    name = "run"
    help = "run a program with every kernel launch under a policy (same as clc-run)"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--policy", metavar="FILE",
                            help="policy file (default: allow everything and record every "
                                 "launch; with --hooks: allow what the hooks do not decide)")
        parser.add_argument("--hooks", metavar="FILE", action="append",
                            help="Python file of @clc.on_launch hooks, asked before the "
                                 "policy's rules (repeatable)")
        parser.add_argument("-o", "--output", metavar="FILE",
                            help="capture file (default: clc-<program>.<pid>.clc)")
        parser.add_argument("--force", action="store_true", help="overwrite the capture file")
        parser.add_argument("-v", "--verbose", action="store_true",
                            help="log what the shim and the engine do")
        parser.add_argument("--no-report", action="store_true",
                            help="do not print the summary at exit")
        parser.add_argument("--tenant", help="tenant name for policies (default: $CLC_TENANT)")
        parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                            help="the program to run and its arguments")

    def run(self, args):
        argv = split_program(args.program)
        if not argv:
            raise ClcError("no program given: clc-run [options] -- PROGRAM [ARGS...]", EXIT_USAGE)
        policy, policy_json = load_policy_and_hooks(args.policy, args.hooks)
        environ = dict(os.environ)
        if args.tenant is not None:
            environ["CLC_TENANT"] = args.tenant
        output = pathlib.Path(args.output).resolve() if args.output else None
        try:
            env, settings = preload_environment(environ, policy_json=policy_json,
                                                on_error=policy.on_error, output=output or "",
                                                force=args.force, verbose=args.verbose)
        except FileNotFoundError as e:
            raise ClcError(str(e)) from None
        status, output = _spawn(argv, env, settings, output, args.force)
        if not args.no_report:
            _report(output)
        return status


def _spawn(argv, env, settings, output, force):
    """fork, check the capture's name (it holds the child's pid) before the program starts,
    then let the child exec. Both sides derive the default name from the same pid."""
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED + (signal.SIGCHLD,))
    go_r, go_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: wait for the go, then become the program
        code = 127
        try:
            os.close(go_w)
            os.close(err_r)
            if os.read(go_r, 1) != b"g":
                os._exit(code)
            settings["CLC_ROOT_PID"] = str(os.getpid())
            settings["CLC_OUTPUT"] = str(output or default_output(argv[0], os.getpid()))
            env[SETTINGS_VAR] = str(settings_fd(settings))
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            os.write(err_w, f"{e.errno}".encode())
            code = 126 if e.errno in (13, 8) else 127
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(err_w)
    try:
        output = output or default_output(argv[0], pid)
        if output.exists() and not force:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise ClcError(f"{output} exists (use --force to overwrite it, or -o to name "
                           f"another file)", EXIT_USAGE)
        _go(pid, go_w, err_r, argv[0], output)
        return _wait(pid), output
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _go(pid, go_w, err_r, program, output):
    os.write(go_w, b"g")
    os.close(go_w)
    failure = os.read(err_r, 16)
    os.close(err_r)
    if failure:
        os.waitpid(pid, 0)
        code = int(failure)
        raise ClcError(f"cannot run {program}: {os.strerror(code)}",
                       126 if code in (13, 8) else 127)


def _wait(pid):
    while True:
        info = signal.sigwaitinfo(FORWARDED + (signal.SIGCHLD,))
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                code = os.waitstatus_to_exitcode(status)
                return 128 - code if code < 0 else code
        elif info.si_code <= _SENT_BY_A_PROCESS:
            os.kill(pid, info.si_signo)


def _report(output):
    files = capture_files(output)
    if not files:
        print("clc: the program launched no kernel; no capture was written", file=sys.stderr)
        return
    try:
        print(summary(read_captures(files)), file=sys.stderr)
    except CaptureError as e:
        print(f"clc: cannot read the capture: {e}", file=sys.stderr)
    print(f"clc: capture written to {files[0]}", file=sys.stderr)
    print(f"clc: timeline: clc report {files[0]} --format chrome -o {files[0].stem}.json",
          file=sys.stderr)


def main(argv=None):
    from clc.cli import run_command

    parser = argparse.ArgumentParser(
        prog="clc-run", description="Run a program with every CUDA kernel launch under a policy.")
    RunCommand.add_arguments(parser)
    args = parser.parse_args(argv)
    sys.exit(run_command(RunCommand, args))
