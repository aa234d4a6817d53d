# SPDX-License-Identifier: Apache-2.0
"""`clc inspect`: run as a command on files nvcc builds at test time."""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

import pytest

from clc.cli import build_parser

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
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None)
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin): these tests build the "
                    "programs they inspect with it")
    d = tmp_path_factory.mktemp("inspect")
    (d / "k.cu").write_text(SOURCE)

    def build(name):
        return name, subprocess.run([nvcc, *BUILDS[name], "k.cu", "-o", name], cwd=d,
                                    capture_output=True, text=True, timeout=300)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for name, proc in pool.map(build, BUILDS):
            if proc.returncode != 0:
                pytest.fail(f"nvcc {' '.join(BUILDS[name])} failed:\n{proc.stderr}")
    return d


def inspect(*args):
    return subprocess.run([sys.executable, "-m", "clc.cli", "inspect", *map(str, args)],
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
    assert lines[SCALE] == (f"{SCALE}: SASS sm_80, sm_90; PTX 9.0 for sm_90; "
                            "wrappable: PTX for compute_90 (sm_90 and newer)")
    assert lines["plain_c"] == ("plain_c: SASS sm_80, sm_90; PTX 9.0 for sm_90; "
                                "wrappable: PTX for compute_90 (sm_90 and newer)")
    assert proc.stdout.startswith(f"{files / 'with_ptx'}: ELF executable, .nv_fatbin:")
    assert "kernels: 2\n" in proc.stdout
    # AND nothing is said about looping, which needs an analysis that does not exist yet
    assert "loop" not in proc.stdout.lower()


def test_executable_without_ptx(files):
    proc = inspect(files / "sass_only")
    assert proc.returncode == 0, proc.stderr
    assert kernel_lines(proc.stdout)["plain_c"] == (
        "plain_c: SASS sm_80, sm_90; PTX none; "
        "not wrappable: no PTX (SASS for sm_80, sm_90 only)")


def test_json(files):
    # WHEN the executable is inspected with --json
    proc = inspect(files / "with_ptx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # THEN the kernels and the entries are there, as data
    assert report["kind"] == "host-elf"
    kernels = {k["name"]: k for k in report["kernels"]}
    assert set(kernels) == {"_Z5scaleIfEvPT_S0_i", "plain_c"}
    scale = kernels["_Z5scaleIfEvPT_S0_i"]
    assert scale["demangled"] == "void scale<float>(float*, float, int)"
    assert scale["sass"] == ["sm_80", "sm_90"]
    assert scale["ptx"] == [{"version": "9.0", "target": "sm_90", "name": "compute_90"}]
    assert scale["wrappable"] is True
    assert scale["summary"] == "PTX for compute_90 (sm_90 and newer)"
    ptx = [e for e in report["entries"] if e["kind"] == "ptx"]
    assert [(e["name"], e["compression"], e["section"]) for e in ptx] == [
        ("compute_90", "zstd", ".nv_fatbin")]
    assert set(ptx[0]["kernels"]) == set(kernels)


def test_ptx_file_json(files):
    proc = inspect(files / "k.ptx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "ptx"
    assert [(k["name"], k["sass"], k["wrappable"]) for k in report["kernels"]] == [
        ("plain_c", [], True), ("_Z5scaleIfEvPT_S0_i", [], True)]


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
    proc = subprocess.run([sys.executable, "-m", "clc.cli", "inspect", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "SASS architectures" in text and "wrap" in text and "PTX" in text
