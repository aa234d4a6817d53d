# SPDX-License-Identifier: Apache-2.0
"""The policy format: loading, its error messages, decisions, explanations and JSON."""

import json
import math
import os
import pathlib
import random
import re
import subprocess
import sys
import textwrap

import pytest

from clc import abi
from clc.cuda_errors import CUDA_ERRORS, error_name
from clc.policy import (
    ANY_RANGE, Clause, Decision, HookFileError, HookRef, KernelInfo, Outcome, Policy,
    PolicyError, Rule, base_name, load_policy, parse_policy,
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


# ---- errors ------------------------------------------------------------------------------------

ERRORS = [
    # YAML syntax
    ("syntax-mapping-value", """\
        version: 1
        default: allow: deny
        """, "p.yaml:2:15: invalid YAML: mapping values are not allowed here"),
    ("syntax-unclosed-flow", """\
        version: 1
        rules: [
        """, "p.yaml:3:1: invalid YAML: while parsing a flow node, expected the node content, "
             "but found '<stream end>'"),
    ("syntax-tab", "version: 1\n\tdefault: allow\n",
     "p.yaml:2:1: invalid YAML: while scanning for the next token, found character '\\t' "
     "that cannot start any token"),
    ("syntax-control-char", "version: 1\ndefault: \x07allow\n",
     "p.yaml:2:10: invalid YAML: unacceptable character #x0007: special characters are not "
     "allowed"),
    ("two-documents", """\
        version: 1
        ---
        version: 1
        """, "p.yaml:2:1: invalid YAML: expected a single document in the stream, but found "
             "another document"),
    ("custom-tag", "version: !custom 1\n", "p.yaml:1:10: unsupported YAML tag '!custom'"),
    # the document
    ("empty", "", "p.yaml:1:1: the policy is empty (it needs at least 'version: 1')"),
    ("only-comments", "# nothing yet\n",
     "p.yaml:1:1: the policy is empty (it needs at least 'version: 1')"),
    ("top-list", "- version: 1\n",
     "p.yaml:1:1: a policy must be a mapping that starts with 'version: 1', got a list"),
    ("top-scalar", "version 1\n", "p.yaml:1:1: a policy must be a mapping that starts with "
                                  "'version: 1', got the string 'version 1'"),
    ("missing-version", """\
        # a policy
        default: deny
        """, "p.yaml:2:1: missing 'version' (this clc reads policies with 'version: 1')"),
    ("version-string", 'version: "1"\n',
     "p.yaml:1:10: version must be the integer 1, got the string '1'"),
    ("version-float", "version: 1.0\n",
     "p.yaml:1:10: version must be the integer 1, got the number 1.0"),
    ("version-2", "version: 2\n",
     "p.yaml:1:10: unsupported policy version 2 (this clc reads version 1)"),
    ("non-scalar-key", """\
        version: 1
        [a]: 1
        """, "p.yaml:2:1: expected a key at the top level, got a list"),
    # unknown keys
    ("unknown-top-close", """\
        version: 1
        rule:
          - action: deny
        """, "p.yaml:2:1: unknown key 'rule' at the top level (did you mean 'rules'?)"),
    ("unknown-top-far", """\
        version: 1
        colour: red
        """, "p.yaml:2:1: unknown key 'colour' at the top level (expected one of: version, "
             "default, on_error, rules, priority)"),
    ("unknown-rule-key", """\
        version: 1
        rules:
          - name: r
            acton: deny
        """, "p.yaml:4:5: unknown key 'acton' in rule 1 (did you mean 'action'?)"),
    ("unknown-match-key", """\
        version: 1
        rules:
          - match:
              kernal: "*debug*"
            action: deny
        """, "p.yaml:4:7: unknown key 'kernal' in match (did you mean 'kernel'?)"),
    ("unknown-match-key-far", """\
        version: 1
        rules:
          - match:
              stream: 0
            action: deny
        """, "p.yaml:4:7: unknown key 'stream' in match (expected one of: kernel, kernel_regex, "
             "grid_blocks, block_threads, shared_mem, device, process, tenant, user, group, "
             "cgroup)"),
    ("unknown-range-op-alias", """\
        version: 1
        rules:
          - match:
              grid_blocks: {gte: 10}
            action: deny
        """, "p.yaml:4:21: unknown range operator 'gte' in grid_blocks (did you mean 'ge'?)"),
    ("unknown-range-op-far", """\
        version: 1
        rules:
          - match:
              grid_blocks: {between: 10}
            action: deny
        """, "p.yaml:4:21: unknown range operator 'between' in grid_blocks (expected one of: "
             "gt, ge, lt, le, eq)"),
    # duplicate keys
    ("duplicate-top", """\
        version: 1
        version: 1
        """, "p.yaml:2:1: duplicate key 'version' at the top level (first at line 1)"),
    ("duplicate-rule-key", """\
        version: 1
        rules:
          - action: allow
            action: deny
        """, "p.yaml:4:5: duplicate key 'action' in rule 1 (first at line 3)"),
    ("duplicate-match-key", """\
        version: 1
        rules:
          - match:
              kernel: a
              kernel: b
            action: deny
        """, "p.yaml:5:7: duplicate key 'kernel' in match (first at line 4)"),
    ("duplicate-range-op", """\
        version: 1
        rules:
          - match:
              grid_blocks: {gt: 1, gt: 2}
            action: deny
        """, "p.yaml:4:28: duplicate range operator 'gt' in grid_blocks (first at line 4)"),
    # wrong types
    ("bool-as-string", """\
        version: 1
        rules:
          - action: allow
            record: "true"
        """, "p.yaml:4:13: record must be true or false, got the string 'true'"),
    ("bool-as-yes", """\
        version: 1
        rules:
          - action: allow
            record: yes
        """, "p.yaml:4:13: record must be true or false, got the string 'yes' (only true and "
             "false are booleans here)"),
    ("bool-as-int", """\
        version: 1
        rules:
          - action: allow
            time: 1
        """, "p.yaml:4:11: time must be true or false, got the integer 1"),
    ("list-as-message", """\
        version: 1
        rules:
          - action: deny
            message: [a, b]
        """, "p.yaml:4:14: message must be a string, got a list"),
    ("int-as-name", """\
        version: 1
        rules:
          - name: 5
            action: deny
        """, 'p.yaml:3:11: name must be a string, got the integer 5 (quote it to mean the text: '
             '"5")'),
    ("mapping-as-kernel", """\
        version: 1
        rules:
          - match:
              kernel: {a: 1}
            action: deny
        """, "p.yaml:4:15: kernel must be a glob or a list of them, got a mapping"),
    ("list-as-regex", """\
        version: 1
        rules:
          - match:
              kernel_regex: [a]
            action: deny
        """, "p.yaml:4:21: kernel_regex must be a string, got a list"),
    ("int-as-tenant", """\
        version: 1
        rules:
          - match:
              tenant: 7
            action: deny
        """, 'p.yaml:4:15: tenant must be a glob (a string), got the integer 7 (quote it to '
             'mean the text: "7")'),
    ("list-in-process-list", """\
        version: 1
        rules:
          - match:
              process: [python, [x]]
            action: deny
        """, "p.yaml:4:25: each item of process must be a glob (a string), got a list"),
    ("empty-glob-list", """\
        version: 1
        rules:
          - match:
              kernel: []
            action: deny
        """, "p.yaml:4:15: kernel must not be an empty list"),
    ("string-as-device", """\
        version: 1
        rules:
          - match:
              device: "0"
            action: deny
        """, "p.yaml:4:15: device must be an integer, got the string '0'"),
    ("string-in-device-list", """\
        version: 1
        rules:
          - match:
              device: [0, x]
            action: deny
        """, "p.yaml:4:19: device must be an integer, got the string 'x'"),
    ("string-as-range", """\
        version: 1
        rules:
          - match:
              grid_blocks: big
            action: deny
        """, "p.yaml:4:20: grid_blocks must be an integer or a mapping of gt/ge/lt/le/eq to "
             "integers, got the string 'big'"),
    ("bool-as-default", "version: 1\ndefault: true\n",
     "p.yaml:2:10: default must be 'allow' or 'deny', got the boolean true"),
    ("unknown-on-error", "version: 1\non_error: permit\n",
     "p.yaml:2:11: on_error must be 'allow' or 'deny', got the string 'permit'"),
    ("list-as-match", """\
        version: 1
        rules:
          - match: [kernel]
            action: deny
        """, "p.yaml:3:12: match must be a mapping, got a list"),
    ("null-match", """\
        version: 1
        rules:
          - match:
            action: deny
        """, "p.yaml:3:11: match must be a mapping, got nothing (null)"),
    ("rules-mapping", """\
        version: 1
        rules: {a: 1}
        """, "p.yaml:2:8: rules must be a list of rules, got a mapping"),
    ("rule-string", """\
        version: 1
        rules:
          - deny
        """, "p.yaml:3:5: rule 1 must be a mapping with at least 'action', got the string "
             "'deny'"),
    # globs and regexes
    ("glob-unclosed", """\
        version: 1
        rules:
          - match:
              kernel: "gemm_[sd"
            action: deny
        """, "p.yaml:4:15: invalid glob 'gemm_[sd' in kernel: the '[' at offset 5 has no "
             "closing ']'"),
    ("glob-unclosed-in-list", """\
        version: 1
        rules:
          - match:
              process: [ok, "py[thon"]
            action: deny
        """, "p.yaml:4:21: invalid glob 'py[thon' in process: the '[' at offset 2 has no "
             "closing ']'"),
    ("glob-bracket-pair", """\
        version: 1
        rules:
          - match:
              tenant: "a[]"
            action: deny
        """, "p.yaml:4:15: invalid glob 'a[]' in tenant: the '[' at offset 1 has no "
             "closing ']'"),
    ("regex-invalid", """\
        version: 1
        rules:
          - match:
              kernel_regex: "gemm(|conv"
            action: deny
        """, "p.yaml:4:21: invalid regex 'gemm(|conv' in kernel_regex: missing ), "
             "unterminated subpattern at position 4"),
    # actions
    ("unknown-action", """\
        version: 1
        rules:
          - action: permit
        """, "p.yaml:3:13: unknown action 'permit' (expected one of: allow, deny, hook, wrap)"),
    ("unknown-action-close", """\
        version: 1
        rules:
          - action: Deny
        """, "p.yaml:3:13: unknown action 'Deny' (did you mean 'deny'?)"),
    ("wrap-without-wrapper", """\
        version: 1
        rules:
          - action: wrap
        """, "p.yaml:3:5: rule 'rule-1' has action: wrap but no 'wrapper' (expected sm_share, "
             "block_count, deadline or a .cu file)"),
    ("wrap-unknown-wrapper", """\
        version: 1
        rules:
          - action: wrap
            wrapper: sm_shares
        """, "p.yaml:4:14: unknown wrapper 'sm_shares': expected one of sm_share, block_count, "
             "deadline or the path of a .cu file with a device policy"),
    ("wrap-share-out-of-range", """\
        version: 1
        rules:
          - action: wrap
            wrapper: sm_share
            params: {share: 0}
        """, "p.yaml:5:21: wrapper sm_share: share must be > 0 and <= 1, got 0"),
    ("wrap-param-not-a-number", """\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params: {ms: soon}
        """, "p.yaml:5:18: params.ms must be a number, got the string 'soon'"),
    ("wrapper-on-allow", """\
        version: 1
        rules:
          - action: allow
            wrapper: sm_share
        """, "p.yaml:4:5: 'wrapper' is only allowed on a wrap rule (rule 'rule-1' has action: "
             "allow)"),
    ("on-unwrappable-bad", """\
        version: 1
        rules:
          - action: wrap
            wrapper: block_count
            on_unwrappable: skip
        """, "p.yaml:5:21: on_unwrappable must be 'allow' or 'deny', got the string 'skip'"),
    ("unknown-action-close-to-hook", """\
        version: 1
        rules:
          - action: hooks
        """, "p.yaml:3:13: unknown action 'hooks' (did you mean 'hook'?)"),
    ("missing-action", """\
        version: 1
        rules:
          - name: r
            match: {kernel: "*"}
        """, "p.yaml:3:5: rule 'r' has no 'action' (expected one of: allow, deny, hook, wrap)"),
    ("message-on-allow", """\
        version: 1
        rules:
          - action: allow
            message: "hi"
        """, "p.yaml:4:5: 'message' is only allowed on a deny rule (rule 'rule-1' has action: "
             "allow)"),
    ("error-on-allow", """\
        version: 1
        rules:
          - name: ok
            action: allow
            error: 800
        """, "p.yaml:5:5: 'error' is only allowed on a deny rule (rule 'ok' has action: allow)"),
    # hook rules (the checks before the file is looked for; see test_hook_file_errors)
    ("hook-missing", """\
        version: 1
        rules:
          - name: guard
            match: {kernel: "*vecAdd*"}
            action: hook
        """, "p.yaml:3:5: rule 'guard' has action: hook but no 'hook' (expected hook: "
             "FILE.py:FUNCTION)"),
    ("hook-on-allow", """\
        version: 1
        rules:
          - action: allow
            hook: guard.py:guard
        """, "p.yaml:4:5: 'hook' is only allowed on a hook rule (rule 'rule-1' has action: "
             "allow)"),
    ("hook-on-deny", """\
        version: 1
        rules:
          - name: no
            hook: guard.py:guard
            action: deny
        """, "p.yaml:4:5: 'hook' is only allowed on a hook rule (rule 'no' has action: deny)"),
    ("hook-int", """\
        version: 1
        rules:
          - action: hook
            hook: 5
        """, 'p.yaml:4:11: hook must be a string, got the integer 5 (quote it to mean the '
             'text: "5")'),
    ("hook-list", """\
        version: 1
        rules:
          - action: hook
            hook: [guard.py, guard]
        """, "p.yaml:4:11: hook must be a string, got a list"),
    ("hook-null", """\
        version: 1
        rules:
          - action: hook
            hook:
        """, "p.yaml:4:10: hook must be a string, got nothing (null)"),
    ("hook-no-colon", """\
        version: 1
        rules:
          - action: hook
            hook: guard.py
        """, "p.yaml:4:11: hook 'guard.py' must be FILE.py:FUNCTION (no ':' before a function "
             "name)"),
    ("hook-no-file", """\
        version: 1
        rules:
          - action: hook
            hook: ":guard"
        """, "p.yaml:4:11: hook ':guard' has no file before the ':' (expected "
             "FILE.py:FUNCTION)"),
    ("hook-no-function", """\
        version: 1
        rules:
          - action: hook
            hook: "guard.py:"
        """, "p.yaml:4:11: hook 'guard.py:' has no function after the ':' (expected "
             "FILE.py:FUNCTION)"),
    ("hook-function-not-identifier", """\
        version: 1
        rules:
          - action: hook
            hook: hooks/guard.py:my-guard
        """, "p.yaml:4:11: hook function 'my-guard' is not a Python identifier (expected "
             "FILE.py:FUNCTION)"),
    ("hook-function-space", """\
        version: 1
        rules:
          - action: hook
            hook: "guard.py: guard"
        """, "p.yaml:4:11: hook function ' guard' is not a Python identifier (expected "
             "FILE.py:FUNCTION)"),
    ("hook-function-keyword", """\
        version: 1
        rules:
          - action: hook
            hook: guard.py:class
        """, "p.yaml:4:11: hook function 'class' is a Python keyword, not a function name"),
    ("hook-file-not-py", """\
        version: 1
        rules:
          - action: hook
            hook: "hooks/guard.pyc:guard"
        """, "p.yaml:4:11: hook file 'hooks/guard.pyc' must be a Python file ending in .py"),
    ("hook-file-colon-in-function", """\
        version: 1
        rules:
          - action: hook
            hook: "guard.py:guard:extra"
        """, "p.yaml:4:11: hook file 'guard.py:guard' must be a Python file ending in .py"),
    ("hook-unknown-key", """\
        version: 1
        rules:
          - action: hook
            hooks: guard.py:guard
        """, "p.yaml:4:5: unknown key 'hooks' in rule 1 (did you mean 'hook'?)"),
    # CUDA errors
    ("error-name-typo", """\
        version: 1
        rules:
          - action: deny
            error: CUDA_ERROR_NOT_PERMITED
        """, "p.yaml:4:12: unknown CUDA error 'CUDA_ERROR_NOT_PERMITED' (did you mean "
             "'CUDA_ERROR_NOT_PERMITTED'?)"),
    ("error-name-unknown", """\
        version: 1
        rules:
          - action: deny
            error: banana
        """, "p.yaml:4:12: unknown CUDA error 'banana' (expected a CUresult name such as "
             "CUDA_ERROR_NOT_PERMITTED, or its number)"),
    ("error-success", """\
        version: 1
        rules:
          - action: deny
            error: CUDA_SUCCESS
        """, "p.yaml:4:12: error must not be CUDA_SUCCESS: a denied launch has to fail"),
    ("error-negative", """\
        version: 1
        rules:
          - action: deny
            error: -5
        """, "p.yaml:4:12: error must not be negative, got -5"),
    ("error-float", """\
        version: 1
        rules:
          - action: deny
            error: 1.5
        """, "p.yaml:4:12: error must be a CUresult name or number, got the number 1.5"),
    # numbers and ranges
    ("negative-shape", """\
        version: 1
        rules:
          - match:
              grid_blocks: -1
            action: deny
        """, "p.yaml:4:20: grid_blocks must not be negative, got -1"),
    ("negative-bound", """\
        version: 1
        rules:
          - match:
              shared_mem: {ge: -1}
            action: deny
        """, "p.yaml:4:24: shared_mem ge must not be negative, got -1"),
    ("negative-device", """\
        version: 1
        rules:
          - match:
              device: -1
            action: deny
        """, "p.yaml:4:15: device must not be negative, got -1"),
    ("too-large-bound", """\
        version: 1
        rules:
          - match:
              grid_blocks: 18446744073709551616
            action: deny
        """, "p.yaml:4:20: grid_blocks must be at most 18446744073709551615, got "
             "18446744073709551616"),
    ("empty-range", """\
        version: 1
        rules:
          - match:
              grid_blocks: {gt: 5, lt: 3}
            action: deny
        """, "p.yaml:4:20: empty range for grid_blocks: no value is > 5 and < 3"),
    ("empty-range-below-zero", """\
        version: 1
        rules:
          - match:
              block_threads: {lt: 0}
            action: deny
        """, "p.yaml:4:22: empty range for block_threads: no value is < 0"),
    ("empty-range-eq", """\
        version: 1
        rules:
          - match:
              shared_mem: {eq: 3, gt: 3}
            action: deny
        """, "p.yaml:4:19: empty range for shared_mem: no value is == 3 and > 3"),
    ("range-without-operators", """\
        version: 1
        rules:
          - match:
              grid_blocks: {}
            action: deny
        """, "p.yaml:4:20: grid_blocks needs at least one of: gt, ge, lt, le, eq"),
    ("too-many-shape-rules",
     "version: 1\nrules:\n"
     + "  - {action: allow}\n"
     + "".join(f"  - {{action: deny, match: {{grid_blocks: {i}}}}}\n" for i in range(9)),
     f"p.yaml:12:5: too many rules with launch-shape conditions (grid_blocks, block_threads, "
     f"shared_mem): at most {abi.MAX_CLAUSES} are supported"),
    # rule names
    ("duplicate-rule-name", """\
        version: 1
        rules:
          - name: a
            action: allow
          - name: a
            action: deny
        """, "p.yaml:5:11: duplicate rule name 'a' (first used at line 3)"),
    ("default-name-collision", """\
        version: 1
        rules:
          - name: rule-2
            action: allow
          - action: deny
        """, "p.yaml:5:5: duplicate rule name 'rule-2' (first used at line 3)"),
    ("reserved-rule-name", """\
        version: 1
        rules:
          - name: default
            action: deny
        """, "p.yaml:3:11: the rule name 'default' is reserved for the policy's default"),
    ("reserved-rule-name-on-error", """\
        version: 1
        rules:
          - name: on_error
            action: deny
        """, "p.yaml:3:11: the rule name 'on_error' is reserved for the policy's on_error"),
    ("empty-rule-name", """\
        version: 1
        rules:
          - name: ""
            action: deny
        """, "p.yaml:3:11: a rule name must not be empty"),
    # wrapper params: finite, integral where counted, within what the shim keeps
    ("param-inf", """\
        version: 1
        rules:
          - action: wrap
            wrapper: sm_share
            params: {share: .inf}
        """, "p.yaml:5:21: params.share must be a finite number, got .inf"),
    ("param-nan", """\
        version: 1
        rules:
          - action: wrap
            wrapper: sm_share
            params:
              share: .NaN
        """, "p.yaml:6:14: params.share must be a finite number, got .NaN"),
    ("param-negative-inf", """\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params: {ms: -.inf}
        """, "p.yaml:5:18: params.ms must be a finite number, got -.inf"),
    ("param-sms-exponent", """\
        version: 1
        rules:
          - action: wrap
            wrapper: sm_share
            params: {sms: 1e20}
        """, "p.yaml:5:19: wrapper sm_share: sms must be an integer, got 1e+20"),
    ("param-sms-beyond-32-bits", """\
        version: 1
        rules:
          - action: wrap
            wrapper: sm_share
            params: {sms: 4294967296}
        """, "p.yaml:5:19: wrapper sm_share: sms must be at most 4294967295 (the shim keeps it "
             "in 32 bits), got 4294967296"),
    ("param-share-below-resolution", """\
        version: 1
        rules:
          - action: wrap
            wrapper: sm_share
            params: {share: 1.0e-9}
        """, "p.yaml:5:21: wrapper sm_share: share must be at least 0.000001 (the shim keeps a "
             "share in millionths of the GPU), got 1.0e-9"),
    ("param-ms-beyond-30-minutes", """\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params: {ms: 1e30}
        """, "p.yaml:5:18: wrapper deadline: ms must be at most 1800000 (30 minutes: the "
             "wrapped kernel keeps a launch's start in microseconds modulo 2^32), got 1e+30"),
    ("param-ms-just-beyond-30-minutes", """\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params: {ms: 1800001}
        """, "p.yaml:5:18: wrapper deadline: ms must be at most 1800000 (30 minutes: the "
             "wrapped kernel keeps a launch's start in microseconds modulo 2^32), got 1800001"),
    ("param-ms-below-a-nanosecond", """\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params: {ms: 0.0000001}
        """, "p.yaml:5:18: wrapper deadline: ms must be at least 0.000001 (the device code "
             "counts it in nanoseconds, in 64 bits), got 0.0000001"),
    ("param-duplicate", """\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params:
              ms: 5
              ms: 6
        """, "p.yaml:7:7: duplicate parameter 'ms' in params (first at line 6)"),
    ("param-bool", """\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params: {ms: true}
        """, "p.yaml:5:18: params.ms must be a number, got the boolean true"),
    ("error-inf", """\
        version: 1
        rules:
          - action: deny
            error: .inf
        """, "p.yaml:4:12: error must be a CUresult name or number, got the number .inf"),
    ("shape-float", """\
        version: 1
        rules:
          - match:
              block_threads: {le: 1024.0}
            action: deny
        """, "p.yaml:4:27: block_threads le must be an integer, got the number 1024.0"),
    ("shape-nan", """\
        version: 1
        rules:
          - match:
              shared_mem: .nan
            action: deny
        """, "p.yaml:4:19: shared_mem must be an integer or a mapping of gt/ge/lt/le/eq to "
             "integers, got the number .nan"),
    ("device-beyond-int", """\
        version: 1
        rules:
          - match:
              device: [0, 2147483648]
            action: deny
        """, "p.yaml:4:19: device must be at most 2147483647, got 2147483648"),
    # kernel_regex: what cannot run in linear time
    ("regex-backreference", """\
        version: 1
        rules:
          - match:
              kernel_regex: '(gemm)_\\1'
            action: deny
        """, "p.yaml:4:21: unsupported regex '(gemm)_\\1' in kernel_regex: a backreference at "
             "offset 7 (" + LINEAR + ")"),
    ("regex-named-backreference", """\
        version: 1
        rules:
          - match:
              kernel_regex: '(?P<k>gemm)(?P=k)'
            action: deny
        """, "p.yaml:4:21: unsupported regex '(?P<k>gemm)(?P=k)' in kernel_regex: a "
             "backreference at offset 11 (" + LINEAR + ")"),
    ("regex-lookahead", """\
        version: 1
        rules:
          - match:
              kernel_regex: 'gemm(?!_f16)'
            action: deny
        """, "p.yaml:4:21: unsupported regex 'gemm(?!_f16)' in kernel_regex: a lookahead at "
             "offset 4 (" + LINEAR + ")"),
    ("regex-lookbehind", """\
        version: 1
        rules:
          - match:
              kernel_regex: '(?<=at::)add'
            action: deny
        """, "p.yaml:4:21: unsupported regex '(?<=at::)add' in kernel_regex: a lookbehind at "
             "offset 0 (" + LINEAR + ")"),
    ("regex-atomic", """\
        version: 1
        rules:
          - match:
              kernel_regex: '(?>a+)b'
            action: deny
        """, "p.yaml:4:21: unsupported regex '(?>a+)b' in kernel_regex: an atomic group at "
             "offset 0 (" + LINEAR + ")"),
    ("regex-possessive", """\
        version: 1
        rules:
          - match:
              kernel_regex: 'a++b'
            action: deny
        """, "p.yaml:4:21: unsupported regex 'a++b' in kernel_regex: a possessive repeat at "
             "offset 1 (" + LINEAR + ")"),
    ("regex-verbose", """\
        version: 1
        rules:
          - match:
              kernel_regex: '(?x) gemm'
            action: deny
        """, "p.yaml:4:21: unsupported regex '(?x) gemm' in kernel_regex: verbose mode (?x) at "
             "offset 0 (" + LINEAR + ")"),
    ("regex-too-large", """\
        version: 1
        rules:
          - match:
              kernel_regex: '(a{50}){50}'
            action: deny
        """, "p.yaml:4:21: unsupported regex '(a{50}){50}' in kernel_regex: more than 2000 "
             "states once its {m,n} repeats are written out (clc runs kernel_regex in time "
             "linear in the name's length and the regex's size)"),
    # user, group, cgroup
    ("user-negative-id", """\
        version: 1
        rules:
          - match:
              user: -1
            action: deny
        """, "p.yaml:4:13: user id must not be negative, got -1"),
    ("group-id-beyond-32-bits", """\
        version: 1
        rules:
          - match:
              group: [wheel, 4294967295]
            action: deny
        """, "p.yaml:4:22: group id must be at most 4294967294, got 4294967295"),
    ("user-float", """\
        version: 1
        rules:
          - match:
              user: 1000.5
            action: deny
        """, 'p.yaml:4:13: user must be a name or glob (a string) or a numeric id, got the '
             'number 1000.5 (quote it to mean the text: "1000.5")'),
    ("group-mapping", """\
        version: 1
        rules:
          - match:
              group: {name: wheel}
            action: deny
        """, "p.yaml:4:14: group must be a name or an id or a list of them, got a mapping"),
    ("user-glob-unclosed", """\
        version: 1
        rules:
          - match:
              user: "svc-[ab"
            action: deny
        """, "p.yaml:4:13: invalid glob 'svc-[ab' in user: the '[' at offset 4 has no closing "
             "']'"),
    ("cgroup-relative", """\
        version: 1
        rules:
          - match:
              cgroup: [/system.slice/*, user.slice/*]
            action: deny
        """, "p.yaml:4:33: cgroup glob 'user.slice/*' can never match: cgroup paths start with "
             "'/', as in /proc/self/cgroup"),
    ("cgroup-int", """\
        version: 1
        rules:
          - match:
              cgroup: 0
            action: deny
        """, 'p.yaml:4:15: cgroup must be a glob (a string), got the integer 0 (quote it to '
             'mean the text: "0")'),
]


@pytest.mark.parametrize("text, expected", [case[1:] for case in ERRORS],
                         ids=[case[0] for case in ERRORS])
def test_error_points_at_the_offending_node(text, expected):
    # GIVEN a policy with one mistake
    # WHEN it is parsed
    with pytest.raises(PolicyError) as caught:
        policy(text)
    # THEN the error names the file, line and column of the node at fault
    assert str(caught.value) == expected
    error = caught.value
    assert f"{error.path}:{error.line}:{error.column}: {error.message}" == expected


def test_every_error_of_a_file_is_reported():
    # GIVEN a policy with three different mistakes in three places
    text = """\
        version: 1
        default: maybe
        rules:
          - name: quarter
            match: {kernel: "*gemm*"}
            action: wrap
            wrapper: sm_share
            params: {share: .inf}
          - name: no-debug
            match:
              kernel_regex: '^(debug)+\\1$'
            action: deny
        """
    # WHEN it is parsed
    with pytest.raises(PolicyError) as caught:
        policy(text)
    # THEN all three are reported, one per line, in the order of the file
    assert str(caught.value).splitlines() == [
        "p.yaml:2:10: default must be 'allow' or 'deny', got the string 'maybe'",
        "p.yaml:8:21: params.share must be a finite number, got .inf",
        "p.yaml:11:21: unsupported regex '^(debug)+\\1$' in kernel_regex: a backreference at "
        f"offset 9 ({LINEAR})",
    ]
    # AND each is a PolicyError of its own, the first one's position on the whole
    error = caught.value
    assert [(e.line, e.column) for e in error.errors] == [(2, 10), (8, 21), (11, 21)]
    assert (error.line, error.column, error.message) == (2, 10, error.errors[0].message)


def test_mistakes_in_one_rule_and_in_lists_are_all_reported():
    # GIVEN one rule with a bad name, a bad glob in a list, two bad devices and a bad record
    text = """\
        version: 1
        rules:
          - name: 5
            match:
              kernel: [ok, "gemm_[sd"]
              device: [-1, 0, x]
            action: allow
            record: yes
        """
    # WHEN it is parsed
    with pytest.raises(PolicyError) as caught:
        policy(text)
    # THEN every one of them is reported
    assert str(caught.value).splitlines() == [
        'p.yaml:3:11: name must be a string, got the integer 5 (quote it to mean the text: '
        '"5")',
        "p.yaml:5:20: invalid glob 'gemm_[sd' in kernel: the '[' at offset 5 has no closing "
        "']'",
        "p.yaml:6:16: device must not be negative, got -1",
        "p.yaml:6:23: device must be an integer, got the string 'x'",
        "p.yaml:8:13: record must be true or false, got the string 'yes' (only true and false "
        "are booleans here)",
    ]


@pytest.mark.parametrize("text, expected", [
    # a misspelt key is not reported a second time as the key that is missing
    ("version: 1\nrules:\n  - acton: deny\n",
     ["p.yaml:3:5: unknown key 'acton' in rule 1 (did you mean 'action'?)"]),
    ("versoin: 1\n", ["p.yaml:1:1: unknown key 'versoin' at the top level (did you mean "
                      "'version'?)"]),
    ("version: 1\nrules:\n  - action: wrap\n    wraper: sm_share\n",
     ["p.yaml:4:5: unknown key 'wraper' in rule 1 (did you mean 'wrapper'?)"]),
    # an unknown range operator does not also leave the range empty
    ("version: 1\nrules:\n  - match: {grid_blocks: {gte: 1, lt: -1}}\n    action: deny\n",
     ["p.yaml:3:27: unknown range operator 'gte' in grid_blocks (did you mean 'ge'?)",
      "p.yaml:3:39: grid_blocks lt must not be negative, got -1"]),
])
def test_one_mistake_is_reported_once(text, expected):
    # GIVEN a policy whose mistakes could each be read as two
    # WHEN it is parsed
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    # THEN each is reported once
    assert str(caught.value).splitlines() == expected


def test_another_version_is_reported_alone():
    # GIVEN a policy for another version, whose keys this version does not know
    # WHEN it is parsed
    with pytest.raises(PolicyError) as caught:
        parse_policy("version: 2\nlimits: {gpus: 1}\nrules: 5\n", "p.yaml")
    # THEN only the version is reported: the rest is not this version's format
    assert str(caught.value) == "p.yaml:1:10: unsupported policy version 2 (this clc reads " \
                                "version 1)"


@pytest.mark.parametrize("text, expected", [
    ("""\
        version: 1
        rules:
          - name: guard
            action: hook
            hook: guard.py:guard
            message: "no"
        """, ["p.yaml:6:5: 'message' is not allowed on a hook rule: its hook answers it (rule "
              "'guard' has action: hook)"]),
    ("""\
        version: 1
        rules:
          - action: hook
            error: CUDA_ERROR_NOT_PERMITTED
            hook: guard.py:guard
        """, ["p.yaml:4:5: 'error' is not allowed on a hook rule: its hook answers it (rule "
              "'rule-1' has action: hook)"]),
    ("""\
        version: 1
        rules:
          - action: hook
            hook: guard.py:guard
            time: true
            record: true
        """, ["p.yaml:5:5: 'time' is not allowed on a hook rule: its hook answers it (rule "
              "'rule-1' has action: hook)",
              "p.yaml:6:5: 'record' is not allowed on a hook rule: its hook answers it (rule "
              "'rule-1' has action: hook)"]),
    ("""\
        version: 1
        rules:
          - action: hook
            hook: 5
            record: false
        """, ['p.yaml:4:11: hook must be a string, got the integer 5 (quote it to mean the '
              'text: "5")',
              "p.yaml:5:5: 'record' is not allowed on a hook rule: its hook answers it (rule "
              "'rule-1' has action: hook)"]),
], ids=["message", "error", "record-and-time", "bad-hook-and-record"])
def test_hook_rule_mistakes_are_all_reported(hook_dir, text, expected):
    # GIVEN a hook rule (its file exists) that sets what its hook answers
    # WHEN it is parsed
    with pytest.raises(PolicyError) as caught:
        policy(text)
    # THEN each key it may not set is reported, with any other mistake
    assert str(caught.value).splitlines() == expected


def test_custom_wrapper_params_fit_a_c_constant(tmp_path):
    # GIVEN a wrap rule with a device policy file and integer params beyond 64 bits
    (tmp_path / "policy.cu").write_text('extern "C" __device__ void clc_policy_init(void *s) {}\n')
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nrules:\n  - action: wrap\n    wrapper: policy.cu\n"
                    "    params: {budget: 9223372036854775808, floor: -9223372036854775809, "
                    "ok: 9223372036854775807, ratio: .nan}\n")
    # WHEN it is loaded
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    # THEN the non-finite one is reported; fixed, the ones too large for a C integer are
    assert str(caught.value) == f"{path}:5:104: params.ratio must be a finite number, got .nan"
    path.write_text(path.read_text().replace(", ratio: .nan", ""))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).splitlines() == [
        f"{path}:5:22: wrapper policy.cu: parameter budget must be between "
        "-9223372036854775808 and 9223372036854775807 (the device code gets it as a C integer "
        "constant), got 9223372036854775808",
        f"{path}:5:50: wrapper policy.cu: parameter floor must be between "
        "-9223372036854775808 and 9223372036854775807 (the device code gets it as a C integer "
        "constant), got -9223372036854775809",
    ]


