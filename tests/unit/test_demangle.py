# SPDX-License-Identifier: Apache-2.0

import subprocess
import sys
from pathlib import Path

import pytest

from clc.demangle import demangle


@pytest.mark.parametrize("mangled,expected", [
    ("_Z6vecAddPKfS0_Pfi", "vecAdd(float const*, float const*, float*, int)"),
    ("_Z3fooIiEvT_", "void foo<int>(int)"),
    ("_ZN7cutlass6KernelINS_4gemmEEEvNT_6ParamsE",
     "void cutlass::Kernel<cutlass::gemm>(cutlass::gemm::Params)"),
])
def test_mangled(mangled, expected):
    assert demangle(mangled) == expected


@pytest.mark.parametrize("name", ["main", "vecAdd", "i", "", "extern_c_kernel", "Z6foo"])
def test_plain_names_unchanged(name):
    assert demangle(name) == name


@pytest.mark.parametrize("name", ["_Z", "_Zgarbage", "_Z99x", "_Z\udcff",
                                  "_Z6vec\0AddPKf"])
def test_garbage_unchanged(name):
    assert demangle(name) == name


def test_not_a_string_comes_back():
    assert demangle(None) is None


def test_repeated_calls_agree():
    assert demangle("_Z6vecAddPKfS0_Pfi") is demangle("_Z6vecAddPKfS0_Pfi")


def test_imports_with_the_standard_library_only():
    # Compared with what the interpreter loaded before, since site hooks import third-party
    # modules of their own.
    code = ("import sys; before = set(sys.modules); import clc.demangle; "
            "bad = [m for m in set(sys.modules) - before "
            "if m.split('.')[0] not in sys.stdlib_module_names and m.split('.')[0] != 'clc']; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[2])
