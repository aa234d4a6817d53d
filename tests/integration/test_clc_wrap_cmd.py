# SPDX-License-Identifier: Apache-2.0
"""`clc wrap`: a wrapped kernel built offline from an nvcc executable, with its resources next
to the original's; refusals and bad arguments said clearly. No GPU needed."""

import json
import subprocess

import pytest

from kernel_zoo import FILES, ZOO, cuda_tool, zoo_ptx_text
from clc.cli.main import main
from clc.wrapping.fatbin import cubin_kernels

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


def test_wrap_never_overwrites_nor_follows_a_link_without_force(exe, tmp_path, capsys):
    argv = ["wrap", str(exe["templates"]), "--kernel", "scale_t<float>", "--wrapper",
            "block_count"]
    # GIVEN an existing file, and a link to another user's file
    existing = tmp_path / "w.cubin"
    existing.write_bytes(b"keep me")
    victim = tmp_path / "victim"
    victim.write_bytes(b"theirs")
    link = tmp_path / "link.cubin"
    link.symlink_to(victim)
    # THEN neither is written, each with its reason, before anything is built
    assert main(argv + ["-o", str(existing)]) == 2
    assert "exists (use --force to overwrite it)" in capsys.readouterr().err
    assert main(argv + ["-o", str(link), "--force"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert existing.read_bytes() == b"keep me" and victim.read_bytes() == b"theirs"
    # AND with --force the existing file is replaced by the cubin
    assert main(argv + ["-o", str(existing), "--force"]) == 0
    assert "_Z7scale_tIfEvPT_S0_i" in cubin_kernels(existing.read_bytes())


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


# What `clc wrap` is given for each built-in wrapper.
WRAPPER_ARGS = {"sm_share": ["--param", "share=0.25"], "block_count": [],
                "deadline": ["--param", "ms=5"]}
# The zoo kernels that some wrapper refuses, and the wrappers that take them; every other zoo
# kernel is wrapped by all three.
PARTLY = {"grid_sync_kernel": set(), "cluster_kernel": set(), "hello_printf": set(),
          "divergent_exit_then_barrier": {"block_count", "deadline"}}


@pytest.mark.parametrize("name", FILES)
def test_inspect_says_wrappable_exactly_when_clc_wrap_builds(zoo_ptx, tmp_path, capsys, name):
    # GIVEN a zoo program's PTX, inspected
    path = tmp_path / name.replace(".cu", ".ptx")
    path.write_text(zoo_ptx_text(zoo_ptx, name))
    assert main(["inspect", "--json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kernels"]
    for kernel in report["kernels"]:
        verdicts = kernel["wrappers"]
        assert set(verdicts) == set(WRAPPER_ARGS)
        for wrapper, args in WRAPPER_ARGS.items():
            out = tmp_path / f"{kernel['name']}.{wrapper}.cubin"
            # WHEN clc wrap builds each of its kernels with each wrapper
            code = main(["wrap", str(path), "--kernel", kernel["name"], "--wrapper", wrapper,
                         *args, "-o", str(out)])
            said = capsys.readouterr()
            verdict = verdicts[wrapper]
            # THEN it succeeds exactly when inspect said the wrapper can wrap the kernel
            assert (code == 0) == verdict["wrappable"], (kernel["name"], wrapper, said.err)
            if code == 0:
                assert out.exists()
                # AND its body loops exactly when inspect said so
                assert ("looped (claims virtual blocks)" in said.out) == verdict["looped"]
            else:
                # AND a refusal gives inspect's reason
                assert code == 1 and verdict["reason"] in said.err, (verdict, said.err)
        wrappable = {w for w, v in verdicts.items() if v["wrappable"]}
        assert wrappable == PARTLY.get(kernel["name"], set(WRAPPER_ARGS)), kernel["name"]
        assert kernel["wrappable"] == bool(wrappable)


def test_wrap_refuses_ptx_it_cannot_parse_as_inspect_does(tmp_path, capsys):
    # GIVEN PTX whose kernel body never closes
    path = tmp_path / "broken.ptx"
    path.write_text(".version 9.0\n.target sm_90\n.address_size 64\n"
                    ".visible .entry k()\n{\n\tret;\n")
    # WHEN it is inspected and wrapped THEN both refuse, for the same reason
    assert main(["inspect", str(path)]) == 0
    assert "k: SASS none; PTX 9.0 for sm_90; not wrappable, not loopable: its compute_90 PTX " \
           "does not parse: 5:1: '{' is never closed" in capsys.readouterr().out
    code = main(["wrap", str(path), "--kernel", "k", "--wrapper", "block_count", "-o",
                 str(tmp_path / "w.cubin")])
    assert code == 1
    assert "k cannot be wrapped with block_count: its PTX does not parse: 5:1: '{' is never " \
           "closed" in capsys.readouterr().err
