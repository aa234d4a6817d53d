# SPDX-License-Identifier: Apache-2.0
"""`clc inspect`: run as a command on files nvcc builds at test time."""

import json
import os
import subprocess
import sys

import pytest

from clc.cli.main import build_parser
from kernel_zoo import nvcc_build, zoo_ptx_text

SOURCE = r"""
template <typename T> __global__ void scale(T *x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
template __global__ void scale<float>(float *, float, int);
extern "C" __global__ void plain_c(float *x) { x[threadIdx.x] = 1.0f; }
int main() { plain_c<<<1, 1>>>(nullptr); return 0; }
"""

SCALE = "void scale<float>(float*, float, int) [_Z5scaleIfEvPT_S0_i]"

BUILDS = {
    # SASS for sm_80 and sm_90, PTX for compute_90
    "with_ptx": ["-gencode", "arch=compute_80,code=sm_80",
                 "-gencode", "arch=compute_90,code=[sm_90,compute_90]"],
    "sass_only": ["-gencode", "arch=compute_80,code=sm_80",
                  "-gencode", "arch=compute_90,code=sm_90"],
    "k.ptx": ["-arch=sm_90", "-ptx"],
    "libk.so": ["-arch=sm_90", "-shared", "-Xcompiler", "-fPIC"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    (d / "k.cu").write_text(SOURCE)
    nvcc_build(d, {name: ("k.cu", options) for name, options in BUILDS.items()},
               "these tests build the programs they inspect with it")
    return d


def inspect(*args):
    return subprocess.run([sys.executable, "-m", "clc", "inspect", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def kernel_lines(stdout):
    return {line.split(":")[0]: line for line in stdout.splitlines()
            if line.startswith(("void ", "plain_c"))}


def test_executable_with_ptx(files):
    # WHEN an executable with sm_80/sm_90 SASS and compute_90 PTX is inspected
    proc = inspect(files / "with_ptx")
    # THEN each kernel has one line: names, SASS arches, PTX, and that it can be wrapped
    assert proc.returncode == 0, proc.stderr
    lines = kernel_lines(proc.stdout)
    # AND whether a wrapper may loop its body (no barrier here: yes)
    assert lines[SCALE] == (f"{SCALE}: SASS sm_80, sm_90; PTX 9.0 for sm_90; "
                            "wrappable: PTX for compute_90 (sm_90 and newer), loopable")
    assert lines["plain_c"] == ("plain_c: SASS sm_80, sm_90; PTX 9.0 for sm_90; "
                                "wrappable: PTX for compute_90 (sm_90 and newer), loopable")
    assert proc.stdout.startswith(f"{files / 'with_ptx'}: ELF executable, .nv_fatbin:")
    assert "kernels: 2\n" in proc.stdout


def test_executable_without_ptx(files):
    proc = inspect(files / "sass_only")
    assert proc.returncode == 0, proc.stderr
    # THEN without PTX nothing is said about looping either
    assert kernel_lines(proc.stdout)["plain_c"] == (
        "plain_c: SASS sm_80, sm_90; PTX none; "
        "not wrappable: no PTX (SASS for sm_80, sm_90 only)")
    report = json.loads(inspect(files / "sass_only", "--json").stdout)
    assert {(k["loopable"], k["loop_reason"]) for k in report["kernels"]} == {(None, None)}


def test_json(files):
    # WHEN the executable is inspected with --json
    proc = inspect(files / "with_ptx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # THEN the kernels and the entries are there, as data, as clc/schemas says
    from test_schemas import valid
    valid("inspect-1", report)
    assert report["version"] == 1 and report["kind"] == "host-elf"
    kernels = {k["name"]: k for k in report["kernels"]}
    assert set(kernels) == {"_Z5scaleIfEvPT_S0_i", "plain_c"}
    scale = kernels["_Z5scaleIfEvPT_S0_i"]
    assert scale["demangled"] == "void scale<float>(float*, float, int)"
    assert scale["sass"] == ["sm_80", "sm_90"]
    assert scale["ptx"] == [{"version": "9.0", "target": "sm_90", "name": "compute_90"}]
    assert scale["wrappable"] is True
    assert scale["summary"] == "PTX for compute_90 (sm_90 and newer)"
    assert scale["loopable"] is True
    assert scale["loop_reason"] == ("no block barrier: its exits can become branches to the "
                                    "next step")
    ptx = [e for e in report["entries"] if e["kind"] == "ptx"]
    assert [(e["name"], e["compression"], e["section"]) for e in ptx] == [
        ("compute_90", "zstd", ".nv_fatbin")]
    assert set(ptx[0]["kernels"]) == set(kernels)


def test_ptx_file_json(files):
    proc = inspect(files / "k.ptx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "ptx"
    assert [(k["name"], k["sass"], k["wrappable"], k["loopable"])
            for k in report["kernels"]] == [("plain_c", [], True, True),
                                            ("_Z5scaleIfEvPT_S0_i", [], True, True)]


# A kernel that leaves on a thread-dependent condition before a barrier, next to one whose
# early exit is taken by whole blocks: hand-written, so no nvcc is needed.
LOOP_PTX = """.version 9.0
.target sm_90
.address_size 64

.visible .entry early(.param .u32 early_param_0)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	ld.param.u32 %r1, [early_param_0];
	mov.u32 %r2, %tid.x;
	setp.ge.u32 %p1, %r2, %r1;
	@%p1 bra $L_end;
	bar.sync 0;
$L_end:
	ret;
}

.visible .entry uniform(.param .u32 uniform_param_0)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	ld.param.u32 %r1, [uniform_param_0];
	mov.u32 %r2, %ctaid.x;
	setp.ge.u32 %p1, %r2, %r1;
	@%p1 bra $L_end;
	bar.sync 0;
$L_end:
	ret;
}
"""


def test_loop_verdicts_in_text_and_json(tmp_path):
    # GIVEN a PTX file with a kernel that may loop and one that may not
    path = tmp_path / "loops.ptx"
    path.write_text(LOOP_PTX)
    # WHEN it is inspected
    proc = inspect(path)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split(":")[0]: line for line in proc.stdout.splitlines()}
    # THEN the refusal and its reason follow the wrappability
    reason = ("a block barrier can run after a thread-divergent exit: `@%p1 bra $L_end` "
              "(line 12) depends on %tid.x, so some threads may leave while others reach "
              "bar.sync at line 13; looped, they would wait at different barrier generations")
    assert lines["early"] == ("early: SASS none; PTX 9.0 for sm_90; wrappable: PTX for "
                              f"compute_90 (sm_90 and newer), not loopable: {reason}")
    assert lines["uniform"].endswith("(sm_90 and newer), loopable")
    # AND --json carries the same
    report = json.loads(inspect(path, "--json").stdout)
    kernels = {k["name"]: k for k in report["kernels"]}
    assert (kernels["early"]["loopable"], kernels["early"]["loop_reason"]) == (False, reason)
    assert kernels["uniform"]["loopable"] is True
    assert kernels["uniform"]["loop_reason"] == ("1 block barrier, and no thread-divergent "
                                                 "exit before one")


def zoo_lines(zoo_ptx, tmp_path, name):
    """The lines `clc inspect` prints for a zoo program's PTX, after its header."""
    path = tmp_path / name.replace(".cu", ".ptx")
    path.write_text(zoo_ptx_text(zoo_ptx, name))
    proc = inspect(path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[3:]


def test_kernels_no_wrapper_can_wrap_say_why(zoo_ptx, tmp_path):
    # WHEN a cooperative kernel (grid sync) is inspected THEN it is not wrappable, by any
    # wrapper, and the line says why, as `clc wrap` does
    assert zoo_lines(zoo_ptx, tmp_path, "cooperative.cu") == [
        "grid_sync_kernel: SASS none; PTX 9.0 for sm_90; not wrappable: cooperative kernel: "
        "reads %envreg2 (line 29), the grid-sync workspace; the program sizes a cooperative "
        "grid by the original kernel's occupancy, which a wrapped copy does not have"]
    # AND so is a kernel that uses a __device__ variable
    (line,) = zoo_lines(zoo_ptx, tmp_path, "printf_kernel.cu")
    assert line.startswith("hello_printf: SASS none; PTX 9.0 for sm_90; not wrappable: uses "
                           "the module variable g_printed (__device__, line "), line
    # AND --json has each wrapper's verdict
    path = tmp_path / "cooperative.ptx"
    report = json.loads(inspect(path, "--json").stdout)
    (kernel,) = report["kernels"]
    assert kernel["wrappable"] is False
    assert kernel["summary"].startswith("cooperative kernel: reads %envreg2")
    assert {w: v["wrappable"] for w, v in kernel["wrappers"].items()} == {
        "sm_share": False, "block_count": False, "deadline": False}


def test_wrappers_that_disagree_are_listed_one_by_one(zoo_ptx, tmp_path):
    # WHEN a kernel whose body may not loop is inspected
    lines = zoo_lines(zoo_ptx, tmp_path, "divergent_exit.cu")
    # THEN its line keeps the usual form, and each wrapper's verdict follows: sm_share, which
    # loops the body, refuses it; block_count and deadline run it once per block
    assert lines[0].startswith("divergent_exit_then_barrier: SASS none; PTX 9.0 for sm_90; "
                               "wrappable: PTX for compute_90 (sm_90 and newer), not loopable: "
                               "a block barrier can run after a thread-divergent exit")
    assert lines[1].startswith("  sm_share: not wrappable: sm_share runs the body in a loop, "
                               "and this kernel's may not loop: a block barrier can run after")
    assert lines[2:] == ["  block_count: wrappable, its body run once per block (1:1)",
                         "  deadline: wrappable, its body run once per block (1:1)"]
    # AND a kernel that every wrapper takes has no such lines
    assert zoo_lines(zoo_ptx, tmp_path, "grid_stride.cu") == [
        "grid_stride_saxpy: SASS none; PTX 9.0 for sm_90; wrappable: PTX for compute_90 "
        "(sm_90 and newer), loopable"]


def test_ptx_the_analyser_cannot_parse(tmp_path):
    # GIVEN PTX whose kernel is found but whose body never closes
    path = tmp_path / "broken.ptx"
    path.write_text(".version 9.0\n.target sm_90\n.address_size 64\n"
                    ".visible .entry k()\n{\n\tret;\n")
    proc = inspect(path)
    # THEN inspect still lists it, not wrappable and not loopable, with the parse error and
    # where
    assert proc.returncode == 0, proc.stderr
    assert "; not wrappable, not loopable: its compute_90 PTX" in proc.stdout
    assert proc.stdout.splitlines()[-1].endswith(
        "not loopable: its compute_90 PTX does not parse: 5:1: '{' is never closed")


def test_shared_library(files):
    proc = inspect(files / "libk.so")
    assert proc.returncode == 0, proc.stderr
    assert ": ELF shared library, .nv_fatbin:" in proc.stdout.splitlines()[0]
    assert "wrappable: PTX for compute_90 (sm_90 and newer)" in kernel_lines(
        proc.stdout)[SCALE]


def test_random_file_exits_2(tmp_path):
    # GIVEN a file that is no CUDA image
    path = tmp_path / "random.bin"
    path.write_bytes(os.urandom(4096))
    # WHEN it is inspected THEN the status is 2 and the error names the path and why
    proc = inspect(path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert f"clc: {path}: not a fatbin, cubin, PTX text or ELF file" in proc.stderr


def test_host_elf_without_device_code_exits_2():
    # GIVEN an ELF program with no CUDA code: the Python running the tests
    with open(os.path.realpath(sys.executable), "rb") as f:
        if f.read(4) != b"\x7fELF":
            pytest.skip(f"{sys.executable} is not an ELF file")
    proc = inspect(sys.executable)
    assert proc.returncode == 2
    assert "without CUDA device code" in proc.stderr


def test_truncated_executable_exits_2(files, tmp_path):
    path = tmp_path / "cut"
    path.write_bytes((files / "with_ptx").read_bytes()[:100000])
    proc = inspect(path)
    assert proc.returncode == 2
    assert "(at byte " in proc.stderr and str(path) in proc.stderr


def test_missing_file_exits_2(tmp_path):
    proc = inspect(tmp_path / "nope")
    assert proc.returncode == 2
    assert "cannot read it" in proc.stderr


def test_registered_with_help():
    # GIVEN the clc parser THEN inspect is one of its commands, and its help says what it
    # reports
    args = build_parser().parse_args(["inspect", "x", "--json"])
    assert args.command == "inspect" and args.json and args.path == "x"
    proc = subprocess.run([sys.executable, "-m", "clc", "inspect", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "SASS architectures" in text and "wrap" in text and "PTX" in text
    assert "loop" in text
