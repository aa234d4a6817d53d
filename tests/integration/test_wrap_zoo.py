# SPDX-License-Identifier: Apache-2.0
"""Every kernel of the zoo (tests/fixtures/zoo), spliced with every built-in wrapper and linked
by nvJitLink for sm_90, or refused with the reason the design expects; the user policies of
examples/wrappers built the same way. No GPU needed: NVRTC and nvJitLink run on the CPU
(cuda-bindings and the nvidia-cuda-nvrtc / nvidia-nvjitlink wheels)."""

import pathlib

import pytest

from kernel_zoo import zoo_ptx_text
from clc.wrapping.fatbin import cubin_kernels
from clc.wrapping.ptx import parse
from clc.wrapping.splice import ARG_SIZE, Unwrappable, splice
from clc.wrapping.build import WrapBuildError, build, cubin_resources, link, wrapper_spec

pytest.importorskip("cuda.bindings.nvjitlink", reason="wrapping needs cuda-bindings")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
WRAPPERS = {"sm_share": {"share": 0.25}, "block_count": {}, "deadline": {"ms": 5}}

# (file, kernel) -> {wrapper: None (built) or a phrase of the refusal}. sm_share needs the loop;
# the others run the body once per block (1:1) and need only the remap.
_SHARED = "uses the module variable"
_LOOP = "sm_share runs the body in a loop, and this kernel's may not loop"
CASES = {
    ("grid_stride.cu", "grid_stride_saxpy"): {},
    ("grid2d3d.cu", "transpose2d"): {},
    ("grid2d3d.cu", "volume3d"): {},
    ("dyn_shared.cu", "reverse_dynamic_smem"): {},
    ("struct_param.cu", "axpy_struct"): {},
    ("templates.cu", "_Z7scale_tIfEvPT_S0_i"): {},
    ("templates.cu", "_Z7scale_tIiEvPT_S0_i"): {},
    ("reduction.cu", "block_reduce_sum"): {},
    ("atomics.cu", "histogram_atomic"): {},
    ("graph_replay.cu", "graph_accumulate"): {},
    ("divergent_exit.cu", "divergent_exit_then_barrier"): {
        "sm_share": _LOOP + ": a block barrier can run after a thread-divergent exit"},
    ("cooperative.cu", "grid_sync_kernel"): {w: "cooperative kernel: reads %envreg"
                                             for w in WRAPPERS},
    ("clusters.cu", "cluster_kernel"): {w: "cluster kernel" for w in WRAPPERS},
    ("printf_kernel.cu", "hello_printf"): {w: _SHARED + " g_printed" for w in WRAPPERS},
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("name,kernel", sorted(CASES))
def test_zoo_kernel_wraps_or_is_refused_with_its_reason(zoo_ptx, name, kernel, wrapper):
    ptx = zoo_ptx_text(zoo_ptx, name)
    spec = wrapper_spec(wrapper, WRAPPERS[wrapper])
    refusal = CASES[(name, kernel)].get(wrapper)
    if refusal is not None:
        # WHEN a kernel the design says cannot be wrapped so is built THEN it is refused, why
        with pytest.raises(Unwrappable) as caught:
            build(ptx, kernel, spec, 90)
        assert refusal in str(caught.value)
        return
    # WHEN the kernel is spliced with the wrapper and linked for sm_90
    built = build(ptx, kernel, spec, 90)
    # THEN the cubin defines the kernel under its own name, with its registers and shared
    # memory readable, and it loops exactly when the wrapper needs a loop
    assert kernel in cubin_kernels(built.cubin)
    resources = cubin_resources(built.cubin)[kernel]
    assert resources["registers"] and resources["registers"] <= 255
    # AND the register limit that keeps a looped kernel in its original's register class
    # costs no spill
    assert resources["stack"] == 0
    assert built.looped == (wrapper == "sm_share")
    original = parse(ptx).entries[kernel]
    assert built.params == len(original.params)


@pytest.mark.parametrize("name,kernel", [("reduction.cu", "block_reduce_sum"),
                                         ("grid2d3d.cu", "transpose2d")])
def test_splice_keeps_directives_and_appends_one_parameter(zoo_ptx, name, kernel):
    ptx = zoo_ptx_text(zoo_ptx, name)
    before = parse(ptx).entries[kernel]
    # WHEN spliced
    spliced = splice(ptx, kernel)
    after = parse(spliced.ptx)
    fn = after.entries[kernel]
    # THEN only this entry is left, with its directives, and one 32-byte parameter more
    assert list(after.entries) == [kernel]
    assert [str(d) for d in fn.directives] == [str(d) for d in before.directives]
    assert [str(p) for p in fn.params[:-1]] == [str(p) for p in before.params]
    assert str(fn.params[-1]) == f".param .align 8 .b8 __clc_arg[{ARG_SIZE}]"
    # AND no %ctaid/%nctaid read or ret/exit of the original is left in its body
    text = "\n".join(fn.body.lines(1))
    assert "%ctaid" not in text and "%nctaid" not in text
    assert sum(1 for line in text.splitlines() if line.strip() == "ret;") == 1  # the wrapper's


def test_user_policies_in_both_interfaces_build(zoo_ptx):
    ptx = zoo_ptx_text(zoo_ptx, "grid_stride.cu")
    for path, params in ((EXAMPLES / "wrappers" / "max_steals.cu", {"MAX_STEALS": 4}),
                         (EXAMPLES / "wrappers" / "throttle.cu", {"DELAY_NS": 500})):
        # WHEN a device policy file wraps a loopable kernel
        built = build(ptx, "grid_stride_saxpy", wrapper_spec(str(path), params), 90)
        # THEN it links, and the body loops (blocks may claim more virtual blocks)
        assert "grid_stride_saxpy" in cubin_kernels(built.cubin)
        assert built.looped


def test_user_policy_compile_error_shows_the_nvrtc_log(zoo_ptx, tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __device__ void Policy_init(void *s) { undefined_thing(); }\n')
    # WHEN a policy does not compile THEN the error carries NVRTC's log, naming the file
    with pytest.raises(WrapBuildError) as caught:
        build(zoo_ptx_text(zoo_ptx, "grid_stride.cu"), "grid_stride_saxpy",
              wrapper_spec(str(bad)), 90)
    assert "NVRTC could not compile bad.cu" in str(caught.value)
    assert "undefined_thing" in str(caught.value)


def test_user_policy_with_half_the_demo_interface_is_refused(zoo_ptx, tmp_path):
    half = tmp_path / "half.cu"
    half.write_text('extern "C" __device__ void Policy_init(void *s) {}\n')
    with pytest.raises(WrapBuildError) as caught:
        build(zoo_ptx_text(zoo_ptx, "grid_stride.cu"), "grid_stride_saxpy",
              wrapper_spec(str(half)), 90)
    assert "defines Policy_init but not Policy_should_try_steal" in str(caught.value)


def test_link_error_carries_the_nvjitlink_log():
    # A PTX that calls a function nobody defines
    ptx = (".version 8.0\n.target sm_90\n.address_size 64\n"
           ".extern .func nowhere();\n.visible .entry k()\n{\ncall.uni nowhere, ();\nret;\n}\n")
    with pytest.raises(WrapBuildError) as caught:
        link([("k.ptx", ptx)], 90, "k")
    assert "nvJitLink could not link k for sm_90" in str(caught.value)
    assert "nowhere" in str(caught.value)


def test_nvrtc_output_is_kept_on_disk_for_later_processes(tmp_path, monkeypatch):
    from cuda.bindings import nvrtc

    from clc.wrapping import build as wrapbuild
    from clc.wrapping.cache import DiskCache
    cache = DiskCache(root=tmp_path)
    spec = wrapper_spec("sm_share", {"share": 0.5})
    # GIVEN the wrapper's runtime compiled once with a disk cache
    monkeypatch.setattr(wrapbuild, "_compiled", {})
    first = wrapbuild.runtime_inputs(spec, 90, True, cache)
    assert [e.metadata for e in cache.entries()] == [
        {"kind": "ptx", "source": "clc_runtime.cu", "arch": "compute_90"}]
    # WHEN a later process (nothing in memory) needs it, and NVRTC would fail if asked
    monkeypatch.setattr(wrapbuild, "_compiled", {})

    def no_compile(*args):
        raise AssertionError("NVRTC compiled again")
    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", no_compile)
    # THEN the PTX comes from disk, the same bytes
    assert wrapbuild.runtime_inputs(spec, 90, True, cache) == first
    # AND other options are another entry: NVRTC is asked for them
    with pytest.raises(AssertionError, match="NVRTC compiled again"):
        wrapbuild.runtime_inputs(spec, 90, False, cache)


def test_build_key_follows_the_splice_and_runtime_code(monkeypatch):
    # GIVEN a build key for a kernel WHEN clc's splice, PTX printer or runtime changes (an
    # upgrade) THEN the key changes: the disk cache does not hand back an older clc's cubin
    from clc.wrapping import build as wrapbuild
    spec = wrapbuild.wrapper_spec("block_count", {})
    before = wrapbuild.build_key("ptx", "k", spec, 90)
    assert wrapbuild.build_key("ptx", "k", spec, 90) == before
    monkeypatch.setattr(wrapbuild, "_sources", [wrapbuild._pipeline_sources() + b"# changed"])
    assert wrapbuild.build_key("ptx", "k", spec, 90) != before
