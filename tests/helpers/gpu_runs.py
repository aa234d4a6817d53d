# SPDX-License-Identifier: Apache-2.0
"""What the GPU tests (tests/gpu) share, beside their fixtures (tests/gpu/conftest.py): whether
there is a GPU, running and building programs, reading their output and clc's reports, writing
policies, and the checks on a run's capture.

Environment knobs:
    CLC_TEST_TIMEOUT     seconds one program run may take (default 600)
"""

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from clc.cli.doctor import initialized_driver

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
POLICIES = REPO / "policies"
TIMEOUT = int(os.environ.get("CLC_TEST_TIMEOUT", "600"))

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


# ---- is there a GPU? ----------------------------------------------------------------------

_probe_cache = []


def probe_driver():
    """(info, None) when the driver works and sees a device, else (None, reason).

    Asked of the driver itself, not of a framework: a broken torch install must not read as
    "no GPU". cuInit creates no context, so doing this in the pytest process is cheap.
    """
    if _probe_cache:
        return _probe_cache[0]
    result = _probe()
    _probe_cache.append(result)
    return result


def _probe():
    cuda, why = initialized_driver()
    if cuda is None:
        return None, why
    count = ctypes.c_int(0)
    rc = cuda.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0 or count.value < 1:
        return None, f"no CUDA device: cuDeviceGetCount returned {rc}, count {count.value}"
    dev = ctypes.c_int(0)
    major = ctypes.c_int(0)
    minor = ctypes.c_int(0)
    if (cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0
            or cuda.cuDeviceGetAttribute(ctypes.byref(major),
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != 0
            or cuda.cuDeviceGetAttribute(ctypes.byref(minor),
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != 0):
        return None, "NVIDIA driver unusable: cannot read device 0's compute capability"
    libcuda = None
    try:
        # Where the driver library lives, for linking the driver-API example without a stub.
        for line in Path("/proc/self/maps").read_text().splitlines():
            if "libcuda.so" in line and "/" in line:
                libcuda = line[line.index("/"):].strip()
                break
    except OSError:
        pass
    return SimpleNamespace(devices=count.value, cc=(major.value, minor.value),
                           libcuda=libcuda), None


# ---- running programs ---------------------------------------------------------------------

def _env(extra=None):
    env = dict(os.environ)
    # Output reaches the pipe as it is written, so a run that dies still shows how far it got.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_program(argv, cwd=None, timeout=TIMEOUT, env=None):
    argv = [str(a) for a in argv]
    try:
        return subprocess.run(argv, cwd=cwd, env=_env(env), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"timed out after {timeout} s: {' '.join(argv)}\n"
                    f"--- stdout ---\n{out or ''}\n--- stderr ---\n{err or ''}")


def describe(proc, limit=6000):
    """A CompletedProcess as text for a failure message: command, status, both streams."""
    def tail(s):
        s = s or ""
        return s if len(s) <= limit else f"[... {len(s) - limit} chars cut ...]\n" + s[-limit:]
    return (f"$ {' '.join(map(str, proc.args))}\nexit status {proc.returncode}\n"
            f"--- stdout ---\n{tail(proc.stdout)}\n--- stderr ---\n{tail(proc.stderr)}")


def find_script(name):
    """A console script of this installation: next to sys.executable first, then PATH."""
    beside = Path(sys.executable).parent / name  # not resolved: a venv's bin is a symlink farm
    if beside.exists():
        return str(beside)
    return shutil.which(name)


def build_or_fail(what, attempts):
    """Run the first command of `attempts` that succeeds; fail with every attempt's output."""
    logs = []
    for argv in attempts:
        proc = run_program(argv, cwd=REPO, timeout=600)
        if proc.returncode == 0:
            return
        logs.append(describe(proc))
    pytest.fail(f"building {what} failed:\n" + "\n\n".join(logs))


def build_example(nvcc, cuda_arch, build_dir, name):
    """examples/NAME.cu, built with nvcc -O2 for cuda_arch into build_dir/NAME."""
    exe = build_dir / name
    build_or_fail(name, [[nvcc, "-O2", f"-arch={cuda_arch}", "-o", exe, EXAMPLES / f"{name}.cu"]])
    return exe


def build_driver_program(nvcc, build_dir, name):
    """examples/NAME.c, a driver-API program, built into build_dir/NAME."""
    exe = build_dir / name
    src = EXAMPLES / f"{name}.c"
    attempts = [
        # nvcc links against the toolkit's stub libcuda, wherever the toolkit keeps it.
        [nvcc, "-O2", "-o", exe, src, "-lcuda"],
    ]
    info, _ = probe_driver()
    cc = shutil.which("cc") or shutil.which("gcc")
    include = Path(nvcc).resolve().parent.parent / "include"
    if cc and info is not None and info.libcuda:
        # No stub: link the driver library itself, by path. Its soname, libcuda.so.1, is what
        # the executable records, exactly as with the stub.
        attempts.append([cc, "-O2", f"-I{include}", "-o", exe, src, info.libcuda])
    build_or_fail(name, attempts)
    return exe


# ---- reading program output and reports ---------------------------------------------------

TIMING_PREFIXES = ("event_ms ", "us_per_launch")


def parse_output(text):
    """The example programs' machine-readable lines (see examples/vecadd.cu)."""
    out = SimpleNamespace(counts={}, results={}, errors=[], error_counts={}, event_ms={},
                          done=None, fatal=[])
    for line in (text or "").splitlines():
        line = line.rstrip()
        if line.startswith("count "):
            # Profiler kernel names have spaces: the count is after the last one.
            name, _, n = line[len("count "):].rpartition(" ")
            out.counts[name] = out.counts.get(name, 0) + int(n)
        elif line.startswith("result "):
            name, _, value = line[len("result "):].rpartition(" ")
            out.results[name] = value
        elif line.startswith("cuda_error "):
            name, _, msg = line[len("cuda_error "):].partition(" ")
            out.errors.append((name, msg))
        elif line.startswith("errors "):
            parts = line.split()
            if len(parts) == 3:
                out.error_counts[parts[1]] = int(parts[2])
            elif len(parts) == 2:
                out.error_counts["*"] = int(parts[1])
        elif line.startswith("event_ms "):
            name, _, ms = line[len("event_ms "):].rpartition(" ")
            out.event_ms[name] = float(ms)
        elif line.startswith("done "):
            out.done = line[len("done "):]
        elif line.startswith("fatal "):
            out.fatal.append(line)
    return out


def comparable(text):
    """stdout without the lines that carry timings, which differ from run to run."""
    return [ln.rstrip() for ln in (text or "").splitlines()
            if ln.strip() and not ln.startswith(TIMING_PREFIXES)]


def strip_params(name):
    """'void ns::k<int>(float*, int)' -> 'ns::k<int>'; 'vecAdd(float const*)' -> 'vecAdd'."""
    name = (name or "").strip()
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            ch = name[i]
            if ch == ")":
                depth += 1
            elif ch == "(":
                depth -= 1
                if depth == 0:
                    name = name[:i]
                    break
    if name.startswith("void "):
        name = name[len("void "):]
    return name.strip()


def strip_templates(name):
    """'ns::k<int, 4>' -> 'ns::k': nested angle brackets removed."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def names_of(row):
    """Every spelling under which a test may name a kernel row or launch row."""
    name = row.get("name") or row.get("kernel") or ""
    mangled = row.get("mangled") or ""
    base = strip_params(name)
    plain = strip_templates(base)
    return {name, mangled, base, plain, plain.rsplit("::", 1)[-1]} - {""}


def kernel_rows(report, kernel):
    return [r for r in report.get("kernels", []) if kernel in names_of(r)]


def launch_rows(report, kernel=None):
    rows = report.get("launches", [])
    return rows if kernel is None else [r for r in rows if kernel in names_of(r)]


def kernel_total(report, kernel, field):
    return sum((r.get(field) or 0) for r in kernel_rows(report, kernel))


def kernel_table(report):
    """The capture's kernels as a text table, for failure messages."""
    rows = report.get("kernels", [])
    lines = [f"{'launches':>8} {'denied':>6} {'recorded':>8} {'timed':>6} "
             f"{'gpu_ns_total':>14}  name"]
    for r in sorted(rows, key=lambda r: r.get("name") or ""):
        lines.append(f"{r.get('launches', 0):>8} {r.get('denied', 0):>6} "
                     f"{r.get('recorded', 0):>8} {r.get('timed', 0):>6} "
                     f"{r.get('gpu_ns_total') or 0:>14}  {r.get('name')}  [{r.get('mangled')}]")
    if not rows:
        lines.append("(no kernels in the capture)")
    return "\n".join(lines)


def wrap_stats(report):
    """The wrapped kernels' counts (the report's "wrapped": one per kernel and process)."""
    return report.get("wrapped", [])


def report_summary(report):
    """What a failure message needs from a report: captures, kernels, messages."""
    caps = "\n".join(f"  {c}" for c in report.get("captures", [])) or "  (none)"
    msgs = "\n".join(f"  {m}" for m in report.get("messages", [])[:40]) or "  (none)"
    return (f"captures:\n{caps}\nkernels:\n{kernel_table(report)}\nmessages:\n{msgs}\n"
            f"launch records: {len(report.get('launches', []))}")


def write_policy(path, rules, default="allow"):
    """A policy file. rules: [(name, kernel_glob, action, extra_dict)]; returns the path."""
    lines = ["# SPDX-License-Identifier: Apache-2.0", "version: 1", f"default: {default}"]
    if rules:
        lines.append("rules:")
    for name, glob, action, extra in rules:
        lines.append(f"  - name: {json.dumps(name)}")
        lines.append(f"    match: {{kernel: {json.dumps(glob)}}}")
        lines.append(f"    action: {action}")
        for key, value in (extra or {}).items():
            lines.append(f"    {key}: {json.dumps(value)}")
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


def program_policy(path, params, on_unwrappable="deny"):
    """A policy confining the whole process (sm_share with scope: program); params: the
    share's, e.g. {"sms": 16}."""
    body = ", ".join(f"{k}: {v}" for k, v in params.items())
    Path(path).write_text("version: 1\ndefault: allow\nrules:\n  - name: whole-program\n"
                          "    action: wrap\n    wrapper: sm_share\n"
                          f"    params: {{{body}, scope: program}}\n"
                          f"    on_unwrappable: {on_unwrappable}\n")
    return Path(path)


def deny_policy(path, kernel_globs, message="refused in this test"):
    globs = [kernel_globs] if isinstance(kernel_globs, str) else list(kernel_globs)
    return write_policy(path, [(f"deny-{i}", g, "deny", {"message": message})
                               for i, g in enumerate(globs)])


NOT_PERMITTED = re.compile(r"not.?permitted|NOT_PERMITTED|NotPermitted", re.IGNORECASE)


def assert_capture_ok(report, run=None):
    """Every capture complete, nothing dropped."""
    context = f"\n{describe(run)}" if run is not None else ""
    caps = report.get("captures", [])
    assert caps, f"report lists no captures\n{report_summary(report)}{context}"
    bad = [c for c in caps if not c.get("complete") or c.get("dropped")]
    assert not bad, (f"incomplete capture or dropped records: {bad}\n"
                     f"{report_summary(report)}{context}")


def assert_counts(report, counts, run=None, denied=()):
    """The capture's launches (and denied) per kernel agree with the program's own counts.

    counts: kernel -> launches the program made. Kernels named in `denied` must have every
    launch refused; the others none.
    """
    context = f"\n{describe(run)}" if run is not None else ""
    problems = []
    for kernel, n in counts.items():
        rows = kernel_rows(report, kernel)
        if not rows:
            problems.append(f"{kernel}: program counted {n} launches, capture has no such kernel")
            continue
        launches = kernel_total(report, kernel, "launches")
        refused = kernel_total(report, kernel, "denied")
        want_denied = n if kernel in denied else 0
        if launches != n:
            problems.append(f"{kernel}: capture launches {launches} != program count {n}")
        if refused != want_denied:
            problems.append(f"{kernel}: capture denied {refused}, expected {want_denied}")
    assert not problems, ("\n".join(problems) + f"\n\nprogram counts: {counts}\n"
                          f"{report_summary(report)}{context}")


def assert_all_timed(report, kernels=None, run=None):
    """Each launch (of `kernels`, or of every kernel) has a launch record with gpu_ns > 0, and
    every kernel's `timed` equals its `launches`.

    Grouped by mangled name: one kernel loaded in two modules may fill two kernel rows, and
    its launch records cannot say which row they belong to.
    """
    context = f"\n{describe(run)}" if run is not None else ""
    rows = report.get("kernels", [])
    if kernels is not None:
        rows = [r for r in rows if any(k in names_of(r) for k in kernels)]
    assert rows, f"no kernels to check for timing\n{report_summary(report)}{context}"
    groups = {}
    for r in rows:
        g = groups.setdefault(r.get("mangled"), {"name": r.get("name"), "launches": 0, "timed": 0})
        g["launches"] += r.get("launches") or 0
        g["timed"] += r.get("timed") or 0
    records = {}
    for x in report.get("launches", []):
        records.setdefault(x.get("mangled"), []).append(x)
    problems = []
    for mangled, g in groups.items():
        if g["timed"] != g["launches"]:
            problems.append(f"{g['name']}: timed {g['timed']} != launches {g['launches']}")
        recs = records.get(mangled, [])
        with_time = [x for x in recs if (x.get("gpu_ns") or 0) > 0]
        if len(with_time) != g["launches"]:
            sample = [x.get("gpu_ns") for x in recs[:10]]
            problems.append(f"{g['name']}: {len(with_time)} launch records with gpu_ns > 0 of "
                            f"{len(recs)} records, {g['launches']} launches "
                            f"(first gpu_ns: {sample})")
    assert not problems, "\n".join(problems) + f"\n\n{report_summary(report)}{context}"
