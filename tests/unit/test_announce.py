# SPDX-License-Identifier: Apache-2.0
"""What clc says on stderr when it refuses a kernel's launches."""

from pathlib import Path

from clc.demangle import demangle
from clc.runtime.engine import deny_announcements, rule_name
from clc.policy import KernelInfo, load_policy

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def test_a_shape_rule_says_which_launches_it_refuses():
    # GIVEN the shipped deny example, whose no-huge-grids rule depends on the grid
    policy = load_policy(POLICIES / "deny-example.yaml")
    mangled = "_Z6vecAddPKfS0_Pfi"
    info = KernelInfo(mangled=mangled, demangled=demangle(mangled), device=0)
    decision = policy.decide(info)
    # WHEN vecAdd is first seen
    lines = deny_announcements(policy, info, decision, set(), lambda r: rule_name(policy, r))
    # THEN the announcement names the launches the rule refuses, not every launch of vecAdd
    assert lines == ["clc: launches of vecAdd(float const*, float const*, float*, int) with "
                     "grid_blocks >= 1000001 are denied by rule 'no-huge-grids': launches of "
                     "more than 1000000 blocks are not allowed on this server\n"]


def test_each_refusal_is_said_once_per_kernel():
    policy = load_policy(POLICIES / "deny-example.yaml")
    mangled = "_Z10debug_dumpPfi"
    info = KernelInfo(mangled=mangled, demangled=demangle(mangled), device=0)
    said = set()
    first = deny_announcements(policy, info, policy.decide(info), said,
                               lambda r: rule_name(policy, r))
    again = deny_announcements(policy, info, policy.decide(info), said,
                               lambda r: rule_name(policy, r))
    assert first == ["clc: launches of debug_dump(float*, int) are denied by rule "
                     "'no-debug-kernels': debug kernels are not allowed on this server\n"]
    assert again == []