def test_exponent_without_a_dot_is_a_number():
    # GIVEN params written as YAML 1.2 floats, which YAML 1.1 would read as strings
    loaded = policy("""\
        version: 1
        rules:
          - action: wrap
            wrapper: deadline
            params: {ms: 1e3}
          - action: wrap
            wrapper: sm_share
            params: {share: 25E-2}
        """)
    # THEN they are the numbers
    assert loaded.rules[0].wrap.params == (("ms", 1000.0),)
    assert loaded.rules[1].wrap.params == (("share", 0.25),)
    # AND quoted they stay strings
    with pytest.raises(PolicyError, match="params.ms must be a number, got the string '1e3'"):
        policy('version: 1\nrules:\n  - {action: wrap, wrapper: deadline, params: {ms: "1e3"}}')


def test_a_device_policy_file_is_read_once_when_the_policy_is_loaded(tmp_path):
    # GIVEN a wrap rule with a device policy file, loaded, and then the file changed
    from clc.wrapping.engine import spec_for
    (tmp_path / "policy.cu").write_text('extern "C" __device__ void clc_policy_init(void *s) {}\n')
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nrules:\n  - action: wrap\n    wrapper: policy.cu\n")
    loaded = load_policy(path)
    (tmp_path / "policy.cu").write_text("// something else entirely\n")
    # WHEN the program's engine gets the policy (as clc-run hands it over, in JSON) and builds
    # the wrapper for a kernel
    request = Policy.from_json(loaded.to_json()).rules[0].wrap
    spec = spec_for(request)
    # THEN it builds from the text read at load, not from the file as it is now
    assert "clc_policy_init" in spec.source
    # AND a file removed since does not matter either
    (tmp_path / "policy.cu").unlink()
    assert spec_for(request).source == spec.source


