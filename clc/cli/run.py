# SPDX-License-Identifier: Apache-2.0
"""`clc-run [--policy FILE] [-o FILE] [--force] [-v] [--no-report] -- PROGRAM ARGS...`

Runs PROGRAM with the shim preloaded, passes its exit status on (128+N when signal N killed
it), and afterwards reads the capture the program wrote and prints the per-kernel summary.
"""

import argparse
import json
import os
import pathlib
import re
import signal
import sys
import time

import clc
from clc.errors import EXIT_STRICT, EXIT_USAGE, ClcError
from clc.outputs import check_output
from clc.policy import PolicyError, load_policy, parse_policy
from clc.runtime.cupti import MODES
from clc.runtime.decider import Decider, decides_alone
from clc.runtime.driver_watch import DriverWatch
from clc.runtime.hook_reads import stale_read_warning
from clc.runtime.hooks import HookError, hook_rule_errors, load_hook_file, resolve_hook_ref
from clc.runtime.mps import join_mps
from clc.runtime.run_captures import capture_files, clear_children, default_output
from clc.runtime.run_report import read_captures, report, say_unseen, say_unsettled
from clc.runtime.run_settings import (DEFAULT_CAPTURE_LIMIT, check_capture_limit,
                                      count_deciders, run_record, run_settings)
from clc.runtime.shim import (FALLBACK_VAR, SETTINGS_VAR, preload_environment, preload_path,
                              settings_fd)
from clc.runtime.slurm import job_environment
from clc.runtime.status import StatusListener
from clc.runtime.strict import fallback_on_error, strict_violation
from clc.runtime.unpreloadable import warn_unpreloadable

__all__ = ["RunCommand", "main", "split_program", "default_output", "capture_files",
           "load_policy_and_hooks", "check_output", "parse_size"]

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
    for warning in getattr(policy, "warnings", ()):
        print(f"clc: {warning}", file=sys.stderr)
    try:
        hooks = [hook for ref in policy.hooks for hook in load_hook_file(ref.path).hooks]
    except HookError as e:
        raise ClcError(str(e), EXIT_USAGE) from None
    names = [hook.name for hook in hooks]
    errors = hook_rule_errors(policy)
    if errors:
        raise ClcError("\n".join(str(e) for e in errors), EXIT_USAGE)
    for hook in hooks + [resolve_hook_ref(f"{r.hook.path}:{r.hook.function}", os.sep)
                         for r in policy.rules if r.hook is not None]:
        warning = stale_read_warning(hook)
        if warning:
            print(f"clc: {warning}", file=sys.stderr)
    data = json.loads(policy.to_json())
    data["hook_deciders"] = names
    return policy, json.dumps(data, separators=(",", ":"))


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _label(text):
    """NAME=VALUE of --label: NAME as Prometheus label names are, VALUE up to 256 characters."""
    name, eq, value = text.partition("=")
    if not eq or not LABEL_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=VALUE, NAME of letters, digits and _ (not first)")
    if not value or len(value) > 256 or "\0" in value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a value of 1 to 256 characters")
    return name, value


def _cupti_path(text):
    """--cupti PATH: an existing file, by its absolute path."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r}: no such file (expected a libcupti.so)")
    return os.path.abspath(text)


def parse_size(text):
    """'500M', '4G', '1048576' -> bytes; argparse's type for --capture-limit."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (a number of bytes, or with "
                                         f"K, M, G or T after it)")
    return int(m[1]) * _UNITS[m[2]]


def _count(least):
    """argparse's type for a count of launches, at least `least`."""
    def count(text):
        try:
            n = int(text)
        except ValueError:
            n = -1
        if n < least:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least "
                                             f"{least}")
        return n
    return count


