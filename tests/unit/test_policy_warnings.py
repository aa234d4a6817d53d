# SPDX-License-Identifier: Apache-2.0
"""The policy format: its warnings."""

import textwrap

import pytest

from clc import abi
from clc.policy import (
    Policy,
    parse_policy,
)

from policy_cases import policy


# ---- warnings ----------------------------------------------------------------------------------

def warnings_of(text: str) -> list[str]:
    return [str(w) for w in policy(text).warnings]


@pytest.mark.parametrize("rules, warned", [
    # an earlier catch-all
    ("""\
      - name: all
        match: {kernel: "*"}
        action: allow
      - name: gemm
        match: {kernel: "*gemm*", grid_blocks: {gt: 10}}
        action: deny
    """, [(7, "gemm", "all", 4)]),
    # a rule without match matches everything after it
    ("""\
      - name: time-all
        action: allow
        time: true
      - name: gemm
        match: {kernel: "*gemm*"}
        action: deny
    """, [(7, "gemm", "time-all", 4)]),
    # identical match blocks
    ("""\
      - name: first
        match: {kernel: "*gemm*", user: alice, grid_blocks: {gt: 5}}
        action: deny
      - name: second
        match: {kernel: "*gemm*", user: alice, grid_blocks: {gt: 5}}
        action: allow
    """, [(7, "second", "first", 4)]),
    # an earlier rule with more globs, more devices and a wider range
    ("""\
      - name: wide
        match: {kernel: ["*gemm*", "*conv*"], device: [0, 1], shared_mem: {ge: 10}}
        action: allow
      - name: narrow
        match: {kernel: "*gemm*", device: 1, shared_mem: {ge: 100}, tenant: b}
        action: deny
    """, [(7, "narrow", "wide", 4)]),
    # a hook may return None: the rules after it stay reachable
    ("""\
      - name: guard
        match: {kernel: "*"}
        action: hook
        hook: guard.py:guard
      - name: gemm
        match: {kernel: "*gemm*"}
        action: deny
    """, []),
    # an earlier rule that is narrower in any way leaves launches to the later one
    ("""\
      - name: gemm
        match: {kernel: "*gemm*"}
        action: allow
      - name: small
        match: {grid_blocks: {lt: 10}}
        action: allow
      - name: rest
        match: {kernel: "*", grid_blocks: {lt: 100}}
        action: deny
      - name: other-process
        match: {process: "*"}
        action: allow
      - name: regex
        match: {kernel_regex: "gemm"}
        action: allow
      - name: regex-elsewhere
        match: {kernel_regex: "gemm$", kernel: "*"}
        action: deny
    """, []),
])
def test_unreachable_rules_are_warned(hook_dir, rules, warned):
    # GIVEN rules, some of which an earlier rule may leave unreachable
    text = "version: 1\non_error: deny\nrules:\n" + textwrap.dedent(rules)
    # WHEN the policy is loaded
    # THEN each such rule gets a warning naming the rule that decides first
    assert warnings_of(text) == [
        f"p.yaml:{line}:3: warning: rule '{name}' is never reached: rule '{first}' (line "
        f"{first_line}) comes before it and decides every launch that '{name}' matches"
        for line, name, first, first_line in warned]


def test_deny_rules_that_record_or_time_are_warned():
    # GIVEN deny rules asking to record and to time, and allow rules asking the same
    text = """\
        version: 1
        on_error: deny
        rules:
          - match: {kernel: "*a*"}
            action: deny
            record: true
          - match: {kernel: "*b*"}
            action: deny
            record: true
            time: true
          - match: {kernel: "*c*"}
            action: deny
            record: false
          - match: {kernel: "*d*"}
            action: allow
            time: true
        """
    # WHEN the policy is loaded
    # THEN each deny rule is told what clc does with its denied launches
    assert warnings_of(text) == [
        "p.yaml:6:5: warning: record: true on deny rule 'rule-1': a denied launch never runs, "
        "so clc records only that it was refused (its shape and the error it returned)",
        "p.yaml:10:5: warning: time: true on deny rule 'rule-2': a denied launch never runs, so "
        "it has no GPU time; clc only records it, as record: true does",
    ]
    # AND the rules keep their flags
    assert [rule.flags for rule in policy(text).rules] == [
        abi.FLAG_RECORD, abi.FLAG_RECORD | abi.FLAG_TIME, 0, abi.FLAG_RECORD | abi.FLAG_TIME]


EFFECT = ("should clc fail to decide a launch (its engine does not start, a hook raises), the "
          "launch runs, whatever this policy would deny")


@pytest.mark.parametrize("text, warned", [
    ("version: 1\non_error: allow\nrules:\n  - {match: {kernel: x}, action: deny}\n",
     [f"p.yaml:2:11: warning: on_error: allow in a policy that denies: {EFFECT}; "
      "'on_error: deny' refuses such launches"]),
    ("# strict\nversion: 1\ndefault: deny\n",
     [f"p.yaml:2:1: warning: on_error is not set, so it is allow: {EFFECT}; add "
      "'on_error: deny' to refuse such launches"]),
    ("version: 1\ndefault: deny\non_error: deny\n", []),
    ("version: 1\non_error: allow\nrules:\n  - {action: allow, record: true}\n", []),
], ids=["deny-rule", "default-deny", "on-error-deny", "nothing-denied"])
def test_on_error_allow_in_a_policy_that_denies_is_warned(text, warned):
    # GIVEN a policy with or without denials, and its on_error
    # WHEN it is loaded
    # THEN on_error: allow, written or not, is warned about only where something is denied
    assert [str(w) for w in parse_policy(text, "p.yaml").warnings] == warned


def test_warnings_are_not_part_of_the_policy():
    # GIVEN a policy with a warning
    loaded = policy("version: 1\ndefault: deny\n")
    assert len(loaded.warnings) == 1
    # WHEN it goes to JSON and back
    again = Policy.from_json(loaded.to_json())
    # THEN the program's copy decides the same and carries no warnings
    assert again == loaded and again.warnings == []
    assert "warning" not in loaded.to_json()
