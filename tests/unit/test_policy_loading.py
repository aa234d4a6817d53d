# SPDX-License-Identifier: Apache-2.0
"""The policy format: loading what is valid, and deciding: outcomes, shapes, contexts."""


import pytest

from clc import abi
from clc.cuda_errors import CUDA_ERRORS
from clc.policy import (
    ANY_RANGE, Clause, Decision, KernelInfo, Outcome, Rule, base_name, parse_policy,
)

from policy_cases import (
    ALLOW, CONTEXT, SHAPES, TEMPLATE_BASE, TEMPLATE_DEMANGLED, TEMPLATE_MANGLED, U64_MAX, kernel,
    policy
)


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
