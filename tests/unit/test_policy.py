# SPDX-License-Identifier: Apache-2.0
"""The policy format: loading, its error messages, decisions, explanations and JSON."""

import json
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
    ANY_RANGE, Clause, Decision, KernelInfo, Outcome, Policy, PolicyError, Rule, base_name,
    load_policy, parse_policy,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
U64_MAX = 2**64 - 1

TEMPLATE_MANGLED = ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5"
                    "arrayIPcLm1EEEEviT0_T1_")
TEMPLATE_DEMANGLED = ("void at::native::vectorized_elementwise_kernel<4, "
                      "at::native::FillFunctor<float>, std::array<char*, 1ul> >"
                      "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
TEMPLATE_BASE = ("at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                 "std::array<char*, 1ul> >")


def policy(text: str) -> Policy:
    return parse_policy(textwrap.dedent(text), "p.yaml")


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
             "default, on_error, rules)"),
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
             "grid_blocks, block_threads, shared_mem, device, process, tenant)"),
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
        """, "p.yaml:3:13: unknown action 'permit' (expected one of: allow, deny)"),
    ("unknown-action-close", """\
        version: 1
        rules:
          - action: Deny
        """, "p.yaml:3:13: unknown action 'Deny' (did you mean 'deny'?)"),
    ("planned-action-wrap", """\
        version: 1
        rules:
          - action: wrap
        """, "p.yaml:3:13: action 'wrap' is not supported in policy version 1 (expected one "
             "of: allow, deny)"),
    ("planned-action-hook", """\
        version: 1
        rules:
          - action: hook
        """, "p.yaml:3:13: action 'hook' is not supported in policy version 1 (expected one "
             "of: allow, deny)"),
    ("missing-action", """\
        version: 1
        rules:
          - name: r
            match: {kernel: "*"}
        """, "p.yaml:3:5: rule 'r' has no 'action' (expected one of: allow, deny)"),
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
    ("empty-rule-name", """\
        version: 1
        rules:
          - name: ""
            action: deny
        """, "p.yaml:3:11: a rule name must not be empty"),
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
    ("allow", Outcome(abi.ACTION_ALLOW, 0, 0, abi.RULE_ON_ERROR)),
    ("deny", Outcome(abi.ACTION_DENY, 0, 800, abi.RULE_ON_ERROR)),
])
def test_on_error_outcome(on_error, expected):
    # GIVEN a policy with on_error set
    loaded = policy(f"version: 1\non_error: {on_error}\n")
    # WHEN clc asks what a failure means
    # THEN the outcome carries RULE_ON_ERROR
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
                   *(load_policy(path) for path in sorted(POLICIES.glob("*.yaml")))):
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