def test_wrap_rule_with_a_missing_policy_file_names_it(tmp_path):
    # GIVEN a wrap rule whose device policy file does not exist
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nrules:\n  - action: wrap\n    wrapper: nothere/policy.cu\n")
    # WHEN it is loaded
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    # THEN the error points at the wrapper and says which file was looked for
    assert str(caught.value).startswith(f"{path}:4:14: wrapper nothere/policy.cu: cannot read "
                                        f"{tmp_path / 'nothere' / 'policy.cu'}")


def test_wrap_rule_round_trips_through_json_and_explains(tmp_path):
    # GIVEN a wrap rule with params and on_unwrappable
    p = policy("""\
        version: 1
        rules:
          - name: quarter
            match: {kernel: "*gemm*"}
            action: wrap
            wrapper: sm_share
            params: {share: 0.25}
            on_unwrappable: deny
        """)
    rule = p.rules[0]
    # THEN the rule keeps the checked wrapper, and the JSON the program gets keeps it too
    assert rule.wrap.wrapper == "sm_share" and rule.wrap.params == (("share", 0.25),)
    assert rule.wrap.on_unwrappable == "deny"
    assert Policy.from_json(p.to_json()).rules[0] == rule
    # AND its outcome confines the kernel by a green context (no build): the share in
    # millionths, and the deny of a launch that cannot be confined
    outcome = rule.outcome(0)
    assert rule.wrap.mechanism == "green"
    assert outcome.action == abi.ACTION_CONFINE and outcome.wrap == rule.wrap
    assert outcome.replacement == abi.confine_word(abi.CAP_SHARE, 250000, deny=True)
    # AND explain says what happens
    text = p.explain(KernelInfo(mangled="_Z4gemmv", demangled="gemm()", device=0)).format()
    assert "wrap with sm_share(share=0.25) by green context (a kernel that cannot be confined: " \
           "deny) by rule 'quarter'" in text


