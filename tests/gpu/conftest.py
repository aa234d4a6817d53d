# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the GPU tests: real programs run natively and under clc-run.

Everything in this directory is marked `gpu` (pyproject's addopts leave those out of a plain
`pytest`; `make gpu-test` selects them with `-m gpu`). Without a usable NVIDIA driver every
test here is skipped, for one stated reason, before any fixture runs.

The examples are built once per session with nvcc into a temporary directory. clc-run and clc
are the console scripts installed next to sys.executable (`pip install -e .` puts them there),
or else the ones on PATH.

Environment knobs:
    CLC_TEST_CUDA_ARCH   nvcc -arch for the examples (default: the device's, e.g. sm_90)
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
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
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, f"no NVIDIA driver: cannot load libcuda.so.1 ({exc})"
    rc = cuda.cuInit(0)
    if rc != 0:
        return None, f"NVIDIA driver unusable: cuInit(0) returned CUresult {rc}"
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


def pytest_configure(config):
    # pyproject registers the marker too; saying it here keeps this directory self-contained.
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and driver")


def pytest_collection_modifyitems(config, items):
    mine = [it for it in items if HERE in Path(str(it.path)).resolve().parents]
    if not mine:
        return
    info, reason = probe_driver()
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if info is None:
            item.add_marker(pytest.mark.skip(reason=reason))


# ---- running programs ---------------------------------------------------------------------

def _env(extra=None):
    env = dict(os.environ)
    # Output reaches the pipe as it is written, so a run that dies still shows how far it got.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _run(argv, cwd=None, timeout=TIMEOUT, env=None):
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


@pytest.fixture(scope="session")
def clc_scripts():
    scripts = SimpleNamespace(run=find_script("clc-run"), clc=find_script("clc"))
    if not scripts.run or not scripts.clc:
        pytest.fail(f"clc console scripts not found (clc-run: {scripts.run}, clc: {scripts.clc}); "
                    f"looked next to {sys.executable} and on PATH. Install clc with "
                    "`pip install --no-build-isolation --no-deps -e .` in this interpreter.")
    return scripts


@pytest.fixture(scope="session")
def run_native():
    """run_native(argv) -> CompletedProcess, with text stdout/stderr."""
    def run(argv, timeout=TIMEOUT):
        return _run(argv, timeout=timeout)
    return run


@pytest.fixture
def run_clc(clc_scripts):
    """run_clc(policy, argv, tmp_path) -> (CompletedProcess, report dict).

    policy: a path, or a file name under policies/. Each call gets a directory of its own
    under tmp_path, so that two runs in one test never mix their (child) captures. The report
    is `clc report --format json` over the capture and every child capture next to it.
    """
    calls = []

    def run(policy, argv, tmp_path, timeout=TIMEOUT, options=(), env=None):
        """options go to clc-run before `--` (e.g. ["--hooks", FILE]); env adds variables."""
        policy = Path(policy)
        if not policy.is_absolute() and not policy.exists():
            policy = POLICIES / policy
        calls.append(None)
        out_dir = Path(tmp_path) / f"clc-run-{len(calls)}"
        out_dir.mkdir(parents=True, exist_ok=True)
        capture = out_dir / "cap.clc"
        proc = _run([clc_scripts.run, "--policy", policy, *options, "-o", capture, "--force",
                     "--no-report", "--", *argv], timeout=timeout, env=env)
        captures = sorted(out_dir.glob("cap*.clc"))
        if not captures:
            pytest.fail(f"clc-run wrote no capture in {out_dir}\n{describe(proc)}")
        report_path = out_dir / "report.json"
        rep = _run([clc_scripts.clc, "report", *captures, "--format", "json", "-o", report_path])
        if rep.returncode != 0 or not report_path.exists():
            pytest.fail(f"clc report failed\n{describe(rep)}\n\nthe run was:\n{describe(proc)}")
        try:
            report = json.loads(report_path.read_text())
        except ValueError as exc:
            pytest.fail(f"clc report wrote invalid JSON ({exc}): {report_path}\n{describe(rep)}")
        return proc, report

    return run


# ---- building the examples ----------------------------------------------------------------

@pytest.fixture(scope="session")
def nvcc():
    candidates = [shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(str(Path(os.environ[var]) / "bin" / "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and Path(c).exists():
            return c
    pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): cannot build "
                "the CUDA examples")


@pytest.fixture(scope="session")
def cuda_arch():
    if os.environ.get("CLC_TEST_CUDA_ARCH"):
        return os.environ["CLC_TEST_CUDA_ARCH"]
    info, _ = probe_driver()
    if info is None:
        return "sm_90"
    return f"sm_{info.cc[0]}{info.cc[1]}"


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("examples")


def _build(what, attempts):
    """Run the first command of `attempts` that succeeds; fail with every attempt's output."""
    logs = []
    for argv in attempts:
        proc = _run(argv, cwd=REPO, timeout=600)
        if proc.returncode == 0:
            return
        logs.append(describe(proc))
    pytest.fail(f"building {what} failed:\n" + "\n\n".join(logs))


@pytest.fixture(scope="session")
def vecadd_bin(nvcc, cuda_arch, build_dir):
    exe = build_dir / "vecadd"
    _build("vecadd", [[nvcc, "-O2", f"-arch={cuda_arch}", "-o", exe, EXAMPLES / "vecadd.cu"]])
    return exe


@pytest.fixture(scope="session")
def bench_empty_bin(nvcc, cuda_arch, build_dir):
    exe = build_dir / "bench_empty"
    _build("bench_empty",
           [[nvcc, "-O2", f"-arch={cuda_arch}", "-o", exe, EXAMPLES / "bench_empty.cu"]])
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
    _build(name, attempts)
    return exe


@pytest.fixture(scope="session")
def driver_api_bin(nvcc, cuda_arch, build_dir):
    """(executable, ptx path): run as [exe, ptx, iterations]."""
    ptx = build_dir / "driver_kernels.ptx"
    _build("driver_kernels.ptx",
           [[nvcc, "-ptx", f"-arch={cuda_arch}", "-o", ptx, EXAMPLES / "driver_kernels.cu"]])
    return build_driver_program(nvcc, build_dir, "driver_api"), ptx


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


@pytest.fixture(scope="session")
def tools():
    """The helpers above, for the test modules (conftest is not imported by name)."""
    return SimpleNamespace(
        parse=parse_output, comparable=comparable, describe=describe,
        kernel_rows=kernel_rows, launch_rows=launch_rows, kernel_total=kernel_total,
        kernel_table=kernel_table, report_summary=report_summary, strip_params=strip_params,
        strip_templates=strip_templates, write_policy=write_policy, deny_policy=deny_policy,
        not_permitted=NOT_PERMITTED, assert_capture_ok=assert_capture_ok,
        assert_counts=assert_counts, assert_all_timed=assert_all_timed,
        examples=EXAMPLES, policies=POLICIES,
    )
