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
from clc.outputs import check_output
from clc.runtime.cupti import MODES, timing_settings
from clc.runtime.decider import Decider, decides_alone
from clc.runtime.slurm import job_environment
from clc.runtime.status import MAX_BYTES, MAX_PER_SENDER, StatusListener
from clc.errors import EXIT_STRICT, EXIT_USAGE, ClcError
from clc.runtime.hook_reads import stale_read_warning
from clc.runtime.hooks import HookError, hook_rule_errors, load_hook_file, resolve_hook_ref
from clc.policy import KernelInfo, PolicyError, load_policy, parse_policy, process_identity
from clc.policy.model import LATENCY_CRITICAL
from clc.capture.reports import summary
from clc.runtime.shim import SETTINGS_VAR, preload_environment, settings_fd

__all__ = ["RunCommand", "main", "split_program", "default_output", "capture_files",
           "load_policy_and_hooks", "check_output", "parse_size", "smallest_capture_limit"]

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


def default_output(program, pid):
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(program)) or "program"
    return pathlib.Path(os.path.abspath(f"clc-{name}.{pid}.clc"))


DEFAULT_CAPTURE_LIMIT = 2 << 30
# What a capture holds besides launches, at the least: its header, the process's command line,
# a few kernels, loads and messages, its counts and the END record (the shim sets room aside for
# them).
_CAPTURE_FLOOR = 64 << 10
_RULE_STATS_RECORD = 24  # a RULE_STATS record, header included (shim/clc_abi.h)


def smallest_capture_limit(policy_json, deciders):
    """The smallest --capture-limit a capture of this policy fits in: it holds the policy, and
    its counts have a RULE_STATS slot per decider that may deny, in each of their two copies."""
    return _CAPTURE_FLOOR + len(policy_json.encode()) + (deciders + 3) * 2 * _RULE_STATS_RECORD
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_RECORD_ROOM = 16  # a record's header, and its padding


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


def _exit_code(text):
    """argparse's type for --error-exitcode: a status a process can exit with."""
    try:
        code = int(text)
    except ValueError:
        code = -1
    if not 1 <= code <= 255:
        raise argparse.ArgumentTypeError(f"{text!r} is not an exit status from 1 to 255")
    return code


def _clear_children(output, force):
    """The captures an earlier run left under this capture's name (its child processes' and
    re-executed images'): removed with --force, so that this run's report holds this run's
    captures alone; refused without it. Only this user's regular files are removed; anything
    else there is refused."""
    stale = capture_files(output)
    stale = [f for f in stale if f != output]
    if not stale:
        return
    if not force:
        raise ClcError(f"{stale[0]} and {len(stale) - 1} more captures of an earlier run exist "
                       f"beside {output} (use --force to replace them, or -o to name another "
                       f"file)" if len(stale) > 1 else
                       f"{stale[0]}, a capture of an earlier run, exists beside {output} (use "
                       f"--force to replace it, or -o to name another file)", EXIT_USAGE)
    for f in stale:
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ClcError(f"{f} is in the way of this run's captures and is not this user's "
                           f"regular file: remove it, or name another file with -o", EXIT_USAGE)
        os.unlink(f)


def _static_program(path):
    """Whether `path` names a statically linked ELF executable (it cannot load the driver)."""
    if os.sep not in path:
        path = shutil.which(path) or ""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return False
    except OSError:
        return False
    return not _has_interp(path)


def _unseen(run):
    """The processes that ran without clc's shim and could have launched kernels."""
    return [u for u in run.unseen if not _static_program(u.path)]


def _say_unseen(run):
    if run.dropped:
        print(f"clc: {_dropped(run)}: a process sent more than clc-run keeps "
              f"({MAX_PER_SENDER} entries each, {MAX_BYTES >> 20} MiB in all), so what clc-run "
              f"knows of the program's processes is incomplete", file=sys.stderr)
    for u in _unseen(run)[:5]:
        verb = "executed" if u.how == "exec" else "was spawned as"
        print(f"clc: process {u.pid} {verb} {u.path} without clc's shim (a setuid or setgid "
              f"program, or one that removed the preload): its launches were neither seen nor "
              f"controlled", file=sys.stderr)