def test_sm_share_by_the_splice_is_a_replace():
    # GIVEN sm_share asked of the splice
    p = policy("""\
        version: 1
        rules:
          - {name: s, action: wrap, wrapper: sm_share, params: {sms: 8}, mechanism: splice}
        """)
    # THEN its outcome is a replace the engine builds, and the JSON keeps the mechanism
    rule = p.rules[0]
    assert rule.wrap.mechanism == "splice" and rule.outcome(0).action == abi.ACTION_REPLACE
    assert Policy.from_json(p.to_json()).rules[0] == rule


@pytest.mark.parametrize("line,message", [
    ("{action: wrap, wrapper: sm_share, params: {sms: 8, place: middle}}",
     "3:63: wrapper sm_share: place must be first or last"),
    ("{action: wrap, wrapper: sm_share, params: {sms: 8, place: last}, mechanism: splice}",
     "3:81: place: last needs a green context (mechanism: green)"),
    ("{action: wrap, wrapper: block_count, mechanism: green}",
     "3:53: mechanism green confines sm_share only: block_count runs device code"),
    ("{action: wrap, wrapper: sm_share, params: {share: 0.5}, mechanism: fast}",
     "3:72: mechanism must be one of green, splice, got 'fast'"),
    ("{action: deny, mechanism: green}",
     "3:20: 'mechanism' is only allowed on a wrap rule"),
])
def test_mechanism_mistakes_are_reported_where_they_are(line, message):
    # WHEN a rule asks for a mechanism it cannot have
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"version: 1\nrules:\n  - {line}\n", "p.yaml")
    # THEN the error names the file, line and column of the value at fault
    assert f"p.yaml:{message}" in str(caught.value)


def test_shape_rule_limit_counts_only_shape_rules():
    # GIVEN exactly MAX_CLAUSES shape rules among any number of unconditional ones
    text = "version: 1\nrules:\n" + "".join(
        f"  - {{action: deny, match: {{shared_mem: {i}}}}}\n  - {{action: allow}}\n"
        for i in range(abi.MAX_CLAUSES))
    # WHEN it is parsed
    loaded = parse_policy(text)
    # THEN it loads
    assert sum(rule.has_shape for rule in loaded.rules) == abi.MAX_CLAUSES


def test_error_attributes():
    # GIVEN a policy whose version is wrong
    # WHEN it is parsed under a path
    with pytest.raises(PolicyError) as caught:
        parse_policy("version: 3\n", "/etc/clc/site.yaml")
    # THEN the attributes carry the parts of the message
    error = caught.value
    assert (error.path, error.line, error.column) == ("/etc/clc/site.yaml", 1, 10)
    assert error.message == "unsupported policy version 3 (this clc reads version 1)"


def test_load_policy_missing_file(tmp_path):
    # GIVEN a path where no file exists
    path = tmp_path / "absent.yaml"
    # WHEN it is loaded
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    # THEN the error names the path
    assert str(caught.value) == f"{path}:1:1: cannot read the policy: No such file or directory"


def test_load_policy_not_utf8(tmp_path):
    # GIVEN a file with a byte that is not UTF-8 on its second line
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"version: 1\ndefault: \xffallow\n")
    # WHEN it is loaded
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    # THEN the error points at the byte
    assert str(caught.value) == f"{path}:2:10: the policy is not UTF-8 text (byte 0xff)"


def test_load_policy_reads_file_with_bom(tmp_path):
    # GIVEN a UTF-8 file that starts with a byte order mark
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfversion: 1\ndefault: deny\n")
    # WHEN it is loaded
    loaded = load_policy(str(path))
    # THEN it is read and keeps its path
    assert loaded.default == "deny"
    assert loaded.path == str(path)


def test_loading_raises_nothing_but_policy_error():
    # GIVEN every prefix of a real policy, and random one-character corruptions of it
    text = (POLICIES / "deny-example.yaml").read_text()
    rng = random.Random(1234)
    variants = [text[:end] for end in range(0, len(text), 3)]
    alphabet = "[]{}:-,'\"!&*?|>#% \n\t0a"
    for _ in range(400):
        at = rng.randrange(len(text))
        variants.append(text[:at] + rng.choice(alphabet) + text[at + 1:])
    variants.append("[" * 5000)
    for variant in variants:
        # WHEN each is parsed
        # THEN it either loads or raises PolicyError
        try:
            parse_policy(variant, "fuzz.yaml")
        except PolicyError as error:
            assert error.line >= 1 and error.column >= 1


# ---- loading what is valid -----------------------------------------------------------------------

def test_full_rule_is_loaded():
    # GIVEN a rule that uses every field
    loaded = policy("""\
        version: 1
        default: deny
        on_error: deny
        rules:
          - name: everything
            match:
              kernel: ["*gemm*", "conv_*"]
              kernel_regex: "gemm|conv"
              grid_blocks: {gt: 10, le: 1_000}
              block_threads: 256
              shared_mem: {ge: 0x100}
              device: [0, 1]
              process: "python*"
              tenant: ""
            action: deny
            message: "no"
            error: 2
            record: true
            time: false
        """)
    # THEN every field is as written, with the launch-shape operators kept
    assert (loaded.version, loaded.default, loaded.on_error) == (1, "deny", "deny")
    assert loaded.rules == [Rule(
        name="everything", kernel=("*gemm*", "conv_*"), kernel_regex="gemm|conv",
        grid_blocks=(("gt", 10), ("le", 1000)), block_threads=(("eq", 256),),
        shared_mem=(("ge", 256),), device=(0, 1), process=("python*",), tenant=("",),
        action="deny", message="no", error=2, record=True, time=False, line=5)]
    rule = loaded.rules[0]
    assert rule.shape_range("grid_blocks") == (11, 1000)
    assert rule.shape_range("block_threads") == (256, 256)
    assert rule.shape_range("shared_mem") == (256, U64_MAX)


def test_defaults_and_rule_names():
    # GIVEN a policy with only a version and two unnamed rules and one named
    loaded = policy("""\
        version: 1
        rules:
          - action: allow
          - name: mine
            action: deny
          - action: deny
        """)
    # THEN default and on_error are allow, names are filled in, deny gets 800
    assert (loaded.default, loaded.on_error) == ("allow", "allow")
    assert loaded.rule_names == ["rule-1", "mine", "rule-3"]
    assert [rule.line for rule in loaded.rules] == [3, 4, 6]
    assert [rule.error for rule in loaded.rules] == [0, 800, 800]
    assert loaded.path == "p.yaml"


def test_yes_no_are_strings_in_globs():
    # GIVEN globs that YAML 1.1 would read as booleans
    loaded = policy("""\
        version: 1
        rules:
          - match: {tenant: [yes, no, on]}
            action: deny
        """)
    # THEN they are the words themselves
    assert loaded.rules[0].tenant == ("yes", "no", "on")


def test_glob_sets_are_accepted():
    # GIVEN globs whose '[' are closed, including a set holding ']'
    loaded = policy("""\
        version: 1
        rules:
          - match: {kernel: ["[]]x", "[!a]b", "k[0-9]", "[[]debug"]}
            action: deny
        """)
    # THEN they load unchanged
    assert loaded.rules[0].kernel == ("[]]x", "[!a]b", "k[0-9]", "[[]debug")


# ---- decisions ---------------------------------------------------------------------------------

def test_first_matching_rule_wins():
    # GIVEN two unconditional rules that both match
    loaded = policy("""\
        version: 1
        rules:
          - name: first
            match: {kernel: "vec*"}
            action: deny
          - name: second
            match: {kernel: "*"}
            action: allow
        """)
    # WHEN a vecAdd kernel is decided
    decision = loaded.decide(kernel())
    # THEN the first decides, without clauses
    assert decision == Decision([], Outcome(abi.ACTION_DENY, 0, 800, 0))
    # AND a kernel the first does not match falls to the second
    assert loaded.decide(kernel("matmul(float*)", "_Z6matmulPf")).fallback == \
        Outcome(abi.ACTION_ALLOW, 0, 0, 1)


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


def test_shape_clauses_accumulate_until_an_unconditional_match():
    # GIVEN shape rules around an unconditional rule for gemm kernels
    loaded = policy(SHAPES)
    # WHEN a gemm kernel is decided
    decision = loaded.decide(kernel("sgemm(float*)", "_Z5sgemmPf"))
    # THEN the two shape rules before it are clauses and it is the fallback
    assert decision == Decision(
        [Clause((0, 100), ANY_RANGE, ANY_RANGE,
                Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, 0)),
         Clause(ANY_RANGE, (513, U64_MAX), ANY_RANGE,
                Outcome(abi.ACTION_DENY, 0, CUDA_ERRORS["CUDA_ERROR_INVALID_VALUE"], 1))],
        Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD | abi.FLAG_TIME, 0, 2))
    # AND the first clause holding the launch decides it
    assert decision.outcome_for(100, 1024, 0).rule == 0
    assert decision.outcome_for(101, 1024, 0).rule == 1
    assert decision.outcome_for(101, 512, 1 << 20).rule == 2


def test_shape_clauses_fall_back_to_the_default():
    # GIVEN the same policy and a kernel no unconditional rule matches
    loaded = policy(SHAPES)
    # WHEN it is decided
    decision = loaded.decide(kernel())
    # THEN the shape rules it matches are clauses and the default deny is the fallback
    assert [clause.outcome.rule for clause in decision.clauses] == [1, 3]
    assert decision.clauses[1].shared_mem == (49152, U64_MAX)
    assert decision.fallback == Outcome(abi.ACTION_DENY, 0, 800, abi.RULE_DEFAULT)
    assert decision.outcome_for(1, 1, 0) == decision.fallback


@pytest.mark.parametrize("default, expected", [
    ("allow", Outcome(abi.ACTION_ALLOW, 0, 0, abi.RULE_DEFAULT)),
    ("deny", Outcome(abi.ACTION_DENY, 0, 800, abi.RULE_DEFAULT)),
])
def test_default_decides_when_nothing_matches(default, expected):
    # GIVEN a policy whose only rule does not match
    loaded = policy(f"""\
        version: 1
        default: {default}
        rules:
          - match: {{kernel: "*debug*"}}
            action: deny
        """)
    # WHEN a kernel is decided
    # THEN the default decides
    assert loaded.decide(kernel()) == Decision([], expected)


@pytest.mark.parametrize("on_error, expected", [
    ("allow", Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, abi.RULE_ON_ERROR)),
    ("deny", Outcome(abi.ACTION_DENY, abi.FLAG_RECORD, 800, abi.RULE_ON_ERROR)),
])
def test_on_error_outcome(on_error, expected):
    # GIVEN a policy with on_error set
    loaded = policy(f"version: 1\non_error: {on_error}\n")
    # WHEN clc asks what a failure means
    # THEN the outcome carries RULE_ON_ERROR, and is recorded (the capture says which launches
    # clc could not decide)
    assert loaded.on_error_outcome() == expected


@pytest.mark.parametrize("fields, action, flags, error", [
    ("action: allow", abi.ACTION_ALLOW, 0, 0),
    ("action: allow\n    record: true", abi.ACTION_ALLOW, abi.FLAG_RECORD, 0),
    ("action: allow\n    time: true", abi.ACTION_ALLOW, abi.FLAG_RECORD | abi.FLAG_TIME, 0),
    ("action: allow\n    record: false\n    time: true", abi.ACTION_ALLOW,
     abi.FLAG_RECORD | abi.FLAG_TIME, 0),
    ("action: deny\n    record: true", abi.ACTION_DENY, abi.FLAG_RECORD, 800),
    ("action: deny\n    error: CUDA_ERROR_OUT_OF_MEMORY", abi.ACTION_DENY, 0, 2),
    ("action: deny\n    error: 999\n    time: true", abi.ACTION_DENY,
     abi.FLAG_RECORD | abi.FLAG_TIME, 999),
])
def test_outcome_flags_and_errors(fields, action, flags, error):
    # GIVEN a single rule with these fields
    loaded = parse_policy(f"version: 1\nrules:\n  - {fields}\n")
    # WHEN any kernel is decided
    # THEN the outcome carries the action, the flags and the error
    assert loaded.decide(kernel()).fallback == Outcome(action, flags, error, 0)


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


