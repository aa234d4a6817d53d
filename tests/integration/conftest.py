# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the shim tests: the fake driver and programs, built once, and runners."""

import concurrent.futures
import subprocess

import pytest

from clc.runtime.shim import bridge_path, preload_path
from harness import ROOT, Run, clc_command, env_for, gcc
from hook_runs import COUNT
from kernel_zoo import FILES, ZOO, cuda_tool

from build import build_native  # tests/fixtures/native, put on sys.path by harness

@pytest.fixture(scope="session")
def zoo_ptx(tmp_path_factory):
    """{file name: PTX text}, every zoo program compiled with nvcc -ptx -arch=sm_90 at once."""
    nvcc = cuda_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin, nvidia-cuda-nvcc): "
                    "the zoo is compiled with it")
    out = tmp_path_factory.mktemp("zoo_ptx")

    def build(name):
        target = out / name.replace(".cu", ".ptx")
        proc = subprocess.run([nvcc, "-ptx", "-arch=sm_90", "-I", str(ZOO), str(ZOO / name),
                               "-o", str(target)], capture_output=True, text=True, timeout=300)
        return name, (target.read_text() if proc.returncode == 0 else proc)

    present = [f for f in FILES if (ZOO / f).exists()]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(present) or 1)) as pool:
        return dict(pool.map(build, present))


@pytest.fixture(scope="session")
def bench_inproc(native, tmp_path_factory):
    """examples/bench_inproc built against the fake driver."""
    out = tmp_path_factory.mktemp("inproc")
    gcc(out, ROOT / "examples" / "bench_real.c", "libbench_real.so", "-ldl", shared=True)
    return gcc(out, ROOT / "examples" / "bench_inproc.c", "bench_inproc", f"-L{out}",
               "-lbench_real", f"-L{native['libcuda'].parent}", "-lcuda", "-ldl",
               f"-Wl,-rpath,{out}")


@pytest.fixture(scope="session")
def native(tmp_path_factory):
    if preload_path() is None or bridge_path() is None:
        pytest.fail("the shim is not built: run the tests through `make test` (pip install -e .)")
    return build_native(tmp_path_factory.mktemp("native"))


@pytest.fixture
def clc_run(native, tmp_path):
    """Run argv under clc-run with a policy given as YAML text."""

    def run(policy, argv, *, options=(), env=None, timeout=120, output=None):
        output = output or tmp_path / "cap.clc"
        cmd = clc_command()
        if policy is not None:
            policy_file = tmp_path / "policy.yaml"
            policy_file.write_text(policy)
            cmd += ["--policy", str(policy_file)]
        cmd += ["-o", str(output), "--force", *options, "--", *map(str, argv)]
        proc = subprocess.run(cmd, env=env_for(native, env), capture_output=True, text=True,
                              timeout=timeout, cwd=tmp_path)
        return Run(proc, output)

    return run


@pytest.fixture
def run_native(native):
    def run(argv, env=None, timeout=120):
        return subprocess.run([str(a) for a in argv], env=env_for(native, env),
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def run_params(clc_run, native, tmp_path):
    """prog_params COUNT under clc-run with the policy text and hook files given; the hooks'
    log is tmp_path/hooks.log ($CLC_TEST_OUT)."""

    def run(policy, hooks=(), env=None, count=COUNT, options=()):
        opts = [o for h in hooks for o in ("--hooks", str(h))] + list(options)
        return clc_run(policy, [native["prog_params"], str(count)], options=opts,
                       env={"CLC_TEST_OUT": str(tmp_path / "hooks.log"), **(env or {})})

    return run
