# SPDX-License-Identifier: Apache-2.0
"""The test suite needs no CUDA toolkit: the fake driver and the test programs are compiled
against the cuda.h of the nvidia-cuda-runtime wheel, which the test extra installs."""

import importlib.metadata
import pathlib
import sys

from harness import ROOT

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "native"))
from build import cuda_include_dir  # noqa: E402


def test_cuda_h_comes_from_the_test_extra_when_no_toolkit_is_named(monkeypatch):
    # GIVEN no CUDA_HOME
    monkeypatch.delenv("CUDA_HOME", raising=False)
    # THEN the header the tests compile against is the nvidia-cuda-runtime wheel's
    dist = importlib.metadata.distribution("nvidia-cuda-runtime")
    shipped = {pathlib.Path(dist.locate_file(f)).resolve() for f in dist.files
               if f.name == "cuda.h"}
    assert (cuda_include_dir() / "cuda.h").resolve() in shipped
