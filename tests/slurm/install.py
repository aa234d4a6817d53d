# SPDX-License-Identifier: Apache-2.0
"""clc installed for the cluster's jobs as docs/deploy.md tells administrators to: into a venv
of the system's own Python, in root's directories that every user can enter and read, so that
tasks of any user run it (the Python the tests run with may lie under root's home, closed to
other users).

The venv is made without pip (no ensurepip needed, as Debian ships it apart) and clc is
installed into it by the tests' own pip (`pip --python`), from a copy of the sources without
what the working tree built, so that nothing is built inside the working tree; pip's cache
serves the dependencies.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Install", "install_clc", "system_python"]

SOURCES = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "shim", "clc")
BUILT = shutil.ignore_patterns("*.so", "clc-slurm-exec", "_bridge.c", "__pycache__", "*.o")


def system_python():
    """The system's own Python 3, or None."""
    for d in ("/usr/bin", "/usr/local/bin", "/bin"):
        path = Path(d) / "python3"
        if os.access(path, os.X_OK):
            return path
    return None


@dataclass(frozen=True)
class Install:
    venv: Path
    package: Path  # the installed clc package

    @property
    def python(self):
        return self.venv / "bin" / "python"

    @property
    def plugin(self):
        return self.package / "libclc_spank.so"

    @property
    def launcher(self):
        return self.package / "clc-slurm-exec"


def install_clc(source, dest):
    """clc from the working tree `source`, installed into DEST/venv (DEST made here, mode 0755);
    raises RuntimeError with pip's words when it cannot be."""
    python = system_python()
    if python is None:
        raise RuntimeError("no system Python 3 (/usr/bin/python3) to install clc for jobs")
    umask = os.umask(0o022)  # what pip writes must be readable by every user
    try:
        dest = Path(dest)
        dest.mkdir(mode=0o755)
        src = dest / "src"
        src.mkdir()
        for name in SOURCES:
            path = Path(source) / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=BUILT)
            else:
                shutil.copy2(path, src / name)
        venv = dest / "venv"
        for argv in ([python, "-m", "venv", "--without-pip", venv],
                     [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install",
                      "--quiet", "--no-input", src]):
            p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n{p.stdout}{p.stderr}")
        shutil.rmtree(src)
        where = subprocess.run([venv / "bin" / "python", "-I", "-c",
                                "import clc, os; print(os.path.dirname(clc.__file__))"],
                               capture_output=True, text=True, timeout=60, check=True)
        return Install(venv, Path(where.stdout.strip()))
    finally:
        os.umask(umask)