@pytest.mark.parametrize("device, processes, tenant, rule", [
    (0, ("a.out",), "blue", 0),
    (0, ("a.out",), "Blue", abi.RULE_DEFAULT),
    (0, ("a.out",), "", 1),
    (1, ("python3.11", "/usr/bin/python3.11"), "a", 2),
    (2, ("ipython",), "a", 2),
    (0, ("python3",), "a", abi.RULE_DEFAULT),
    (1, ("a.out",), "a", abi.RULE_DEFAULT),
    (1, (), "a", abi.RULE_DEFAULT),
    (3, ("a.out",), "a", 3),
    (-1, ("a.out",), "a", abi.RULE_DEFAULT),
])
def test_tenant_process_and_device_matching(device, processes, tenant, rule):
    # GIVEN rules on tenant, process and device
    loaded = policy(CONTEXT)
    # WHEN a kernel is seen in this context
    outcome = loaded.decide(kernel(device=device, processes=processes, tenant=tenant)).fallback
    # THEN the expected rule decides
    assert outcome.rule == rule


@pytest.mark.parametrize("condition, matches", [
    ('kernel: "_ZN2at6native*"', True),  # mangled name only
    ('kernel: "*(int, at::native::FillFunctor<float>, *)"', True),  # full demangled only
    ('kernel: "at::native::vectorized_elementwise_kernel<*>"', True),  # base name only
    ('kernel: "void at::native::*"', True),  # demangled with its return type
    ('kernel: "vectorized_elementwise_kernel"', False),  # no glob characters: whole name
    ('kernel: "*Vectorized*"', False),  # case-sensitive
    ('kernel: ["*conv*", "*Fill*"]', True),  # any glob of a list
    ('kernel_regex: "^at::native::vectorized"', True),  # base name only
    ('kernel_regex: "^_ZN2at"', True),  # mangled name only
    ('kernel_regex: "\\\\(int, "', True),  # parameters: full demangled only
    ('kernel_regex: "^vectorized"', False),
])
def test_kernel_names_match_in_three_forms(condition, matches):
    # GIVEN a deny rule on a templated PyTorch kernel's name
    loaded = parse_policy(f"version: 1\nrules:\n  - match: {{{condition}}}\n    action: deny\n")
    info = KernelInfo(TEMPLATE_MANGLED, TEMPLATE_DEMANGLED, 0, ("python",), "")
    # WHEN the kernel is decided
    outcome = loaded.decide(info).fallback
    # THEN the rule matches when any of the mangled, demangled or base name does
    assert (outcome.rule == 0) is matches


def test_c_kernel_without_demangled_name():
    # GIVEN a C kernel whose names are all the same, and one with no demangled name
    loaded = policy("""\
        version: 1
        rules:
          - match: {kernel: add_kernel}
            action: deny
        """)
    # WHEN each is decided
    # THEN the plain name matches either way
    assert loaded.decide(kernel("add_kernel", "add_kernel")).fallback.rule == 0
    assert loaded.decide(kernel("", "add_kernel")).fallback.rule == 0


@pytest.mark.parametrize("match", ["", "\n    match: {}"])
def test_rule_without_conditions_matches_every_launch(match):
    # GIVEN a deny rule with no match, or an empty one
    loaded = parse_policy(f"version: 1\nrules:\n  - action: deny{match}\n")
    # WHEN unrelated kernels are decided
    # THEN the rule decides them all
    for info in (kernel(), KernelInfo(TEMPLATE_MANGLED, TEMPLATE_DEMANGLED, 7, (), "t")):
        assert loaded.decide(info) == Decision([], Outcome(abi.ACTION_DENY, 0, 800, 0))


def test_static_conditions_gate_shape_clauses():
    # GIVEN a shape rule limited to gemm kernels
    loaded = policy("""\
        version: 1
        rules:
          - match: {kernel: "*gemm*", grid_blocks: {gt: 10}}
            action: deny
        """)
    # WHEN another kernel is decided
    # THEN no clause is made for it
    assert loaded.decide(kernel()) == Decision([], ALLOW)


@pytest.mark.parametrize("demangled, base", [
    (TEMPLATE_DEMANGLED, TEMPLATE_BASE),
    ("vecAdd(float const*, float const*, float*, int)", "vecAdd"),
    ("add_kernel", "add_kernel"),
    ("(anonymous namespace)::scale(float*, int)", "(anonymous namespace)::scale"),
    ("void (anonymous namespace)::k<int>(int)", "(anonymous namespace)::k<int>"),
    ("void apply<void (*)(int)>(void (*)(int))", "apply<void (*)(int)>"),
    ("void k<(char)40>(int)", "k<(char)40>"),
    ("unsigned int count<1>(int)", "count<1>"),
    ("Functor::operator()(int) const", "Functor::operator()"),
    ("Functor::operator()", "Functor::operator()"),
    ("bool operator< <int>(A<int> const&, A<int> const&)", "operator< <int>"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<"
     "at::native::AddFunctor<float> >(at::TensorIteratorBase&, "
     "at::native::AddFunctor<float> const&)::{lambda(int)#1}>(int, "
     "at::native::gpu_kernel_impl<at::native::AddFunctor<float> >(at::TensorIteratorBase&, "
     "at::native::AddFunctor<float> const&)::{lambda(int)#1})",
     "at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<"
     "at::native::AddFunctor<float> >(at::TensorIteratorBase&, "
     "at::native::AddFunctor<float> const&)::{lambda(int)#1}>"),
])
def test_base_name(demangled, base):
    # GIVEN a demangled name
    # WHEN its base name is taken
    # THEN parameters and return type are gone, templates and scopes stay
    assert base_name(demangled) == base
    assert base_name(base) == base


# ---- kernel_regex -------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, names", [
    ("gemm_.*_f16$", {"gemm_tn_f16": True, "gemm_tn_f16x": False, "xgemm_nn_f16": True}),
    ("^(sgemm|dgemm)", {"sgemm_128": True, "dgemm": True, "hgemm": False, "my_sgemm": False}),
    ("[a-z]+_kernel", {"add_kernel": True, "_kernel": False, "ADD_kernel": False}),
    ("(?i)^VecAdd\\b", {"vecadd": True, "VECADD_2": False, "vecAdd": True}),
    ("^at::native::\\w+<4,", {TEMPLATE_BASE: True, "at::native::x<8, 4>": False}),
])
def test_ordinary_regexes_match_as_in_python(pattern, names):
    # GIVEN a deny rule with an ordinary kernel_regex
    loaded = parse_policy(f"version: 1\non_error: deny\nrules:\n"
                          f"  - match: {{kernel_regex: '{pattern}'}}\n    action: deny\n")
    for name, denied in names.items():
        # WHEN a kernel of that name is decided
        outcome = loaded.decide(kernel(name, name)).fallback
        # THEN the rule matches exactly when re.search finds the pattern
        assert (outcome.rule == 0) is denied is (re.search(pattern, name) is not None)


def test_backtracking_regex_is_checked_and_decided_quickly():
    # GIVEN '^(a+)+$', which re.search takes exponential time on, and a long name of a's that
    # does not match it
    code = textwrap.dedent("""\
        from clc.policy import KernelInfo, parse_policy
        loaded = parse_policy("version: 1\\nrules:\\n  - match: {kernel_regex: '^(a+)+$'}\\n"
                              "    action: deny\\n")
        for name in ("a" * 100_000 + "b", "a" * 100_000):
            print(loaded.decide(KernelInfo(name, name, 0)).fallback.rule)
        """)
    # WHEN the policy is checked and the kernels decided, in a process that may be killed
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=60)
    # THEN it finishes: the first falls to the default, the second is denied by the rule
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(abi.RULE_DEFAULT), "0"]


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", "_", ".", "[ab]", "[^a]", "[a-c_]", "\\w", "\\W", "\\d", "\\s", "\\b",
             "\\B", "^", "$", "\\A", "\\Z", "A", "\\.", "[]a]", "\\n", "1", "[\\d_]", "\\x61"]
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice(atoms)
    if roll < 0.6:
        return "".join(random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3)))
    if roll < 0.75:
        return "(" + rng.choice(["", "?:", "?P<g>"]) + "|".join(
            random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3))) + ")"
    inner = random_pattern(rng, depth + 1)
    return f"({inner})" + rng.choice(["*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}", "*?", "{}"])


def test_regexes_find_what_python_finds():
    # GIVEN random regexes of every construct clc supports, with and without flags, and names
    from clc.policy.regex import _regex
    rng = random.Random(7)
    compared = 0
    for _ in range(1500):
        pattern = rng.choice(["", "", "(?i)", "(?m)", "(?s)", "(?a)"]) + random_pattern(rng)
        try:
            expected = re.compile(pattern)
        except re.error:
            continue
        for name in ["", "a", "ab", "A_b", "a\n", "\nb", "é1", "x.y z"] + [
                "".join(rng.choice("abA_\n.1 ") for _ in range(rng.randint(0, 8)))
                for _ in range(4)]:
            # WHEN clc searches each name
            # THEN it finds the pattern exactly when re.search does
            assert _regex(pattern).search(name) is (expected.search(name) is not None), \
                (pattern, name)
            compared += 1
    assert compared > 5000


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


# ---- identity: user, group, cgroup -------------------------------------------------------------

PASSWD = {1000: "alice", 0: "root"}
GROUPS = {1000: "alice", 44: "video", 0: "root"}


@pytest.fixture
def identity_db(monkeypatch):
    """A user and group database holding PASSWD and GROUPS."""
    import grp
    import pwd

    def user(uid):
        if uid not in PASSWD:
            raise KeyError(f"getpwuid(): uid not found: {uid}")
        return pwd.struct_passwd((PASSWD[uid], "x", uid, uid, "", "/", "/bin/sh"))

    def group(gid):
        if gid not in GROUPS:
            raise KeyError(f"getgrgid(): gid not found: {gid}")
        return grp.struct_group((GROUPS[gid], "x", gid, []))

    monkeypatch.setattr(pwd, "getpwuid", user)
    monkeypatch.setattr(grp, "getgrgid", group)


def test_process_identity_comes_from_the_kernel(identity_db, monkeypatch, tmp_path):
    # GIVEN a process of uid 1000 with groups 1000, 44 and 4242 (no name), in a cgroup, and
    # environment variables that claim to be root
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    monkeypatch.setattr(os, "getgroups", lambda: [44, 1000, 4242])
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("12:cpu,cpuacct:/v1/ignored\n0::/user.slice/user-1000.slice/s-3.scope\n")
    monkeypatch.setattr("clc.policy.names._PROC_CGROUP", str(cgroup))
    for name in ("USER", "LOGNAME", "CLC_TENANT"):
        monkeypatch.setenv(name, "root")
    # WHEN its identity is read
    from clc.policy import Identity, process_identity
    identity = process_identity()
    # THEN names and ids come from the ids the kernel gives, the path from the v2 line
    assert identity == Identity(users=("alice", "1000"),
                                groups=("alice", "1000", "video", "44", "4242"),
                                cgroup="/user.slice/user-1000.slice/s-3.scope")


def test_process_identity_of_a_set_user_id_program_without_cgroup_v2(identity_db, monkeypatch,
                                                                     tmp_path):
    # GIVEN a set-user-ID root program run by uid 1000, on a machine with cgroup v1 only
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "getgid", lambda: 5000)
    monkeypatch.setattr(os, "getegid", lambda: 5000)
    monkeypatch.setattr(os, "getgroups", lambda: [])
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("12:cpu,cpuacct:/\n1:name=systemd:/user.slice\n")
    monkeypatch.setattr("clc.policy.names._PROC_CGROUP", str(cgroup))
    # WHEN its identity is read
    from clc.policy import process_identity
    identity = process_identity()
    # THEN both users count, the group without a name is its id, and there is no cgroup
    assert (identity.users, identity.groups, identity.cgroup) == (
        ("alice", "1000", "root", "0"), ("5000",), None)
    # AND without /proc/self/cgroup there is none either
    monkeypatch.setattr("clc.policy.names._PROC_CGROUP", str(tmp_path / "absent"))
    assert process_identity().cgroup is None