def _dropped(run):
    return (f"{run.dropped} status message{'s' if run.dropped != 1 else ''} from "
            f"{run.dropped_senders} process{'es' if run.dropped_senders != 1 else ''} "
            f"not kept")


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
        compiled = json.loads(policy_json)
        deciders = len(compiled.get("rules", [])) + len(compiled.get("hook_deciders", []))
        # the job's environment where a Slurm task's launcher started clc-run
        environ = job_environment(dict(os.environ))
        if args.tenant is not None:
            environ["CLC_TENANT"] = args.tenant
        run_json = json.dumps({"tenant": environ.get("CLC_TENANT", ""), "uid": os.getuid(),
                               "labels": dict(args.label)}, separators=(",", ":"))
        floor = smallest_capture_limit(policy_json, deciders) + _RECORD_ROOM + \
            len(run_json.encode())
        if args.capture_limit and args.capture_limit < floor:
            raise ClcError(f"--capture-limit {args.capture_limit} is smaller than the smallest "
                           f"capture of this policy ({floor} bytes: the policy itself, the "
                           f"process and room for its counts); give at least "
                           f"{-(-floor // 1024)}K, or 0 for no limit", EXIT_USAGE)
        # Not resolve(): a link at the output is refused, never followed.
        output = pathlib.Path(os.path.abspath(args.output)) if args.output else None
        if output is not None:
            check_output(output, args.force)
            _clear_children(output, args.force)
        _warn_unpreloadable(argv[0])
        try:
            env, settings = preload_environment(environ, policy_json=policy_json,
                                                on_error=policy.on_error, output=output or "",
                                                force=args.force, verbose=args.verbose)
        except FileNotFoundError as e:
            raise ClcError(str(e)) from None
        settings["CLC_CAPTURE_MAX_BYTES"] = str(args.capture_limit)
        settings["CLC_RUN"] = run_json
        settings.update(timing_settings(args.timing, args.cupti))
        settings["CLC_POLICY_PROGRAM"] = "1" if policy.program_wide else "0"
        # held_share confines held launches as sm_share does: contexts the program makes
        # (cuCtxCreate) are then green contexts of their own too
        held_share = policy.priority is not None and any(
            c.held_share for c in policy.priority.classes)
        settings["CLC_POLICY_CONFINES"] = "1" if policy.confines or held_share else "0"
        settings["CLC_POLICY_DECIDERS"] = str(deciders)
        settings.update(priority_settings(policy, argv, settings.get("CLC_TENANT", ""),
                                          args.verbose))
        decider = None
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
            status, output = _spawn(argv, env, settings, output, args.force, listener, decider,
                                    capture=not args.no_capture)
            run = listener.finish()
        finally:
            listener.close()
            if decider is not None:
                decider.close()
        if output is None:  # --no-capture
            return status
        files = capture_files(output, started_ns)
        captures = _scan(files) if not (args.quiet or args.no_report) or strict else []
        if not args.no_report:
            _report(files, captures, run.started, argv[0], args.quiet)
        _say_unseen(run)
        if strict and status == 0:
            why = _strict_violation(files, captures, run)
            if why:
                print(f"clc: --strict: {why}; exit status {args.error_exitcode}", file=sys.stderr)
                return args.error_exitcode
        return status


def _latency_critical_users(priority):
    """The uids whose board slots a best-effort process believes besides its own and root's:
    the users the latency-critical classes name (`user`: by name or number, globs matched
    against the user database), and the members of the groups they name (listed members, and
    the users whose primary group it is). A class that names neither adds none."""
    import fnmatch
    import grp
    import pwd
    users = list(pwd.getpwall())
    uids = set()
    for c in priority.classes:
        if c.kind != LATENCY_CRITICAL:
            continue
        for g in c.user or ():
            if g.isdigit():
                uids.add(int(g))
                continue
            try:
                uids.add(pwd.getpwnam(g).pw_uid)  # a literal name, from any source
            except KeyError:
                pass
            uids.update(e.pw_uid for e in users if fnmatch.fnmatchcase(e.pw_name, g))
        for g in c.group or ():
            groups = []
            try:
                groups.append(grp.getgrgid(int(g)) if g.isdigit() else grp.getgrnam(g))
            except (KeyError, ValueError):
                pass
            groups += [e for e in grp.getgrall() if fnmatch.fnmatchcase(e.gr_name, g)]
            for group in groups:
                for member in group.gr_mem:
                    try:
                        uids.add(pwd.getpwnam(member).pw_uid)
                    except KeyError:
                        pass
                uids.update(e.pw_uid for e in users if e.pw_gid == group.gr_gid)
    return uids


