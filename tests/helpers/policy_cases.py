# SPDX-License-Identifier: Apache-2.0
"""What the policy tests (tests/unit/test_policy_*.py) share: policies and kernels to decide,
the shipped policies, the texts errors say; and the policy every suite runs a program under
to see a kernel refused (deny_debug)."""

import pathlib
import textwrap


from clc import abi
from clc.policy import (
    KernelInfo, Outcome, Policy,
    parse_policy,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
# policies/hook-example.yaml names this file, which is shipped separately.
EXAMPLE_HOOK = REPO / "examples" / "hooks" / "arg_guard.py"
U64_MAX = 2**64 - 1
# Why a kernel_regex construct is refused, as errors say it.
LINEAR = ("clc runs kernel_regex in time linear in the name's length, without backreferences, "
          "lookarounds, conditional or atomic groups, possessive repeats or verbose mode")

TEMPLATE_MANGLED = ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5"
                    "arrayIPcLm1EEEEviT0_T1_")
TEMPLATE_DEMANGLED = ("void at::native::vectorized_elementwise_kernel<4, "
                      "at::native::FillFunctor<float>, std::array<char*, 1ul> >"
                      "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
TEMPLATE_BASE = ("at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                 "std::array<char*, 1ul> >")


def policy(text: str) -> Policy:
    return parse_policy(textwrap.dedent(text), "p.yaml")


def shipped_policies() -> list[pathlib.Path]:
    """The shipped policies that load here: hook-example.yaml needs the example hook."""
    return [path for path in sorted(POLICIES.glob("*.yaml"))
            if path.name != "hook-example.yaml" or EXAMPLE_HOOK.exists()]


def kernel(demangled: str = "vecAdd(float const*, float const*, float*, int)",
           mangled: str = "_Z6vecAddPKfS0_Pfi", device: int = 0,
           processes: tuple = ("a.out",), tenant: str = "") -> KernelInfo:
    return KernelInfo(mangled, demangled, device, processes, tenant)


ALLOW = Outcome(abi.ACTION_ALLOW, 0, 0, abi.RULE_DEFAULT)


SHAPES = """\
    version: 1
    default: deny
    rules:
      - name: small-gemm-ok
        match: {kernel: "*gemm*", grid_blocks: {le: 100}}
        action: allow
        record: true
      - name: big-blocks
        match: {block_threads: {gt: 512}}
        action: deny
        error: CUDA_ERROR_INVALID_VALUE
      - name: gemm
        match: {kernel: "*gemm*"}
        action: allow
        time: true
      - name: big-shared
        match: {shared_mem: {ge: 49152}}
        action: deny
    """

CONTEXT = """\
    version: 1
    rules:
      - name: tenant-b
        match: {tenant: "b*"}
        action: deny
      - name: no-tenant
        match: {tenant: ""}
        action: deny
        error: 999
      - name: python-on-1-or-2
        match: {process: ["python*", "ipython"], device: [1, 2]}
        action: deny
        record: true
      - name: device-3
        match: {device: 3}
        action: deny
        error: 101
    """


# A hook file's text: one hook that decides nothing.
GUARD = "def guard(launch):\n    return None\n"


def deny_debug(on_error=None, message=None, record_rest=False):
    """A policy's text that denies the debug kernels (*debug*): with `message` said to the
    program, on_error set where given, the other launches recorded with record_rest."""
    lines = ["version: 1", "default: allow"]
    if on_error:
        lines.append(f"on_error: {on_error}")
    lines += ["rules:", "  - name: no-debug", '    match: {kernel: "*debug*"}', "    action: deny"]
    if message:
        lines.append(f'    message: "{message}"')
    if record_rest:
        lines += ["  - name: record-rest", '    match: {kernel: "*"}', "    action: allow",
                  "    record: true"]
    return "\n".join(lines) + "\n"


def serving_and_training(board, **training) -> str:
    """A priority policy of two classes: `serving` latency-critical (tenant serving), `training`
    best-effort (tenant batch) with the keys given (floor=0.1, reserve=0.25, ...)."""
    keys = "".join(f"      {key}: {value}\n" for key, value in training.items())
    return ("version: 1\ndefault: allow\npriority:\n"
            f"  board: {board}\n  classes:\n"
            "    - name: serving\n      class: latency-critical\n      match: {tenant: serving}\n"
            "    - name: training\n      class: best-effort\n      match: {tenant: batch}\n"
            + keys)