IDENTITY_RULES = """\
    version: 1
    on_error: deny
    rules:
      - name: alice
        match: {user: alice}
        action: deny
        error: 1
      - name: service-uid
        match: {user: 990}
        action: deny
        error: 2
      - name: video
        match: {group: [44, "gpu-*"]}
        action: deny
        error: 3
      - name: batch
        match: {cgroup: "/system.slice/slurmstepd.scope/*"}
        action: deny
        error: 4
    """


def with_identity(users=(), groups=(), cgroup=None) -> KernelInfo:
    from clc.policy import Identity
    return KernelInfo("_Z6vecAddPKfS0_Pfi", "vecAdd(float const*, float const*, float*, int)",
                      0, ("a.out",), "", Identity(tuple(users), tuple(groups), cgroup))


@pytest.mark.parametrize("identity, rule", [
    (dict(users=("alice", "1000")), 0),
    (dict(users=("bob", "1001"), groups=("bob", "1001")), abi.RULE_DEFAULT),
    (dict(users=("svc", "990")), 1),
    (dict(users=("990x",)), abi.RULE_DEFAULT),
    (dict(users=("bob", "1001"), groups=("bob", "1001", "video", "44")), 2),
    (dict(users=("bob", "1001"), groups=("gpu-users", "2000")), 2),
    (dict(users=("bob", "1001"), cgroup="/system.slice/slurmstepd.scope/job_7/step_0"), 3),
    (dict(users=("bob", "1001"), cgroup="/user.slice/system.slice/slurmstepd.scope/x"),
     abi.RULE_DEFAULT),
    (dict(), abi.RULE_DEFAULT),
])
def test_identity_keys_match(identity, rule):
    # GIVEN rules on a user name, a numeric uid, groups and a cgroup
    loaded = policy(IDENTITY_RULES)
    # WHEN a kernel of a process with this identity is decided
    outcome = loaded.decide(with_identity(**identity)).fallback
    # THEN the expected rule decides
    assert outcome.rule == rule


def test_identity_keys_are_explained():
    # GIVEN the identity rules and a process of bob in group video, and one of unknown identity
    loaded = policy(IDENTITY_RULES)
    known = loaded.explain(with_identity(("bob", "1001"), ("bob", "1001", "video", "44"),
                                         "/user.slice"))
    unknown = loaded.explain(with_identity())
    # THEN each step says what was matched against what
    assert [s.reason for s in known.steps[:3]] == [
        "user glob 'alice' does not match 'bob', '1001'",
        "user glob '990' does not match 'bob', '1001'",
        "group glob '44' matches '44'",
    ]
    assert [s.reason for s in unknown.steps] == [
        "user glob 'alice' does not match (no user known)",
        "user glob '990' does not match (no user known)",
        "group globs '44', 'gpu-*' do not match (no group known)",
        "cgroup glob '/system.slice/slurmstepd.scope/*' does not match (no cgroup v2 path)",
    ]
    # AND the identity is shown under the process
    assert known.format().splitlines()[4] == (
        "user 'bob', '1001'; groups 'bob', '1001', 'video', '44'; cgroup '/user.slice'")
    assert not any(line.startswith("user ") for line in unknown.format().splitlines())


def test_identity_rules_round_trip_through_json():
    # GIVEN the identity rules
    loaded = policy(IDENTITY_RULES)
    assert loaded.rules[1].user == ("990",) and loaded.rules[2].group == ("44", "gpu-*")
    # WHEN they go to JSON and back
    again = Policy.from_json(loaded.to_json())
    # THEN they are the same and decide the same
    assert again == loaded
    info = with_identity(("bob", "1001"), ("gpu-a",))
    assert again.decide(info) == loaded.decide(info)


# ---- explain -----------------------------------------------------------------------------------

def test_explain_deny_by_rule():
    # GIVEN the shipped deny example and a debug kernel
    loaded = load_policy(POLICIES / "deny-example.yaml")
    info = kernel("debug_dump(float*)", "_Z10debug_dumpPf")
    # WHEN its launch is explained
    explanation = loaded.explain(info)
    # THEN the first rule decides and the second is not reached
    assert explanation.deciding_rule == "no-debug-kernels"
    assert explanation.outcome == Outcome(abi.ACTION_DENY, 0, 800, 0)
    assert [(s.name, s.matched, s.reached, s.reason) for s in explanation.steps] == [
        ("no-debug-kernels", True, True, "kernel glob '*debug*' matches 'debug_dump'"),
        ("no-huge-grids", False, False, "rule 'no-debug-kernels' decided first"),
    ]
    assert explanation.format().splitlines()[-1] == (
        "=> deny (CUDA_ERROR_NOT_PERMITTED) by rule 'no-debug-kernels': "
        "debug kernels are not allowed on this server")


def test_explain_shape_rule():
    # GIVEN the shipped deny example and vecAdd
    loaded = load_policy(POLICIES / "deny-example.yaml")
    # WHEN a huge and a small launch are explained
    huge = loaded.explain(kernel(), grid=(2000, 1000, 1), block=(256, 1, 1))
    small = loaded.explain(kernel(), grid=(20, 1, 1))
    # THEN the launch shape decides between the rule and the default
    assert [s.reason for s in huge.steps] == [
        "kernel glob '*debug*' does not match 'vecAdd'", "grid_blocks 2000000 > 1000000"]
    assert huge.deciding_rule == "no-huge-grids"
    assert small.steps[1].reason == "grid_blocks 20 is not > 1000000"
    assert small.deciding_rule == "default"
    assert small.outcome == ALLOW
    assert small.format() == textwrap.dedent("""\
        kernel: vecAdd
          demangled: vecAdd(float const*, float const*, float*, int)
          mangled:   _Z6vecAddPKfS0_Pfi
        device 0, process 'a.out', tenant ''
        launch: grid (20, 1, 1) = 20 blocks, block (1, 1, 1) = 1 threads
          dynamic shared memory: 0 bytes
        rules:
          1. no-debug-kernels: no match: kernel glob '*debug*' does not match 'vecAdd'
          2. no-huge-grids: no match: grid_blocks 20 is not > 1000000
        => allow by default""")


def test_explain_reasons_for_every_condition():
    # GIVEN rules on every kind of condition
    loaded = policy("""\
        version: 1
        rules:
          - name: regex
            match: {kernel_regex: "gemm|conv"}
            action: deny
          - name: devices
            match: {device: [1, 2]}
            action: deny
          - name: one-device
            match: {device: 0, process: ["py*", "ipy*"]}
            action: deny
          - name: tenant
            match: {tenant: "b"}
            action: deny
          - name: all
            match:
              kernel: ["*x*", "vec*"]
              device: 0
              tenant: ""
              block_threads: {ge: 64, lt: 1024}
            action: allow
            time: true
        """)
    # WHEN a vecAdd launch is explained
    explanation = loaded.explain(kernel(), block=(32, 4, 1), shared_mem=16)
    # THEN each rule says why it failed or matched
    assert [s.reason for s in explanation.steps] == [
        "kernel_regex 'gemm|conv' does not match 'vecAdd'",
        "device 0 not in [1, 2]",
        "process globs 'py*', 'ipy*' do not match 'a.out'",
        "tenant glob 'b' does not match ''",
        "kernel glob 'vec*' matches 'vecAdd'; device 0 == 0; tenant glob '' matches ''; "
        "block_threads 128 >= 64; block_threads 128 < 1024",
    ]
    assert explanation.format().splitlines()[-1] == "=> allow by rule 'all' (recorded and timed)"


def test_explain_rule_without_conditions():
    # GIVEN the shipped audit and time-all policies
    for name, verdict in (("audit", "=> allow by rule 'record-everything' (recorded)"),
                          ("time-all", "=> allow by rule 'time-everything' (recorded and timed)")):
        loaded = load_policy(POLICIES / f"{name}.yaml")
        # WHEN any launch is explained
        explanation = loaded.explain(kernel())
        # THEN its only rule decides
        assert explanation.format().splitlines()[-1] == verdict
    assert explanation.steps[0].reason == "no match conditions: matches every launch"


def test_explain_agrees_with_decide():
    # GIVEN the shape policy, some kernels and some launch shapes
    loaded = policy(SHAPES)
    for info in (kernel(), kernel("sgemm(float*)", "_Z5sgemmPf")):
        decision = loaded.decide(info)
        for grid, block, shared in (((1, 1, 1), (1, 1, 1), 0), ((200, 1, 1), (1024, 1, 1), 0),
                                    ((5, 5, 5), (8, 8, 8), 49152), ((10, 10, 1), (32, 1, 1), 1)):
            # WHEN each launch is explained
            explanation = loaded.explain(info, grid, block, shared)
            # THEN it reports the outcome the C side computes, and the step that decided it
            blocks, threads = grid[0] * grid[1] * grid[2], block[0] * block[1] * block[2]
            assert explanation.outcome == decision.outcome_for(blocks, threads, shared)
            matched = [s.name for s in explanation.steps if s.matched]
            assert matched == ([] if explanation.deciding_rule == "default"
                               else [explanation.deciding_rule])


# ---- JSON -------------------------------------------------------------------------------------

def test_json_round_trip():
    # GIVEN policies using every field
    for loaded in (policy(SHAPES), policy(CONTEXT), policy("version: 1\ndefault: deny\n"),
                   *(load_policy(path) for path in shipped_policies())):
        # WHEN one goes to JSON and back
        text = loaded.to_json()
        again = Policy.from_json(text)
        # THEN it is the same policy and decides the same
        assert again == loaded
        assert again.to_json() == text
        assert json.loads(text)["version"] == 1
        for info in (kernel(), kernel("sgemm(float*)", "_Z5sgemmPf", device=1, tenant="b")):
            assert again.decide(info) == loaded.decide(info)


@pytest.mark.parametrize("text, expected", [
    ("{", "<json>:1:2: invalid policy JSON: Expecting property name enclosed in double quotes"),
    ('{"version": 1}', "<json>:1:1: invalid policy JSON: KeyError('path')"),
    ('{"version": 2, "path": "p", "default": "allow", "on_error": "allow", "rules": []}',
     "<json>:1:1: unsupported policy version 2"),
])
def test_from_json_rejects_bad_input(text, expected):
    # GIVEN text that is not a compiled policy
    # WHEN it is read
    with pytest.raises(PolicyError) as caught:
        Policy.from_json(text)
    # THEN a PolicyError says so
    assert str(caught.value) == expected


def test_module_needs_only_the_standard_library():
    # GIVEN a Python where PyYAML cannot be imported, and a compiled policy
    text = load_policy(POLICIES / "deny-example.yaml").to_json()
    code = textwrap.dedent("""\
        import sys
        sys.modules["yaml"] = None
        from clc.policy import Policy, PolicyError, parse_policy
        print(Policy.from_json(sys.stdin.read()).rule_names)
        try:
            parse_policy("version: 1")
        except PolicyError as error:
            print(error)
        """)
    # WHEN the module is imported there and reads the JSON
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True,
                            text=True, env=env, cwd=REPO, check=True)
    # THEN JSON works and YAML fails with a PolicyError
    assert result.stdout.splitlines() == [
        "['no-debug-kernels', 'no-huge-grids']",
        "<string>:1:1: reading a YAML policy needs PyYAML (pip install pyyaml)",
    ]


# ---- shipped policies ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.yaml")), ids=lambda path: path.name)
def test_every_shipped_policy_loads_without_warnings(path):
    # GIVEN a policy shipped in policies/ (the hook example needs the example hook)
    if path.name == "hook-example.yaml" and not EXAMPLE_HOOK.exists():
        pytest.skip("examples/hooks/arg_guard.py is absent")
    # WHEN it is loaded
    loaded = load_policy(path)
    # THEN it has rules and nothing `clc policy check --strict` would refuse
    assert loaded.rules
    assert [str(w) for w in loaded.warnings] == []