def board_problem(path):
    """Why the shim will refuse the board directory at `path`, or None (also when it is
    missing: the shim makes it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, neither root nor this user"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "others may write it, and it is not sticky"
    return None


_MAX_TRUSTED_USERS = 254  # the shim reads 256 users' directories: this user and root besides


def priority_settings(policy, argv, tenant, verbose=False):
    """The sealed settings of the program's priority class (CLC_PRIORITY and the rest), or {}.

    The class is decided here, once, for the command clc-run starts (its name, the tenant,
    this user, groups and cgroup); the processes it starts keep it. A best-effort process
    reads the board's directories of this user, root, and the users the policy's
    latency-critical classes name, or are members of groups they name (CLC_PRIORITY_TRUST)."""
    priority = policy.priority
    if priority is None or not priority.classes:
        return {}
    from clc.policy.names import process_names
    exe = shutil.which(argv[0]) or argv[0]
    info = KernelInfo(mangled="", demangled="", device=0,
                      process_names=process_names(argv, os.path.realpath(exe)), tenant=tenant,
                      identity=process_identity())
    found = priority.class_of(info)
    if found is None:
        if verbose:
            print("clc-run: no priority class holds for this program", file=sys.stderr)
        return {}
    if verbose:
        print(f"clc-run: priority class {found.describe()}", file=sys.stderr)
    problem = board_problem(priority.board)
    if problem:
        print(f"clc-run: warning: the priority board {priority.board} cannot be used "
              f"({problem}): " + ("this program holds no best-effort work"
                                  if found.kind == LATENCY_CRITICAL else
                                  "this program's launches are held to its floor"),
              file=sys.stderr)
    out = {"CLC_PRIORITY": "lc" if found.kind == LATENCY_CRITICAL else "be",
           "CLC_PRIORITY_NAME": found.name, "CLC_PRIORITY_BOARD": priority.board,
           "CLC_PRIORITY_IDLE_MS": repr(priority.idle_after_ms)}
    if found.kind != LATENCY_CRITICAL:
        users = _latency_critical_users(priority)
        if len(users) > _MAX_TRUSTED_USERS:
            raise ClcError(f"the policy's latency-critical classes name {len(users)} users; a "
                           f"best-effort process reads the board slots of at most "
                           f"{_MAX_TRUSTED_USERS}: name fewer, or a smaller group",
                           EXIT_USAGE)
        out["CLC_PRIORITY_FLOOR"] = repr(found.floor)
        out["CLC_PRIORITY_RUN_AHEAD"] = str(found.run_ahead)
        if found.held_share:
            out["CLC_PRIORITY_HELD_SHARE"] = repr(found.held_share)
        out["CLC_PRIORITY_TRUST"] = ",".join(f"u{u}" for u in sorted(users))
    return out


def _spawn(argv, env, settings, output, force, listener, decider=None, capture=True):
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


def _strict_violation(files, captures, run):
    """Why a --strict run fails, or None: launches denied or left to on_error, a process that
    ran without the shim, a capture that is missing, cannot be read, is incomplete or lost
    records, or a decision table that filled."""
    parts = []
    unseen = _unseen(run)
    if unseen:
        parts.append(f"{len(unseen)} process{'es' if len(unseen) != 1 else ''} ran without "
                     f"clc's shim ({unseen[0].path})")
    if run.dropped:
        parts.append(f"the run's account of its processes is incomplete ({_dropped(run)})")
    if not files:
        if not run.started:
            parts.append("clc's shim never started in the program")
    elif captures is None:
        parts.append("the capture cannot be read")
    read = {os.path.abspath(c.path) for c in captures or ()}
    missing = sorted(p for p in run.captures if os.path.abspath(p) not in read)
    missing += sorted(run.failed_captures)
    if captures is not None and missing:
        parts.append(f"{len(missing)} capture{'s' if len(missing) != 1 else ''} of the run "
                     f"missing or unwritable ({missing[0]})")
    captures = captures or []
    denied = sum(sum(c.rule_stats.values()) if c.rule_stats
                 else sum(s.denied for s in c.stats.values()) for c in captures)
    on_error = sum(c.on_error_launches for c in captures)
    lost = [c for c in captures
            if not c.complete or c.dropped or c.capped_bytes or c.write_lost_bytes
            or c.truncated]
    full = [c for c in captures if c.table_full]
    if lost:
        parts.append(f"{len(lost)} capture{'s' if len(lost) != 1 else ''} incomplete or "
                     f"short of records ({lost[0].path}), so what they hold cannot vouch "
                     f"for the run")
    if full:
        parts.append(f"the decision table filled in {len(full)} process"
                     f"{'es' if len(full) != 1 else ''} ({full[0].path})")
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
