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
import shlex
import shutil
import signal
import stat
import struct
import sys
import time

import clc
from clc.abi import CAPTURE_HEADER, CAPTURE_MAGIC
from clc.capture.reader import CaptureError, scan_captures
from clc.runtime.decider import Decider, decides_alone
from clc.errors import EXIT_STRICT, EXIT_USAGE, ClcError
from clc.runtime.hooks import HookError, hook_rule_errors, load_hook_file
from clc.policy import PolicyError, load_policy, parse_policy
from clc.capture.reports import summary
from clc.runtime.shim import SETTINGS_VAR, preload_environment, settings_fd

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
        names = [hook.name for ref in policy.hooks for hook in load_hook_file(ref.path).hooks]
    except HookError as e:
        raise ClcError(str(e), EXIT_USAGE) from None
    errors = hook_rule_errors(policy)
    if errors:
        raise ClcError("\n".join(str(e) for e in errors), EXIT_USAGE)
    data = json.loads(policy.to_json())
    data["hook_deciders"] = names
    return policy, json.dumps(data, separators=(",", ":"))


def default_output(program, pid):
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(program)) or "program"
    return pathlib.Path(os.path.abspath(f"clc-{name}.{pid}.clc"))


DEFAULT_CAPTURE_LIMIT = 2 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    """'500M', '4G', '1048576' -> bytes; argparse's type for --capture-limit."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (a number of bytes, or with "
                                         f"K, M, G or T after it)")
    return int(m[1]) * _UNITS[m[2]]


def check_output(path, force):
    """Refuses, before the program starts, a capture path clc could not or must not write: a
    missing folder, a link (never followed: another user may have planted it), something that
    is not a regular file, an existing file without --force."""
    parent = path.parent
    if not parent.is_dir():
        raise ClcError(f"cannot write the capture {path}: the folder {parent} does not exist",
                       EXIT_USAGE)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ClcError(f"cannot write the capture {path}: {parent} is not writable", EXIT_USAGE)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ClcError(f"{path} is a symbolic link: clc does not write through links (remove "
                       f"it, or name another file with -o)", EXIT_USAGE)
    if not stat.S_ISREG(st.st_mode):
        raise ClcError(f"{path} is not a regular file: name a file for the capture with -o",
                       EXIT_USAGE)
    if not force:
        raise ClcError(f"{path} exists (use --force to overwrite it, or -o to name another "
                       f"file)", EXIT_USAGE)


def _warn_unpreloadable(program):
    """The loader ignores LD_PRELOAD for setuid and setgid programs (unless run by root) and
    static binaries load nothing: say so before the program starts."""
    path = program if os.sep in program else shutil.which(program)
    try:
        st = os.stat(path) if path else None
    except OSError:
        return
    if st is None or not stat.S_ISREG(st.st_mode):
        return
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID) and os.geteuid() != 0:
        print(f"clc: {program} is set{'uid' if st.st_mode & stat.S_ISUID else 'gid'}: the "
              f"loader ignores clc's preload for it, so its launches cannot be seen or "
              f"controlled", file=sys.stderr)
        return
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return
    if head[:4] == b"\x7fELF" and not _has_interp(path):
        print(f"clc: {program} is statically linked: nothing can be preloaded into it, so its "
              f"launches cannot be seen or controlled", file=sys.stderr)


def _has_interp(path):
    """Whether an ELF executable names a dynamic loader (PT_INTERP)."""
    import struct
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[4] != 2:  # 32-bit: do not guess
                return True
            phoff, = struct.unpack_from("<Q", ident, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", ident, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return True
    return any(struct.unpack_from("<I", table, i * phentsize)[0] == 3  # PT_INTERP
               for i in range(len(table) // max(phentsize, 1)))


def _read_status(fd):
    """{pid: name} of each process in which the shim started (each wrote "pid name" into the
    status pipe)."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    out = {}
    for line in data.decode(errors="replace").splitlines():
        pid, _, name = line.partition(" ")
        if pid.isdigit():
            out[int(pid)] = name
    return out