def test_strict_example_policy():
    # GIVEN the shipped fail-closed template
    from clc.policy import Identity
    loaded = load_policy(POLICIES / "strict-example.yaml")
    assert (loaded.default, loaded.on_error) == ("deny", "deny")
    assert loaded.on_error_outcome() == Outcome(abi.ACTION_DENY, abi.FLAG_RECORD, 800,
                                                abi.RULE_ON_ERROR)
    bob = Identity(("bob", "1001"), ("bob", "1001"), "/user.slice/user-1001.slice")
    user = Identity(("carol", "1002"), ("carol", "1002", "gpu-users", "3000"), "/user.slice")
    admin = Identity(("dave", "1003"), ("dave", "1003", "wheel", "10"), "/user.slice")
    job = Identity(("erin", "1004"), ("erin", "1004"),
                   "/system.slice/slurmstepd.scope/job_17/step_0/user/task_0")
    service = Identity(("infer", "990"), ("infer", "990"), "/system.slice/infer.service")

    def decide(identity, name="vecAdd(float*)", mangled="_Z6vecAddPf"):
        return loaded.decide(KernelInfo(mangled, name, 0, ("a.out",), "", identity))

    # WHEN kernels of each kind of process are decided
    # THEN someone listed nowhere is refused, even when the tenant claims otherwise
    assert decide(bob).fallback == Outcome(abi.ACTION_DENY, 0, 800, abi.RULE_DEFAULT)
    assert loaded.decide(KernelInfo("_Z1kv", "k()", 0, (), "admins", bob)).fallback.rule == \
        abi.RULE_DEFAULT
    # AND administrators run anything, recorded
    assert decide(admin).fallback == Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, 0)
    # AND batch jobs run library kernels only
    assert decide(job, "void cutlass::Kernel<F>(F)", "_ZN7cutlass6KernelI1FEEvT_").fallback \
        == Outcome(abi.ACTION_ALLOW, 0, 0, 1)
    assert decide(job).fallback.rule == abi.RULE_DEFAULT
    # AND gpu-users run their kernels, but not huge grids
    decision = decide(user)
    assert decision.outcome_for(1_000_000, 256, 0) == Outcome(abi.ACTION_ALLOW, 0, 0, 3)
    assert decision.outcome_for(1_000_001, 256, 0) == Outcome(abi.ACTION_DENY, 0, 800, 2)
    # AND the service account runs only its inference kernels
    assert decide(service, "infer_resnet50", "infer_resnet50").fallback.rule == 4
    assert decide(service).fallback.rule == abi.RULE_DEFAULT


def test_audit_policy():
    # GIVEN the shipped audit policy
    loaded = load_policy(POLICIES / "audit.yaml")
    # WHEN kernels are decided
    # THEN every launch is allowed and recorded, whatever its shape
    for info in (kernel(), kernel("debug_dump(float*)", "_Z10debug_dumpPf", device=3)):
        assert loaded.decide(info) == Decision([], Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD,
                                                           0, 0))
    assert loaded.default == "allow"


def test_deny_example_policy():
    # GIVEN the shipped deny example
    loaded = load_policy(POLICIES / "deny-example.yaml")
    assert loaded.rule_names == ["no-debug-kernels", "no-huge-grids"]
    # WHEN a debug kernel is decided
    # THEN it is denied whatever its shape
    debug = loaded.decide(kernel("void debug_dump<float>(float*)", "_Z10debug_dumpIfEvPT_"))
    assert debug == Decision([], Outcome(abi.ACTION_DENY, 0, 800, 0))
    # WHEN an ordinary kernel is decided
    decision = loaded.decide(kernel())
    # THEN only launches of more than 1000000 blocks are denied
    assert decision.outcome_for(1_000_000, 1024, 0) == ALLOW
    assert decision.outcome_for(1_000_001, 1, 0) == Outcome(abi.ACTION_DENY, 0, 800, 1)


def test_time_all_policy():
    # GIVEN the shipped time-all policy
    loaded = load_policy(POLICIES / "time-all.yaml")
    # WHEN kernels are decided
    # THEN every launch is allowed, recorded and timed
    for info in (kernel(), KernelInfo(TEMPLATE_MANGLED, TEMPLATE_DEMANGLED, 1, (), "x")):
        assert loaded.decide(info) == Decision(
            [], Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD | abi.FLAG_TIME, 0, 0))


# ---- Python hooks ------------------------------------------------------------------------------

GUARD = "def guard(launch):\n    return None\n"

HOOKED = """\
    version: 1
    default: deny
    rules:
      - name: small-grids-ok
        match: {grid_blocks: {le: 100}}
        action: allow
      - name: no-debug
        match: {kernel: "*debug*"}
        action: deny
      - name: big-blocks
        match: {block_threads: {gt: 512}}
        action: deny
        error: CUDA_ERROR_INVALID_VALUE
      - name: user-guard
        match: {kernel: "*vecAdd*"}
        action: hook
        hook: guard.py:guard
      - name: record-rest
        action: allow
        record: true
    """

ON_ERROR_ALLOW = Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, abi.RULE_ON_ERROR)
RECORD_REST = Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, 4)


@pytest.fixture
def hook_dir(tmp_path, monkeypatch):
    """A current directory holding guard.py, myhooks.py and more.py; its resolved path."""
    for name in ("guard.py", "myhooks.py", "more.py"):
        (tmp_path / name).write_text(GUARD)
    monkeypatch.chdir(tmp_path)
    return os.path.realpath(tmp_path)


def test_hook_rule_is_loaded(hook_dir):
    # GIVEN a hook rule whose file exists next to the policy
    loaded = policy(HOOKED)
    # THEN it keeps its match, and the hook is resolved with the text kept as written
    assert loaded.rules[3] == Rule(
        name="user-guard", kernel=("*vecAdd*",), action="hook",
        hook=HookRef(os.path.join(hook_dir, "guard.py"), "guard", "guard.py:guard"), line=14)
    assert loaded.rules[3].hook.label == "guard.py:guard"
    assert (loaded.rules[3].error, loaded.rules[3].flags) == (0, 0)
    assert all(rule.hook is None for i, rule in enumerate(loaded.rules) if i != 3)
    assert loaded.hooks == []
    # AND the rule has no outcome of its own
    with pytest.raises(ValueError, match="its hook answers"):
        loaded.rules[3].outcome(3)


@pytest.mark.parametrize("hook, expected", [
    ("hooks/absent.py:guard",
     "p.yaml:4:11: hook file 'hooks/absent.py' not found (looked for {dir}/hooks/absent.py)"),
    ('"absent.py:guard"',
     "p.yaml:4:11: hook file 'absent.py' not found (looked for {dir}/absent.py)"),
    ("pkg.py:guard", "p.yaml:4:11: hook file 'pkg.py' is not a file ({dir}/pkg.py)"),
])
def test_hook_file_errors(hook_dir, hook, expected):
    # GIVEN a hook rule whose file is missing, or is a directory
    os.mkdir("pkg.py")
    # WHEN the policy is parsed
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"version: 1\nrules:\n  - action: hook\n    hook: {hook}\n", "p.yaml")
    # THEN the error points at the hook and names the path it looked at
    assert str(caught.value) == expected.format(dir=hook_dir)


def test_hook_file_is_found_next_to_the_policy(tmp_path, monkeypatch):
    # GIVEN a policy in site/policies naming ../hooks/guard.py, read from another directory
    # that has a hooks/guard.py of its own
    site = tmp_path / "site"
    (site / "policies").mkdir(parents=True)
    (site / "hooks").mkdir()
    (site / "hooks" / "guard.py").write_text(GUARD)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "hooks").mkdir(parents=True)
    (elsewhere / "hooks" / "guard.py").write_text(GUARD)
    monkeypatch.chdir(elsewhere)
    path = site / "policies" / "p.yaml"
    path.write_text("version: 1\nrules:\n  - action: hook\n    hook: ../hooks/guard.py:guard\n")
    # WHEN it is loaded
    loaded = load_policy(path)
    # THEN the hook is the one next to the policy, as an absolute path without '..'
    assert loaded.rules[0].hook == HookRef(os.path.realpath(site / "hooks" / "guard.py"),
                                           "guard", "../hooks/guard.py:guard")
    # AND an absolute path is taken as it is
    absolute = os.path.realpath(elsewhere / "hooks" / "guard.py")
    path.write_text(f"version: 1\nrules:\n  - action: hook\n    hook: {absolute}:check\n")
    assert load_policy(path).rules[0].hook == HookRef(absolute, "check", f"{absolute}:check")
    # AND a policy given as text, with no file, finds its hooks in the current directory
    loaded = parse_policy("version: 1\nrules:\n  - action: hook\n    hook: hooks/guard.py:g\n")
    assert loaded.rules[0].hook.path == absolute


def test_hook_file_missing_next_to_the_policy(tmp_path, monkeypatch):
    # GIVEN a policy in a subdirectory whose hook exists only in the current directory
    (tmp_path / "guard.py").write_text(GUARD)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "sub" / "p.yaml"
    path.write_text("version: 1\nrules:\n  - name: g\n    action: hook\n    hook: guard.py:g\n")
    # WHEN it is loaded
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    # THEN the hook is looked for next to the policy, not in the current directory
    where = os.path.realpath(tmp_path / "sub")
    assert str(caught.value) == (f"{path}:5:11: hook file 'guard.py' not found (looked for "
                                 f"{where}/guard.py)")


def test_decide_stops_at_a_matching_hook_rule(hook_dir):
    # GIVEN shape rules before a hook rule for vecAdd, and a hook file on the command line
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py"])
    # WHEN vecAdd is decided
    decision = loaded.decide(kernel())
    # THEN the shape clauses before the hook rule stand, the hook rule is pending, and the
    # fallback is on_error until the hook answers
    small = Clause((0, 100), ANY_RANGE, ANY_RANGE, Outcome(abi.ACTION_ALLOW, 0, 0, 0))
    big = Clause(ANY_RANGE, (513, U64_MAX), ANY_RANGE,
                 Outcome(abi.ACTION_DENY, 0, CUDA_ERRORS["CUDA_ERROR_INVALID_VALUE"], 2))
    assert decision == Decision([small, big], ON_ERROR_ALLOW, 3)
    # AND kernels the hook rule does not match are decided without it
    assert loaded.decide(kernel("matmul(float*)", "_Z6matmulPf")) == \
        Decision([small, big], RECORD_REST)
    assert loaded.decide(kernel("debug_dump(float*)", "_Z10debug_dumpPf")) == \
        Decision([small], Outcome(abi.ACTION_DENY, 0, 800, 1))
    # AND a rule that decides before the hook rule keeps it from being asked
    assert policy("""\
        version: 1
        rules:
          - action: deny
          - action: hook
            hook: guard.py:guard
        """).decide(kernel()) == Decision([], Outcome(abi.ACTION_DENY, 0, 800, 0))


def test_resume_after_the_hook(hook_dir):
    # GIVEN vecAdd's decision waiting for its hook
    loaded = policy(HOOKED)
    pending = loaded.decide(kernel())
    # WHEN the hook returns None
    # THEN the rules after the hook rule decide, after the same clauses
    assert loaded.resume(kernel(), pending, None) == Decision(pending.clauses, RECORD_REST)
    # WHEN the hook answers
    denied = Outcome(abi.ACTION_DENY, abi.FLAG_RECORD, 999, 3)
    # THEN its answer is the fallback
    assert loaded.resume(kernel(), pending, denied) == Decision(pending.clauses, denied)
    # AND a finished decision cannot be resumed
    with pytest.raises(ValueError):
        loaded.resume(kernel(), Decision([], ALLOW), None)


def test_shaped_hook_rule_answers_as_a_clause(hook_dir):
    # GIVEN a hook rule on launches with dynamic shared memory, a second hook rule, then a
    # shape rule
    loaded = policy("""\
        version: 1
        rules:
          - name: shaped-guard
            match: {kernel: "vec*", shared_mem: {gt: 0}}
            action: hook
            hook: guard.py:guard
          - name: second-guard
            action: hook
            hook: guard.py:other
          - name: big
            match: {grid_blocks: {gt: 10}}
            action: deny
        """)
    # WHEN vecAdd is decided, the first hook denies and the second returns None
    first = loaded.decide(kernel())
    assert first == Decision([], ON_ERROR_ALLOW, 0)
    denied = Outcome(abi.ACTION_DENY, 0, 800, 0)
    second = loaded.resume(kernel(), first, denied)
    final = loaded.resume(kernel(), second, None)
    # THEN the first answer holds only inside the rule's ranges, the walk goes on to the
    # second hook for the rest, and after it to the shape rule and the default
    shared = Clause(ANY_RANGE, ANY_RANGE, (1, U64_MAX), denied)
    assert second == Decision([shared], ON_ERROR_ALLOW, 1)
    assert final == Decision(
        [shared, Clause((11, U64_MAX), ANY_RANGE, ANY_RANGE,
                        Outcome(abi.ACTION_DENY, 0, 800, 2))], ALLOW)
    assert final.outcome_for(1, 1, 4) == denied
    assert final.outcome_for(1, 1, 0) == ALLOW
    # AND a walk can start after any rule
    assert loaded.decide(kernel(), start=1) == Decision([], ON_ERROR_ALLOW, 1)
    assert loaded.decide(kernel(), start=2) == Decision(final.clauses[1:], ALLOW)


