# SPDX-License-Identifier: Apache-2.0
"""`clc demo --no-gpu`: what clc does, in a minute, on a machine with no GPU.

It runs a small driver-API program (clc/demo/demo_app.c) under clc-run twice, over clc's
stand-in driver (the fake libcuda its tests run the shim over, built into the package by
setup.py): once recording every launch, once under a policy that refuses debug kernels and
times GEMMs. Nothing runs on a GPU and no GPU is needed; the shim, the policy, the capture and
the reports are the real ones.
"""

import os
import pathlib
import subprocess
import sys
import tempfile

from clc.errors import ClcError

__all__ = ["DemoCommand", "demo_dir"]

AUDIT = """\
# Change nothing, write down everything.
version: 1
rules:
  - name: record-everything
    match: {kernel: "*"}
    action: allow
    record: true
"""

POLICY = """\
# Refuse debug kernels, time the GEMMs, record the rest.
version: 1
default: allow
on_error: deny
rules:
  - name: no-debug-kernels
    match: {kernel: "*debug*"}
    action: deny
    message: "debug kernels are not allowed on this server"
  - name: time-gemms
    match: {kernel: "*gemm*"}
    action: allow
    time: true
  - name: record-the-rest
    match: {kernel: "*"}
    action: allow
    record: true
"""


def demo_dir():
    """Where the stand-in driver and the demo program were built (clc/demo)."""
    return pathlib.Path(__file__).resolve().parent.parent / "demo"


class DemoCommand:
    name = "demo"
    help = "run a sample program under two policies over clc's stand-in driver (no GPU needed)"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--no-gpu", action="store_true", required=True,
                            help="run over clc's stand-in driver: nothing runs on a GPU")
        parser.add_argument("-o", "--output-dir", metavar="DIR",
                            help="a new directory for the policies and captures (default: a "
                                 "new one under $TMPDIR)")
        parser.add_argument("--steps", type=int, default=200, metavar="N",
                            help="the program's training steps (default: 200)")

    def run(self, args):
        here = demo_dir()
        program, driver = here / "demo_app", here / "libcuda.so.1"
        if not (program.is_file() and driver.is_file()):
            raise ClcError(f"the demo is not built in {here}: pip install builds it where a C "
                           f"compiler and cuda.h are found (the build brings cuda.h in the "
                           f"nvidia-cuda-runtime wheel); reinstall clc from its source tree")
        out = _new_dir(args.output_dir)
        env = dict(os.environ)
        # the stand-in driver first: the program and clc's shim find it as libcuda.so.1
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(here), env.get("LD_LIBRARY_PATH", "")) if p)
        steps = [("every launch recorded", "audit.yaml", AUDIT, "audit.clc"),
                 ("debug kernels refused, GEMMs timed", "policy.yaml", POLICY, "policy.clc")]
        print(f"clc demo: {program.name} over clc's stand-in driver (no GPU: the kernels do not "
              f"run, clc's shim, policies and captures are the real ones)", flush=True)
        for number, (what, policy_name, text, capture) in enumerate(steps, 1):
            policy = out / policy_name
            policy.write_text(text)
            command = ["clc-run", "--policy", str(policy), "-o", str(out / capture), "--",
                       str(program), str(args.steps)]
            print(f"\n== {number}. {what}: {' '.join(command[:2])} {policy} -- "
                  f"{program.name} {args.steps}\n", flush=True)
            status = subprocess.run([sys.executable, "-m", "clc", "run", *command[1:]],
                                    env=env).returncode
            if status != 0:
                raise ClcError(f"the demo's run {number} ended with status {status}")
        print(f"\nclc demo: the policies and captures are in {out}; try\n"
              f"  clc report {out / 'policy.clc'} --format csv\n"
              f"  clc policy explain {out / 'policy.yaml'} --kernel debug_kernel\n"
              f"On a machine with an NVIDIA GPU: clc-run --policy {out / 'policy.yaml'} -- "
              f"./your_program")
        return 0


def _new_dir(path):
    if path is None:
        return pathlib.Path(tempfile.mkdtemp(prefix="clc-demo-"))
    path = pathlib.Path(path)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise ClcError(f"{path} exists: the demo writes into a new directory") from None
    except OSError as e:
        raise ClcError(f"cannot make {path}: {e.strerror}") from None
    return path