def _exit_code(text):
    """argparse's type for --error-exitcode: a status a process can exit with."""
    try:
        code = int(text)
    except ValueError:
        code = -1
    if not 1 <= code <= 255:
        raise argparse.ArgumentTypeError(f"{text!r} is not an exit status from 1 to 255")
    return code


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
        parser.add_argument("-q", "--quiet", action="store_true",
                            help="at exit, print only where the capture is, not the summary")
        parser.add_argument("--no-capture", action="store_true",
                            help="write no capture (then no summary either); the policy is "
                                 "enforced all the same")
        parser.add_argument("--tenant", help="tenant name for policies (default: $CLC_TENANT)")
        parser.add_argument("--label", metavar="NAME=VALUE", action="append", type=_label,
                            default=[],
                            help="a label of the run, kept in the capture with the tenant "
                                 "(repeatable): `clc metrics` counts by them")
        parser.add_argument("--strict", action="store_true",
                            help=f"exit with status {EXIT_STRICT} when the program exits 0 but "
                                 "launches were denied, fell to the policy's on_error, a process "
                                 "ran without clc's shim, a capture is missing or incomplete, or "
                                 "the decision table filled")
        parser.add_argument("--error-exitcode", metavar="N", type=_exit_code, default=EXIT_STRICT,
                            help=f"the exit status of a run that --strict fails (default: "
                                 f"{EXIT_STRICT}); implies --strict")
        parser.add_argument("--capture-limit", metavar="SIZE", type=parse_size,
                            default=DEFAULT_CAPTURE_LIMIT,
                            help="largest capture file per process, e.g. 500M or 4G; records "
                                 "past it are dropped and counted (default: 2G; 0: no limit)")
        parser.add_argument("--launch-skip", metavar="N", type=_count(0), default=0,
                            help="of the launches the policy records or times, write none of "
                                 "the first N of each process (as ncu's -s); all are counted")
        parser.add_argument("--launch-count", metavar="N", type=_count(1),
                            help="write the records of N launches of each process at most (as "
                                 "ncu's -c), after --launch-skip's; all are counted")
        parser.add_argument("--timing", choices=MODES, default="auto",
                            help="where the GPU times of timed launches (time: true) come from: "
                                 "CUPTI's kernel records, CUDA events around each launch, or "
                                 "auto: CUPTI where libcupti is found, else events (default)")
        parser.add_argument("--cupti", metavar="PATH", type=_cupti_path,
                            help="the libcupti to load (default: one the program loads, else "
                                 "one found under the CUDA toolkit or NVIDIA's pip package)")
        parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                            help="the program to run and its arguments")

    def run(self, args):
        argv = split_program(args.program)
        if not argv:
            raise ClcError("no program given: clc-run [options] -- PROGRAM [ARGS...]", EXIT_USAGE)
        strict = args.strict or args.error_exitcode != EXIT_STRICT
        if args.no_capture and (args.output or strict):
            raise ClcError(f"--no-capture writes no capture: {'-o' if args.output else '--strict'}"
                           f" needs one", EXIT_USAGE)
        policy, policy_json = load_policy_and_hooks(args.policy, args.hooks)
        deciders = count_deciders(policy_json)
        # the job's environment where a Slurm task's launcher started clc-run
        environ = job_environment(dict(os.environ))
        if args.tenant is not None:
            environ["CLC_TENANT"] = args.tenant
        run_json = run_record(environ, args.label, args.launch_skip, args.launch_count)
        check_capture_limit(args.capture_limit, policy_json, deciders, run_json)
        # Not resolve(): a link at the output is refused, never followed.
        output = pathlib.Path(os.path.abspath(args.output)) if args.output else None
        if output is not None:
            check_output(output, args.force)
            clear_children(output, args.force)
        warn_unpreloadable(argv[0])
        try:
            env, settings = preload_environment(environ, policy_json=policy_json,
                                                on_error=policy.on_error, output=output or "",
                                                force=args.force, verbose=args.verbose)
        except FileNotFoundError as e:
            raise ClcError(str(e)) from None
        settings.update(run_settings(policy, argv, deciders, run_json, args.capture_limit,
                                     args.timing, args.cupti, settings.get("CLC_TENANT", ""),
                                     args.verbose))
        if settings.get("CLC_PRIORITY"):
            join_mps(policy.priority.mps, env, args.verbose)
        if args.launch_skip or args.launch_count:
            settings["CLC_LAUNCH_SKIP"] = str(args.launch_skip)
            settings["CLC_LAUNCH_COUNT"] = str(args.launch_count or 0)
        status, output, run, started_ns = self._supervise(args, argv, policy, strict, env,
                                                          settings, output)
        if output is None:  # --no-capture
            return status
        files = capture_files(output, started_ns)
        captures = read_captures(files) if not (args.quiet or args.no_report) or strict else []
        if not args.no_report:
            report(files, captures, run.started, argv[0], args.quiet)
        say_unseen(run)
        say_unsettled(run, fallback_on_error(policy, strict))
        if strict and status == 0:
            why = strict_violation(files, captures, run)
            if why:
                print(f"clc: --strict: {why}; exit status {args.error_exitcode}", file=sys.stderr)
                return args.error_exitcode
        return status

    @staticmethod
    def _supervise(args, argv, policy, strict, env, settings, output):
        """The program run with clc-run's own parts beside it (the status listener, the
        decider where the policy needs no Python, the driver watch): its status, its capture
        (None with --no-capture), what its processes said (the listener's account) and when
        it started (CLOCK_MONOTONIC, ns)."""
        decider = watch = None
        try:
            listener = StatusListener()
        except OSError as e:
            raise ClcError(f"cannot make clc-run's private socket: {e}") from None
        started_ns = time.monotonic_ns()
        try:
            if decides_alone(policy):
                try:
                    decider = Decider(policy, tenant=settings.get("CLC_TENANT", ""),
                                      verbose=args.verbose)
                    settings.update(decider.settings())
                except OSError as e:
                    print(f"clc: clc-run cannot answer the program's first sights itself ({e}): "
                          f"its own engine decides them", file=sys.stderr)
            settings.update(listener.settings())
            # what a process of the run whose shim finds no settings gets, and where it says so
            settings["CLC_FALLBACK"] = env[FALLBACK_VAR] = \
                f"{fallback_on_error(policy, strict)} {listener.path}"
            watch = DriverWatch(env, env[FALLBACK_VAR], preload_path())
            status, output = _spawn(argv, env, settings, output, args.force, listener, decider,
                                    capture=not args.no_capture, watch=watch)
            run = listener.finish()
            watch.finish(run)
            if watch.problem:
                print(f"clc: could not watch the CUDA driver's files ({watch.problem}): a "
                      f"process of the run that loaded the driver past clc's hooks, without its "
                      f"preload, would not be seen", file=sys.stderr)
        finally:
            listener.close()
            if decider is not None:
                decider.close()
            if watch is not None:
                watch.close()
        return status, output, run, started_ns


def _spawn(argv, env, settings, output, force, listener, decider=None, capture=True, watch=None):
    """fork, check the capture's name (it holds the child's pid) before the program starts,
    then let the child exec. Both sides derive the default name from the same pid. The
    decider's thread starts after the fork (the child has no thread to lose) and with the
    forwarded signals blocked, as the thread that waits for them has them."""
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
            settings["CLC_OUTPUT"] = str(output or default_output(argv[0], os.getpid())) \
                if capture else ""
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
        output = (output or default_output(argv[0], pid)) if capture else None
        try:
            if capture:
                check_output(output, force)
        except ClcError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        listener.start()
        if decider is not None:
            decider.start()
        if watch is not None:
            watch.start()
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


def main(argv=None):
    from clc.cli.main import run_command

    parser = argparse.ArgumentParser(
        prog="clc-run", description="Run a program with every CUDA kernel launch under a policy.")
    parser.add_argument("--version", action="version", version=f"clc-run {clc.__version__}")
    RunCommand.add_arguments(parser)
    args = parser.parse_args(argv)
    sys.exit(run_command(RunCommand, args))
