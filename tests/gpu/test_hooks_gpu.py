# SPDX-License-Identifier: Apache-2.0
"""The examples/hooks files on real programs: the runtime-API example and PyTorch.

Each example's effect is checked twice: in the program's own output (what it saw from its
CUDA calls) and in the capture (what clc counted).
"""

import re
import sys

import pytest

pytestmark = pytest.mark.gpu

ITERATIONS = 40
VECADD_N = 1 << 24  # examples/vecadd.cu's element count, its vecAdd's 4th argument


@pytest.fixture(scope="module")
def hooks(tools):
    return tools.examples / "hooks"


@pytest.fixture
def allow_all(tools, tmp_path):
    return tools.write_policy(tmp_path / "allow.yaml", [])


@pytest.fixture(scope="module")
def vecadd_native(vecadd_bin, run_native, tools):
    proc = run_native([vecadd_bin, ITERATIONS])
    assert proc.returncode == 0, tools.describe(proc)
    return proc


def counts_of(report, tools, kernels):
    return {k: tools.kernel_total(report, k, "launches") for k in kernels}


def test_arg_guard_reads_the_real_argument(vecadd_bin, vecadd_native, run_clc, tools, hooks,
                                           allow_all, tmp_path):
    # GIVEN a limit under vecAdd's n, read from its 4th argument at every launch
    proc, report = run_clc(allow_all, [vecadd_bin, ITERATIONS], tmp_path,
                           options=["--hooks", hooks / "arg_guard.py"],
                           env={"CLC_MAX_N": str(VECADD_N - 1)})
    out = tools.parse(proc.stdout)
    # THEN every vecAdd launch is refused, and the program says so; the other kernels run
    assert proc.returncode == 0, tools.describe(proc)
    assert any(k == "vecAdd" and tools.not_permitted.search(m) for k, m in out.errors), \
        tools.describe(proc)
    assert out.results.get("scale_kernel") == "ok" and out.results.get("debug_fill") == "ok"
    launches = tools.kernel_total(report, "vecAdd", "launches")
    assert launches == ITERATIONS
    assert tools.kernel_total(report, "vecAdd", "denied") == launches
    assert tools.kernel_total(report, "scale_kernel", "denied") == 0
    # AND the message names the value the hook read from the program's memory
    assert f"n={VECADD_N} is over the limit of {VECADD_N - 1}" in proc.stderr, proc.stderr

    # WHEN the limit is n itself, nothing is refused and the output is the native one
    proc, report = run_clc(allow_all, [vecadd_bin, ITERATIONS], tmp_path,
                           options=["--hooks", hooks / "arg_guard.py"],
                           env={"CLC_MAX_N": str(VECADD_N)})
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.comparable(proc.stdout) == tools.comparable(vecadd_native.stdout)
    assert tools.kernel_total(report, "vecAdd", "denied") == 0


def test_tenant_budget_on_vecadd(vecadd_bin, run_clc, tools, hooks, allow_all, tmp_path):
    budget = 25
    proc, report = run_clc(allow_all, [vecadd_bin, ITERATIONS], tmp_path,
                           options=["--hooks", hooks / "tenant_budget.py", "--tenant", "gpu-a"],
                           env={"CLC_BUDGET": str(budget)})
    assert proc.returncode == 0, tools.describe(proc)
    kernels = ("vecAdd", "scale_kernel", "debug_fill")
    total = sum(counts_of(report, tools, kernels).values())
    denied = sum(tools.kernel_total(report, k, "denied") for k in kernels)
    # THEN exactly the budget ran, the rest was refused, and the exit hook's line agrees
    assert total > budget and denied == total - budget, tools.kernel_table(report)
    assert re.findall(r"^clc-budget: .*$", proc.stderr, re.M) == [
        f"clc-budget: tenant=gpu-a launches={total} allowed={budget} denied={total - budget} "
        f"budget={budget}"], proc.stderr
    assert tools.parse(proc.stdout).errors, "the program saw no refused launch"


def test_sampler_on_vecadd(vecadd_bin, vecadd_native, run_clc, tools, hooks, allow_all,
                           tmp_path):
    every = 7
    proc, report = run_clc(allow_all, [vecadd_bin, ITERATIONS], tmp_path,
                           options=["--hooks", hooks / "sampler.py"],
                           env={"CLC_SAMPLE_EVERY": str(every)})
    assert proc.returncode == 0, tools.describe(proc)
    # THEN the program runs as without clc, and one launch in 7 of each kernel is recorded
    assert tools.comparable(proc.stdout) == tools.comparable(vecadd_native.stdout)
    for kernel in ("vecAdd", "scale_kernel", "debug_fill"):
        launches = tools.kernel_total(report, kernel, "launches")
        assert tools.kernel_total(report, kernel, "recorded") == launches // every, kernel
        assert len(tools.launch_rows(report, kernel)) == launches // every


@pytest.fixture(scope="module")
def torch_snippet(tools):
    pytest.importorskip("torch")
    return [sys.executable, tools.examples / "torch_snippet.py", "--iterations", 12]


def test_sampler_on_pytorch(torch_snippet, run_native, run_clc, tools, hooks, allow_all,
                            tmp_path):
    native = run_native(torch_snippet)
    assert native.returncode == 0, tools.describe(native)
    every = 5
    proc, report = run_clc(allow_all, torch_snippet, tmp_path,
                           options=["--hooks", hooks / "sampler.py"],
                           env={"CLC_SAMPLE_EVERY": str(every)})
    assert proc.returncode == 0, tools.describe(proc)
    # THEN PyTorch computes the same result, and each kernel has one record per 5 launches
    assert tools.parse(proc.stdout).done == tools.parse(native.stdout).done
    kernels = report["kernels"]
    assert kernels
    for row in kernels:
        assert row["recorded"] == row["launches"] // every, row


def test_tenant_budget_on_pytorch(torch_snippet, run_native, run_clc, tools, hooks, allow_all,
                                  tmp_path):
    # GIVEN a budget larger than the program's launches: the hook counts, refuses nothing
    native = run_native(torch_snippet)
    proc, report = run_clc(allow_all, torch_snippet, tmp_path,
                           options=["--hooks", hooks / "tenant_budget.py", "--tenant", "torch"],
                           env={"CLC_BUDGET": "1000000"})
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.parse(proc.stdout).done == tools.parse(native.stdout).done
    total = sum(row["launches"] for row in report["kernels"])
    # THEN the exit hook's count is clc's own count of the program's launches
    assert re.findall(r"^clc-budget: .*$", proc.stderr, re.M) == [
        f"clc-budget: tenant=torch launches={total} allowed={total} denied=0 "
        f"budget=1000000"], proc.stderr
