# SPDX-License-Identifier: Apache-2.0
"""`clc wrap`: a wrapped kernel built offline from an nvcc executable, with its resources next
to the original's; refusals and bad arguments said clearly. No GPU needed."""

import subprocess

import pytest

from conftest import ZOO, cuda_tool
from clc.cli import main
from clc.fatbin import cubin_kernels

pytest.importorskip("cuda.bindings.nvjitlink", reason="wrapping needs cuda-bindings")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    nvcc = cuda_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    out = tmp_path_factory.mktemp("wrapcmd")
    built = {}
    for name in ("templates", "clusters"):
        path = out / name
        subprocess.run([nvcc, "-O2", "-arch=sm_90", "-I", str(ZOO), "-o", str(path),
                        str(ZOO / f"{name}.cu")], check=True, capture_output=True, timeout=300)
        built[name] = path
    return built


def test_wrap_builds_a_cubin_and_compares_resources(exe, tmp_path, capsys):
    out = tmp_path / "w.cubin"
    # WHEN a template kernel of an executable is wrapped by its demangled name
    code = main(["wrap", str(exe["templates"]), "--kernel", "scale_t<float>", "--wrapper",
                 "sm_share", "--param", "share=0.5", "-o", str(out)])
    text = capsys.readouterr().out
    # THEN the cubin defines the kernel, and the report names it, its PTX, the wrapper and
    # the registers of both versions
    assert code == 0
    assert "_Z7scale_tIfEvPT_S0_i" in cubin_kernels(out.read_bytes())
    assert "kernel:  void scale_t<float>(float*, float, int) [_Z7scale_tIfEvPT_S0_i]" in text
    assert "from:    compute_90 PTX of" in text and "wrapper: sm_share share=0.5" in text
    assert "looped (claims virtual blocks)" in text
    assert any(line.startswith("registers") and len(line.split()) == 3
               for line in text.splitlines())


def test_wrap_refuses_a_cluster_kernel_with_the_reason(exe, tmp_path, capsys):
    code = main(["wrap", str(exe["clusters"]), "--kernel", "cluster_kernel", "--wrapper",
                 "block_count", "-o", str(tmp_path / "w.cubin")])
    assert code == 1
    assert "cluster_kernel cannot be wrapped with block_count: cluster kernel" in \
        capsys.readouterr().err
    assert not (tmp_path / "w.cubin").exists()


@pytest.mark.parametrize("argv,fragment", [
    (["--kernel", "nope", "--wrapper", "block_count"], "no kernel 'nope' in this file"),
    (["--kernel", "scale_t<int>", "--wrapper", "sm_share"], "give exactly one of share"),
    (["--kernel", "scale_t<int>", "--wrapper", "deadline", "--param", "ms"],
     "--param 'ms': expected NAME=NUMBER"),
    (["--kernel", "scale_t<int>", "--wrapper", "block_count", "--arch", "hopper"],
     "--arch 'hopper': expected sm_NN"),
])
def test_wrap_usage_errors(exe, tmp_path, capsys, argv, fragment):
    code = main(["wrap", str(exe["templates"]), *argv, "-o", str(tmp_path / "w.cubin")])
    assert code == 2
    assert fragment in capsys.readouterr().err