def capture_files(output, since_ns=None):
    """The program's capture and those of its child processes and re-executed images; with
    since_ns, only this user's regular files begun at or after that time (CLOCK_MONOTONIC,
    ns): an earlier run's children left under the same names are not this run's."""
    output = pathlib.Path(output)
    files = [output] if output.exists() else []
    files += sorted(pathlib.Path(p) for p in glob.glob(glob.escape(_stem(output)) + ".child-*.clc"))
    files += sorted(pathlib.Path(p) for p in glob.glob(glob.escape(str(output)) + ".[0-9]*"))
    return [f for f in files if since_ns is None or _begun(f) >= since_ns]


def _stem(path):
    """A capture's name without .clc: its children's captures are STEM.child-PID.clc."""
    return str(path).removesuffix(".clc")


def _begun(path):
    """The start time (CLOCK_MONOTONIC) in a capture's header; a file of this user's that has
    none is kept (and reported); another user's file, or one that is not a regular file, is
    not this run's (-1)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return -1
        magic, _, _, _, _, start_monotonic_ns, _ = CAPTURE_HEADER.unpack(
            os.read(fd, CAPTURE_HEADER.size))
    except (OSError, struct.error):
        return float("inf")
    finally:
        os.close(fd)
    return start_monotonic_ns if magic == CAPTURE_MAGIC else float("inf")


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
        parser.add_argument("--strict", action="store_true",
                            help=f"exit with status {EXIT_STRICT} when the program exits 0 but "
                                 "launches were denied, fell to the policy's on_error, or were "
                                 "never seen (clc's shim did not start)")
        parser.add_argument("--capture-limit", metavar="SIZE", type=parse_size,
                            default=DEFAULT_CAPTURE_LIMIT,
                            help="largest capture file per process, e.g. 500M or 4G; records "
                                 "past it are dropped and counted (default: 2G; 0: no limit)")
        parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                            help="the program to run and its arguments")

    def run(self, args):
        argv = split_program(args.program)
        if not argv:
            raise ClcError("no program given: clc-run [options] -- PROGRAM [ARGS...]", EXIT_USAGE)
        if args.no_capture and (args.output or args.strict):
            raise ClcError(f"--no-capture writes no capture: {'-o' if args.output else '--strict'}"
                           f" needs one", EXIT_USAGE)
        policy, policy_json = load_policy_and_hooks(args.policy, args.hooks)
        environ = dict(os.environ)
        if args.tenant is not None:
            environ["CLC_TENANT"] = args.tenant
        # Not resolve(): a link at the output is refused, never followed.
        output = pathlib.Path(os.path.abspath(args.output)) if args.output else None
        if output is not None:
            check_output(output, args.force)
        _warn_unpreloadable(argv[0])
        try:
            env, settings = preload_environment(environ, policy_json=policy_json,
                                                on_error=policy.on_error, output=output or "",
                                                force=args.force, verbose=args.verbose)
        except FileNotFoundError as e:
            raise ClcError(str(e)) from None
        settings["CLC_CAPTURE_MAX_BYTES"] = str(args.capture_limit)
        settings["CLC_POLICY_PROGRAM"] = "1" if policy.program_wide else "0"
        decider = None
        status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
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
            settings["CLC_STATUS_FD"] = str(status_w)
            settings["CLC_STATUS_INO"] = str(os.fstat(status_w).st_ino)
            status, output = _spawn(argv, env, settings, output, args.force, status_w, decider,
                                    capture=not args.no_capture)
            os.close(status_w)
            status_w = -1
            shimmed = _read_status(status_r)
        finally:
            os.close(status_r)
            if status_w >= 0:
                os.close(status_w)
            if decider is not None:
                decider.close()
        if output is None:  # --no-capture
            return status
        files = capture_files(output, started_ns)
        captures = _scan(files) if not (args.quiet or args.no_report) or args.strict else []
        if not args.no_report:
            _report(files, captures, shimmed, argv[0], args.quiet)
        if args.strict and status == 0:
            why = _strict_violation(files, captures, shimmed)
            if why:
                print(f"clc: --strict: {why}; exit status {EXIT_STRICT}", file=sys.stderr)
                return EXIT_STRICT
        return status


def _spawn(argv, env, settings, output, force, status_w, decider=None, capture=True):
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
            os.set_inheritable(status_w, True)
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
        if decider is not None:
            decider.start()
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


def _scan(files):
    try:
        return scan_captures(files)
    except CaptureError as e:
        print(f"clc: cannot read the capture: {e}", file=sys.stderr)
        return None


def _strict_violation(files, captures, shimmed):
    """Why a --strict run fails, or None: launches denied or left to on_error, a capture that
    cannot be read or lost records, or a program clc never saw."""
    if not files:
        return None if shimmed else "clc's shim never started in the program"
    if captures is None:
        return "the capture cannot be read"
    denied = sum(s.denied for c in captures for s in c.stats.values())
    on_error = sum(c.on_error_launches for c in captures)
    lost = [c for c in captures
            if not c.complete or c.dropped or c.capped_bytes or c.write_lost_bytes]
    parts = []
    if lost:
        parts.append(f"{len(lost)} capture{'s' if len(lost) != 1 else ''} incomplete or "
                     f"short of records ({lost[0].path}), so what they hold cannot vouch "
                     f"for the run")
    if denied:
        parts.append(f"{denied} launch{'es' if denied != 1 else ''} or graph-node call"
                     f"{'s' if denied != 1 else ''} denied")
    if on_error:
        parts.append(f"{on_error} launch{'es' if on_error != 1 else ''} fell to on_error")
    return " and ".join(parts) or None


def _report(files, captures, shimmed, program, quiet=False):
    if not files:
        if not shimmed:
            print(f"clc: clc's shim never started in {program} (a setuid or setgid program, a "
                  f"static binary, or LD_PRELOAD removed from its environment): its launches "
                  f"were neither seen nor controlled; no capture was written", file=sys.stderr)
        else:
            names = ", ".join(f"{name} ({pid})" for pid, name in sorted(shimmed.items())[:5])
            more = f" and {len(shimmed) - 5} more" if len(shimmed) > 5 else ""
            print(f"clc: the program launched no kernel in the {len(shimmed)} process"
                  f"{'es' if len(shimmed) > 1 else ''} clc ran in ({names}{more}); a CUDA "
                  f"program they started without clc's preload (env -i, setuid, static) would "
                  f"not be seen. No capture was written", file=sys.stderr)
        return
    if captures is not None and not quiet:
        print(summary(captures), file=sys.stderr)
    first = files[0]
    if len(files) == 1:
        named, out = shlex.quote(str(first)), first.stem
        print(f"clc: capture written to {first}", file=sys.stderr)
    else:  # the program's and its children's: one stem
        stem = _stem(str(first).split(".child-")[0])
        named, out = f"{shlex.quote(stem)}*.clc", pathlib.Path(stem).name
        print(f"clc: captures written to {first} and {len(files) - 1} more, of child "
              f"processes ({stem}*.clc)", file=sys.stderr)
    if not quiet:
        print(f"clc: timeline: clc report {named} --format chrome -o {out}.json",
              file=sys.stderr)


def main(argv=None):
    from clc.cli.main import run_command

    parser = argparse.ArgumentParser(
        prog="clc-run", description="Run a program with every CUDA kernel launch under a policy.")
    parser.add_argument("--version", action="version", version=f"clc-run {clc.__version__}")
    RunCommand.add_arguments(parser)
    args = parser.parse_args(argv)
    sys.exit(run_command(RunCommand, args))
