# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the GPU tests: real programs run natively and under clc-run (their helpers are
tests/helpers/gpu_runs.py).

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
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpu_runs import (build_example, EXAMPLES, NOT_PERMITTED, POLICIES, TIMEOUT, assert_all_timed,
                      assert_capture_ok, assert_counts, build_driver_program, build_or_fail,
                      comparable, deny_policy, describe, find_script, kernel_rows, kernel_table,
                      kernel_total, launch_rows, parse_output, probe_driver, report_summary,
                      run_program, strip_params, strip_templates, write_policy)


HERE = Path(__file__).resolve().parent


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
        return run_program(argv, timeout=timeout)
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
        proc = run_program([clc_scripts.run, "--policy", policy, *options, "-o", capture,
                            "--force", "--no-report", "--", *argv], timeout=timeout, env=env)
        captures = sorted(out_dir.glob("cap*.clc"))
        if not captures:
            pytest.fail(f"clc-run wrote no capture in {out_dir}\n{describe(proc)}")
        report_path = out_dir / "report.json"
        rep = run_program([clc_scripts.clc, "report", *captures, "--format", "json", "-o",
                           report_path])
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


@pytest.fixture(scope="session")
def vecadd_bin(nvcc, cuda_arch, build_dir):
    return build_example(nvcc, cuda_arch, build_dir, "vecadd")


@pytest.fixture(scope="session")
def bench_empty_bin(nvcc, cuda_arch, build_dir):
    return build_example(nvcc, cuda_arch, build_dir, "bench_empty")


@pytest.fixture(scope="session")
def driver_api_bin(nvcc, cuda_arch, build_dir):
    """(executable, ptx path): run as [exe, ptx, iterations]."""
    ptx = build_dir / "driver_kernels.ptx"
    build_or_fail("driver_kernels.ptx",
           [[nvcc, "-ptx", f"-arch={cuda_arch}", "-o", ptx, EXAMPLES / "driver_kernels.cu"]])
    return build_driver_program(nvcc, build_dir, "driver_api"), ptx


@pytest.fixture(scope="session")
def tools():
    """gpu_runs' helpers, as one fixture."""
    return SimpleNamespace(
        parse=parse_output, comparable=comparable, describe=describe,
        kernel_rows=kernel_rows, launch_rows=launch_rows, kernel_total=kernel_total,
        kernel_table=kernel_table, report_summary=report_summary, strip_params=strip_params,
        strip_templates=strip_templates, write_policy=write_policy, deny_policy=deny_policy,
        not_permitted=NOT_PERMITTED, assert_capture_ok=assert_capture_ok,
        assert_counts=assert_counts, assert_all_timed=assert_all_timed,
        examples=EXAMPLES, policies=POLICIES,
    )
