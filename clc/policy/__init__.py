# SPDX-License-Identifier: Apache-2.0
"""Admin policies: the YAML format, its checks, and what a policy decides for each kernel.

A policy is loaded once, by the `clc` command, where every mistake is reported with the file,
line and column of the node at fault. The traced program receives the checked policy as JSON
(Policy.to_json), so this package needs only the standard library; PyYAML is imported inside
the two loading functions (loader.py).

The engine calls Policy.decide once per kernel. Everything in the resulting Decision that
depends on the launch shape is a list of ranges, so the shim can decide every later launch of
that kernel in C without calling back into Python.

Python hooks decide in two places; the engine calls them:
- hook files given on the command line (`clc-run --hooks FILE`, Policy.hooks) are asked
  first, by the engine, before any rule: each file stands for its @clc.on_launch hooks, in
  order;
- a rule with `action: hook` and `hook: FILE.py:FUNCTION` asks that function for the kernels
  (and launch shapes) its `match` accepts. Policy.decide stops at the first such rule that
  matches (Decision.pending_hook); the engine calls the hook and goes on with Policy.resume.
Only the engine imports hook files; this package checks that they exist and names them.

The keys of a rule's `match` (every key given must hold; a list holds when any item does):
- kernel: globs (fnmatch, case-sensitive) tried on the kernel's base name, demangled name and
  mangled name.
- kernel_regex: a regex (Python's syntax) searched for in the same names. clc runs it in time
  linear in the name's length, so it may not use backreferences, lookarounds, conditional or
  atomic groups, possessive repeats or verbose mode; {m,n} repeats may write out to at most
  2000 states.
- grid_blocks, block_threads, shared_mem: the launch's blocks, threads per block and dynamic
  shared memory: an integer, or a mapping of gt/ge/lt/le/eq to integers (0 to 2**64-1).
- device: device ordinals (0 to 2**31-1).
- process: globs on the program's names (clc.policy.names.process_names).
- tenant: globs on the tenant name, $CLC_TENANT or `clc-run --tenant`. Whoever starts the
  program chooses it: a label for accounting, not an identity to trust.
- user: globs on the names and numeric ids of the process's real and effective user
  (`user: alice`, `user: 1000`, `user: "svc-*"`).
- group: globs on the names and numeric ids of the process's real, effective and supplementary
  groups: the rule holds when any of them matches.
- cgroup: globs on the process's cgroup v2 path as /proc/self/cgroup gives it (inside a
  cgroup namespace, relative to its root), such as "/system.slice/slurmstepd.scope/*"; `*`
  matches '/' too. On a machine without cgroup v2 it never matches.
user, group and cgroup come from the kernel (the process's credentials, the user and group
databases, /proc/self/cgroup), read once when the program starts (process_identity), never
from its environment.

Loading reports every mistake of a file at once (PolicyError.errors). A policy that loads may
still carry warnings (Policy.warnings): rules that earlier rules leave unreachable, deny rules
that ask to record or time, on_error: allow in a policy that denies.
"""

from clc.policy.decision import ANY_RANGE, Clause, Decision, Outcome, WrapRequest
from clc.policy.errors import HookFileError, PolicyError, PolicyWarning
from clc.policy.explain import Explanation, Step
from clc.policy.loader import load_policy, parse_policy
from clc.policy.model import Policy
from clc.policy.read_match import glob_problem
from clc.policy.rule import HookRef, Rule
from clc.policy.names import (Identity, KernelInfo, base_name, identity_of, identity_of_process,
                              process_identity)
from clc.policy.regex import regex_problem

__all__ = [
    "ANY_RANGE", "PolicyError", "HookFileError", "PolicyWarning", "Identity", "identity_of",
    "process_identity", "identity_of_process", "regex_problem", "KernelInfo", "base_name",
    "Outcome", "WrapRequest", "Clause", "Decision", "HookRef", "Rule", "Step", "Explanation",
    "Policy", "load_policy", "parse_policy", "glob_problem",
]
