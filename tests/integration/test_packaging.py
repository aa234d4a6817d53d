# SPDX-License-Identifier: Apache-2.0
"""`pip install .` builds clc without a warning, ships its data (the JSON schemas, the wrappers'
device code, the license) and asks only for what every install needs: what wrapping alone needs
comes with the `wrap` extra."""

import email
import shutil
import subprocess
import sys
import zipfile

from harness import ROOT


def test_the_wheel_builds_cleanly_with_its_data_and_lean_requirements(tmp_path):
    # GIVEN a copy of the source tree (the build writes into the tree it builds), without what
    # a build made (the contract's Python module included)
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", ".pytest_cache",
        "clc-slurm-exec", "_bridge.c", "_abi_generated.py"))
    # WHEN the wheel is built as pip install builds it
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-v", "-w", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # THEN neither setuptools nor the C compiler warned
    lines = (proc.stdout + proc.stderr).splitlines()
    warned = [ln for ln in lines if ("warning" in ln.lower() or "deprecat" in ln.lower())
              and "byte-compiling is disabled" not in ln and "Location 'file:" not in ln]
    assert warned == []
    # AND the wheel holds the package's data
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for expected in ("clc/schemas/policy-1.schema.json", "clc/wrapping/device/runtime.cu",
                     "clc/libclc_preload.so"):
        assert expected in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    # AND the contract's Python module, made from the headers by the build, the same as this
    # tree's
    generated = zipfile.ZipFile(wheel).read("clc/_abi_generated.py").decode()
    assert generated == (ROOT / "clc" / "_abi_generated.py").read_text()
    # AND what wrapping alone needs is asked for by the wrap extra only; tqdm by none
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))))
    requires = meta.get_all("Requires-Dist")
    for package in ("zstandard", "lz4"):
        assert any(r.startswith(package) and 'extra == "wrap"' in r for r in requires)
    plain = [r for r in requires if "extra ==" not in r]
    assert sorted(r.split(">")[0] for r in plain) == ["cffi", "prometheus_client", "pyyaml"]
    assert meta["License-Expression"] == "Apache-2.0"
