# SPDX-License-Identifier: Apache-2.0
"""The policy format: its error messages: every mistake with file:line:column."""

import random

import pytest

from clc import abi
from clc.policy import (
    KernelInfo, Policy,
    PolicyError, load_policy, parse_policy,
)

from policy_cases import LINEAR, POLICIES, policy


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
    assert str(caught.value) == f"{path}: cannot read the policy: No such file or directory"


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