def test_explain_hooks_and_hook_rules(hook_dir):
    # GIVEN a hook file on the command line and a policy with a hook rule
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py"])
    # WHEN a vecAdd launch that the hook rule matches is explained
    explanation = loaded.explain(kernel(), grid=(200, 1, 1))
    # THEN the hook file comes first, the hook rule says it asks its hook, and the verdict
    # says what follows when the hooks return None
    assert explanation.format().splitlines() == [
        "kernel: vecAdd",
        "  demangled: vecAdd(float const*, float const*, float*, int)",
        "  mangled:   _Z6vecAddPKfS0_Pfi",
        "device 0, process 'a.out', tenant ''",
        "launch: grid (200, 1, 1) = 200 blocks, block (1, 1, 1) = 1 threads",
        "  dynamic shared memory: 0 bytes",
        "hooks:",
        "  hook file myhooks.py: asked first (its @clc.on_launch hooks, in order)",
        "rules:",
        "  1. small-grids-ok: no match: grid_blocks 200 is not <= 100",
        "  2. no-debug: no match: kernel glob '*debug*' does not match 'vecAdd'",
        "  3. big-blocks: no match: block_threads 1 is not > 512",
        "  4. user-guard: match: kernel glob '*vecAdd*' matches 'vecAdd'; asks guard.py:guard "
        "(its answer decides unless it returns None)",
        "  5. record-rest: match: no match conditions: matches every launch",
        "=> decided by the hooks in myhooks.py (asked first); if they return None: decided by "
        "hook guard.py:guard (rule 'user-guard'); if it returns None: allow by rule "
        "'record-rest' (recorded)",
    ]
    assert explanation.cli_hooks == ["myhooks.py"]
    assert explanation.hooks_asked == [("guard.py:guard", "user-guard")]
    assert (explanation.deciding_rule, explanation.outcome) == ("record-rest", RECORD_REST)


def test_explain_hook_rule_not_asked(hook_dir):
    # GIVEN the hook policy without command-line hooks
    loaded = policy(HOOKED)
    # WHEN launches the hook rule does not reach are explained
    small = loaded.explain(kernel(), grid=(5, 1, 1))
    matmul = loaded.explain(kernel("matmul(float*)", "_Z6matmulPf"), grid=(200, 1, 1))
    # THEN no hook is mentioned in the verdict
    assert small.format().splitlines()[-3:] == [
        "  4. user-guard: not reached: rule 'small-grids-ok' decided first",
        "  5. record-rest: not reached: rule 'small-grids-ok' decided first",
        "=> allow by rule 'small-grids-ok'"]
    assert "hooks:" not in small.format()
    assert matmul.steps[3].reason == "kernel glob '*vecAdd*' does not match 'matmul'"
    assert matmul.verdict() == "=> allow by rule 'record-rest' (recorded)"
    # AND with several hook files, each is listed in order
    both = loaded.with_cli_hooks(["myhooks.py", "more.py"]).explain(kernel(), grid=(5, 1, 1))
    assert both.format().splitlines()[6:9] == [
        "hooks:",
        "  hook file myhooks.py: asked first (its @clc.on_launch hooks, in order)",
        "  hook file more.py: asked next (its @clc.on_launch hooks, in order)"]
    assert both.verdict() == ("=> decided by the hooks in myhooks.py, more.py (asked first); "
                              "if they return None: allow by rule 'small-grids-ok'")


def test_explain_agrees_with_decide_when_hooks_return_none(hook_dir):
    # GIVEN the hook policy, some kernels and some launch shapes
    loaded = policy(HOOKED)
    for info in (kernel(), kernel("matmul(float*)", "_Z6matmulPf"),
                 kernel("debug_dump(float*)", "_Z10debug_dumpPf")):
        decision = loaded.decide(info)
        while decision.pending_hook is not None:
            decision = loaded.resume(info, decision, None)
        for grid, block in (((1, 1, 1), (1, 1, 1)), ((200, 1, 1), (1024, 1, 1)),
                            ((200, 1, 1), (8, 8, 1))):
            # WHEN each launch is explained
            explanation = loaded.explain(info, grid, block)
            # THEN its outcome is what the rules give when every hook returns None
            shape = (math.prod(grid), math.prod(block), 0)
            assert explanation.outcome == decision.outcome_for(*shape)
            deciding = [s.name for s in explanation.steps
                        if s.matched and "; asks " not in s.reason]
            assert deciding == ([] if explanation.deciding_rule == "default"
                                else [explanation.deciding_rule])


def test_cli_hooks_are_appended(hook_dir):
    # GIVEN a policy and hook files named relative to the current directory
    os.mkdir("sub")
    pathlib.Path("sub/extra.py").write_text(GUARD)
    loaded = policy(HOOKED)
    # WHEN they are added, in two goes
    once = loaded.with_cli_hooks(["myhooks.py"])
    twice = once.with_cli_hooks([pathlib.Path("sub/extra.py"), "./more.py"])
    # THEN each copy holds them in order, resolved, with the text as given
    assert once.hooks == [HookRef(os.path.join(hook_dir, "myhooks.py"), None, "myhooks.py")]
    assert twice.hooks == once.hooks + [
        HookRef(os.path.join(hook_dir, "sub", "extra.py"), None, "sub/extra.py"),
        HookRef(os.path.join(hook_dir, "more.py"), None, "./more.py")]
    assert twice.rules == loaded.rules
    # AND the policy they were added to is unchanged
    assert loaded.hooks == [] and once.hooks[0].label == "myhooks.py"


@pytest.mark.parametrize("path, expected", [
    ("nope.py", "nope.py: hook file not found"),
    ("sub/nope.py", "sub/nope.py: hook file not found"),
    ("guard.txt", "guard.txt: hook file must be a Python file ending in .py"),
    ("pkg.py", "pkg.py: hook file is not a file"),
])
def test_cli_hook_errors(hook_dir, path, expected):
    # GIVEN a hook file that is missing, not Python, or a directory
    pathlib.Path("guard.txt").write_text(GUARD)
    os.mkdir("pkg.py")
    # WHEN it is added
    with pytest.raises(HookFileError) as caught:
        policy(HOOKED).with_cli_hooks(["myhooks.py", path])
    # THEN the error names the file as given, and is a PolicyError without a position
    assert str(caught.value) == expected
    assert isinstance(caught.value, PolicyError)
    assert (caught.value.path, caught.value.line, caught.value.column) == (path, 0, 0)


def test_decider_names(hook_dir):
    # GIVEN the hook policy with two hook files on the command line
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py", "more.py"])
    rules = ["small-grids-ok", "no-debug", "big-blocks", "user-guard", "record-rest"]
    # THEN rule indices are unchanged and the hook files follow them
    assert loaded.decider_names() == rules + ["hook myhooks.py", "hook more.py"]
    # AND once the engine has expanded the files, each hook has an index of its own
    names = loaded.decider_names([["first", "second"], ["third"]])
    assert names == rules + ["hook myhooks.py:first", "hook myhooks.py:second",
                             "hook more.py:third"]
    assert [loaded.hook_decider_index(k) for k in range(3)] == [5, 6, 7]
    assert names[loaded.hook_decider_index(1)] == "hook myhooks.py:second"
    assert policy(HOOKED).decider_names() == rules
    with pytest.raises(ValueError):
        loaded.decider_names([["first"]])


def test_json_round_trip_with_hooks(hook_dir):
    # GIVEN a policy with a hook rule and hook files from the command line
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py", "more.py"])
    # WHEN it goes to JSON and back
    text = loaded.to_json()
    again = Policy.from_json(text)
    # THEN it is the same policy, hooks included, and decides the same
    assert again == loaded
    assert again.to_json() == text
    assert again.decide(kernel()) == loaded.decide(kernel())
    data = json.loads(text)
    assert data["hooks"] == [
        {"path": os.path.join(hook_dir, "myhooks.py"), "function": None, "text": "myhooks.py",
         "line": 0, "column": 0},
        {"path": os.path.join(hook_dir, "more.py"), "function": None, "text": "more.py",
         "line": 0, "column": 0}]
    assert data["rules"][3]["hook"] == {"path": os.path.join(hook_dir, "guard.py"),
                                        "function": "guard", "text": "guard.py:guard",
                                        "line": 17, "column": 11}
    assert data["rules"][3]["action"] == "hook"
    assert data["rules"][0]["hook"] is None


def test_from_json_reads_policies_from_before_hooks(hook_dir):
    # GIVEN the JSON of a policy without hooks, as clc wrote it before hooks existed, and
    # with names clc-run may add for the hooks
    plain = policy(SHAPES)
    data = json.loads(plain.to_json())
    del data["hooks"]
    for rule in data["rules"]:
        del rule["hook"]
    data["hook_deciders"] = ["h.py:first"]
    # WHEN it is read
    again = Policy.from_json(json.dumps(data))
    # THEN it has no hooks and is the same policy
    assert again.hooks == [] and all(rule.hook is None for rule in again.rules)
    assert again == plain


@pytest.mark.parametrize("hooks", ['[{"path": "/h.py"}]', '[{"path": "/h.py", "function": '
                                   'null, "text": "h.py", "extra": 1}]', '7'])
def test_from_json_rejects_bad_hooks(hooks):
    # GIVEN policy JSON whose hooks are not hook references
    text = ('{"version": 1, "path": "p", "default": "allow", "on_error": "allow", "rules": [], '
            f'"hooks": {hooks}}}')
    # WHEN it is read
    with pytest.raises(PolicyError) as caught:
        Policy.from_json(text)
    # THEN a PolicyError says so
    assert str(caught.value).startswith("<json>:1:1: invalid policy JSON: TypeError(")


def test_hook_example_policy_with_a_stand_in_hook(tmp_path):
    # GIVEN the shipped hook example in a copy of the repository's layout, with a stand-in for
    # the example hook
    (tmp_path / "policies").mkdir()
    (tmp_path / "examples" / "hooks").mkdir(parents=True)
    (tmp_path / "examples" / "hooks" / "arg_guard.py").write_text(GUARD)
    path = tmp_path / "policies" / "hook-example.yaml"
    path.write_text((POLICIES / "hook-example.yaml").read_text())
    # WHEN it is loaded
    loaded = load_policy(path)
    # THEN vecAdd kernels go to the hook and the rest are allowed and recorded
    assert loaded.rule_names == ["guard-vecadd", "record-the-rest"]
    assert loaded.rules[0].hook == HookRef(
        os.path.realpath(tmp_path / "examples" / "hooks" / "arg_guard.py"), "guard",
        "../examples/hooks/arg_guard.py:guard")
    record = Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, 1)
    pending = loaded.decide(kernel())
    assert pending == Decision([], ON_ERROR_ALLOW, 0)
    assert loaded.resume(kernel(), pending, None) == Decision([], record)
    assert loaded.decide(kernel("matmul(float*)", "_Z6matmulPf")) == Decision([], record)
    assert (loaded.default, loaded.on_error) == ("allow", "allow")
    assert Policy.from_json(loaded.to_json()) == loaded


@pytest.mark.skipif(not EXAMPLE_HOOK.exists(), reason="examples/hooks/arg_guard.py is absent")
def test_hook_example_policy():
    # GIVEN the shipped hook example and the shipped example hook
    loaded = load_policy(POLICIES / "hook-example.yaml")
    # THEN its hook rule names the example hook
    assert loaded.rules[0].hook == HookRef(os.path.realpath(EXAMPLE_HOOK), "guard",
                                           "../examples/hooks/arg_guard.py:guard")
    assert loaded.decide(kernel()).pending_hook == 0


# ---- CUDA errors ------------------------------------------------------------------------------

def test_cuda_error_names():
    # GIVEN the CUresult table
    # WHEN codes are named
    # THEN known ones get their enum name and others a readable stand-in
    assert CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"] == 800
    assert error_name(0) == "CUDA_SUCCESS"
    assert error_name(800) == "CUDA_ERROR_NOT_PERMITTED"
    assert error_name(12345) == "CUresult 12345"
    assert len(set(CUDA_ERRORS.values())) == len(CUDA_ERRORS)


def test_cuda_errors_match_the_toolkit_header():
    # GIVEN the CUresult enum of the installed toolkit's cuda.h
    header = pathlib.Path("/usr/local/cuda/include/cuda.h")
    if not header.exists():
        pytest.skip("no CUDA toolkit header here")
    enum = re.search(r"typedef enum cudaError_enum \{(.*?)\} CUresult;", header.read_text(),
                     re.S).group(1)
    enum = re.sub(r"/\*.*?\*/", "", enum, flags=re.S)
    # WHEN its names and values are read
    in_header = {name: int(value)
                 for name, value in re.findall(r"(CUDA_[A-Z0-9_]+)\s*=\s*(\d+)", enum)}
    # THEN the table holds every one of them with the same value
    assert {name: CUDA_ERRORS.get(name) for name in in_header} == in_header
