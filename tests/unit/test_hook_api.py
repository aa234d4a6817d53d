# SPDX-License-Identifier: Apache-2.0
"""The Python hook API: the package, decorators, decisions, Hook, hook references."""

import pathlib
import reprlib
import subprocess
import sys
import time

import pytest

import clc
from clc import abi
from clc.runtime import hooks
from clc.cuda_errors import CUDA_ERRORS
from clc.runtime.hooks import Hook, HookDecision, HookError
from clc.policy import Outcome, parse_policy

from hook_cases import kernel, make_launch

REPO = pathlib.Path(__file__).resolve().parents[2]
NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]


# ---- the package ------------------------------------------------------------------------------

def test_import_clc_loads_no_hook_machinery_and_only_the_standard_library():
    # GIVEN a fresh interpreter
    code = ("import sys; before = set(sys.modules); import clc; "
            "new = set(sys.modules) - before; assert new == {'clc'}, new; "
            "clc.on_launch; "
            "bad = [m for m in set(sys.modules) - before "
            "if m.split('.')[0] not in sys.stdlib_module_names and m.split('.')[0] != 'clc']; "
            "assert not bad, bad")
    # WHEN it imports clc and then uses the hook API
    # THEN `import clc` alone loads nothing else, and the hook API only the standard library
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_package_re_exports_the_hook_api():
    # GIVEN the names a hook file uses
    for name in ("on_launch", "on_exit", "allow", "deny", "wrap", "Launch", "Params", "Param",
                 "HookError"):
        # THEN clc gives clc.runtime.hooks' objects, and lists them
        assert getattr(clc, name) is getattr(hooks, name)
        assert name in clc.__all__ and name in dir(clc)
    assert clc.__version__
    with pytest.raises(AttributeError):
        clc.no_such_name  # noqa: B018

# ---- decorators --------------------------------------------------------------------------------

def test_bare_decorator_returns_the_function_with_a_hook_for_every_kernel():
    # WHEN a function is decorated without arguments
    def guard(launch):
        return None
    decorated = clc.on_launch(guard)
    # THEN the function comes back unchanged, linked to a Hook with the defaults
    assert decorated is guard
    hook = guard.__clc_hook__
    assert isinstance(hook, Hook) and hook.fn is guard
    assert hook.name == "test_hook_api.py:test_bare_decorator_returns_the_function_with_a_hook_" \
                        "for_every_kernel.<locals>.guard"
    assert not hook.every_launch and not hook.per_shape and hook.mode == abi.MODE_CACHED
    assert hook.matches(kernel()) and hook.matches(kernel("x", "x"))


def test_called_decorator_keeps_its_options():
    # WHEN the decorator is called with options
    @clc.on_launch(kernel=["*gemm*", "vec*"], every_launch=True)
    def a(launch):
        return None

    @clc.on_launch(kernel_regex=r"^soft", per_shape=True)
    def b(launch):
        return None
    # THEN each Hook has them
    assert a.__clc_hook__.kernel == ("*gemm*", "vec*") and a.__clc_hook__.every_launch
    assert a.__clc_hook__.mode == abi.MODE_EVERY_LAUNCH
    assert b.__clc_hook__.kernel_regex == r"^soft" and b.__clc_hook__.per_shape
    assert b.__clc_hook__.mode == abi.MODE_PER_SHAPE


@pytest.mark.parametrize("options,name,expected", [
    # the bare name, the demangled name and the mangled name are all tried
    ({"kernel": "vecAdd"}, None, True),
    ({"kernel": "vecAdd(float const*, float const*, float*, int)"}, None, True),
    ({"kernel": "_Z6vecAdd*"}, None, True),
    ({"kernel": "*gemm*"}, None, False),
    ({"kernel": ["*gemm*", "vec*"]}, None, True),
    ({"kernel_regex": "Add"}, None, True),  # re.search, not re.match
    ({"kernel_regex": "^Add"}, None, False),
    ({"kernel": "vec*", "kernel_regex": "gemm"}, None, False),  # both must hold
    ({"kernel": "at::native::*"},
     ("void at::native::k<4>(int)", "_ZN2at6native1kILi4EEEvi"), True),
])
def test_kernel_matching_is_the_policys(options, name, expected):
    # GIVEN a hook and a policy rule with the same conditions
    demangled, mangled = name or ("vecAdd(float const*, float const*, float*, int)",
                                  "_Z6vecAddPKfS0_Pfi")
    info = kernel(demangled, mangled)
    hook = Hook(lambda launch: None, "t.py:f", **options)
    match = "".join(f"\n      {key}: {value!r}" for key, value in options.items())
    rule = parse_policy(f"version: 1\nrules:\n  - action: allow\n    match:{match}\n").rules[0]
    # THEN they agree, and with the expected answer
    assert hook.matches(info) is expected
    assert rule.check_static(info)[0] is expected
    # AND the answer is the same when asked again (cached per kernel)
    assert hook.matches(info) is expected


def test_every_launch_and_per_shape_together_is_an_error_naming_the_function():
    # WHEN both frequencies are asked for
    with pytest.raises(HookError) as caught:
        @clc.on_launch(every_launch=True, per_shape=True)
        def both(launch):
            return None
    # THEN the error names the function and says why
    message = str(caught.value)
    assert "both" in message and "test_hook_api.py" in message
    assert "every_launch=True and per_shape=True" in message


@pytest.mark.parametrize("options,fragment", [
    ({"kernel": "[abc"}, "invalid glob '[abc' in kernel: the '[' at offset 0 has no closing ']'"),
    ({"kernel": ["ok*", "x[!"]}, "invalid glob 'x[!' in kernel"),
    ({"kernel": []}, "kernel must not be an empty list"),
    ({"kernel": ""}, "a kernel glob must not be empty"),
    ({"kernel": 3}, "kernel must be a glob or a list of globs, got int"),
    ({"kernel_regex": "(unclosed"}, "invalid regex '(unclosed' in kernel_regex: missing ), "),
    ({"every_launch": 1}, "every_launch must be True or False, got 1"),
])
def test_bad_options_fail_at_decoration_naming_the_function(options, fragment):
    # WHEN a decorator gets a bad option
    with pytest.raises(HookError) as caught:
        @clc.on_launch(**options)
        def bad_hook(launch):
            return None
    # THEN the error says what is wrong and in which function
    assert "bad_hook" in str(caught.value)
    assert fragment in str(caught.value)


def test_positional_glob_and_double_decoration_are_refused():
    # WHEN the glob is passed positionally
    with pytest.raises(HookError, match=r"write @clc.on_launch\(kernel='\*gemm\*'\)"):
        clc.on_launch("*gemm*")

    # WHEN a function is decorated twice
    def twice(launch):
        return None
    clc.on_launch(kernel="a*")(twice)
    # THEN the second decorator says what to do instead
    with pytest.raises(HookError, match="already a hook"):
        clc.on_launch(kernel="b*")(twice)
    # AND non-callables are refused
    with pytest.raises(HookError, match="must decorate a function"):
        clc.on_launch(kernel="x")(42)
    with pytest.raises(HookError, match="must decorate a function"):
        clc.on_exit(42)


def test_on_exit_returns_the_function_in_both_forms():
    def summary(stats):
        pass

    def other(stats):
        pass
    # WHEN on_exit is used bare and called
    # THEN both give the function back
    assert clc.on_exit(summary) is summary
    assert clc.on_exit()(other) is other

# ---- decisions --------------------------------------------------------------------------------

def test_allow_carries_its_flags():
    # GIVEN the three kinds of allow
    # THEN time implies record, and the outcome carries the rule index
    assert clc.allow() == HookDecision(abi.ACTION_ALLOW, 0, 0)
    assert clc.allow(record=True).flags == abi.FLAG_RECORD
    assert clc.allow(time=True).flags == abi.FLAG_RECORD | abi.FLAG_TIME
    assert clc.allow(record=True, time=True).flags == abi.FLAG_RECORD | abi.FLAG_TIME
    assert clc.allow(time=True).outcome(3) == \
        Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD | abi.FLAG_TIME, 0, 3)
    assert clc.allow().allowed and clc.allow(record=True).record and clc.allow(time=True).time
    assert repr(clc.allow(record=True)) == "clc.allow(record=True)"


def test_deny_carries_its_error_and_message():
    # WHEN deny is given no error, a name and a number
    default = clc.deny("too large")
    named = clc.deny(error="CUDA_ERROR_INVALID_VALUE")
    numbered = clc.deny("m", error=999)
    # THEN each becomes the CUresult a denied launch returns
    assert default == HookDecision(abi.ACTION_DENY, 0, NOT_PERMITTED, "too large")
    assert named.error == 1 and named.message == ""
    assert numbered.error == 999
    assert default.outcome(-1) == Outcome(abi.ACTION_DENY, 0, NOT_PERMITTED, -1)
    assert not default.allowed
    assert repr(default) == "clc.deny('too large', error='CUDA_ERROR_NOT_PERMITTED')"


@pytest.mark.parametrize("kwargs,fragment", [
    ({"error": "CUDA_ERROR_NOT_PERMITED"},
     "unknown CUDA error 'CUDA_ERROR_NOT_PERMITED' (did you mean 'CUDA_ERROR_NOT_PERMITTED'?)"),
    ({"error": 0}, "must not be CUDA_SUCCESS"),
    ({"error": "CUDA_SUCCESS"}, "must not be CUDA_SUCCESS"),
    ({"error": -1}, "between 1 and"),
    ({"error": True}, "CUresult name or number, got bool"),
    ({"message": 5}, "message must be a string"),
])
def test_deny_refuses_bad_errors(kwargs, fragment):
    # WHEN deny gets an error that no launch can return
    with pytest.raises(HookError) as caught:
        clc.deny(**kwargs)
    # THEN it says why
    assert fragment in str(caught.value)


def test_wrap_answers_a_checked_wrap_request(tmp_path):
    # WHEN a hook asks for a built-in wrapper with its parameters
    answer = clc.wrap("sm_share", share=0.5, on_unwrappable="deny", record=True,
                      mechanism="splice")
    # THEN the answer is a replace carrying the checked request
    assert answer.action == abi.ACTION_REPLACE and answer.record and not answer.time
    assert answer.wrap.wrapper == "sm_share" and answer.wrap.params == (("share", 0.5),)
    assert answer.outcome(3).wrap == answer.wrap and answer.outcome(3).rule == 3
    assert repr(answer) == "clc.wrap(sm_share(share=0.5), on_unwrappable='deny')"


def test_sm_share_confines_by_green_context_unless_told_otherwise():
    # WHEN a hook asks for sm_share without a mechanism
    answer = clc.wrap("sm_share", sms=16, on_unwrappable="deny")
    # THEN the kernel is confined, no build: the outcome carries the share and the deny
    outcome = answer.outcome(2)
    assert outcome.action == abi.ACTION_CONFINE and outcome.rule == 2
    assert outcome.replacement == abi.confine_word(abi.CAP_SMS, 16, deny=True)
    assert repr(answer) == "clc.wrap(sm_share(sms=16) by green context, on_unwrappable='deny')"
    # AND a share is carried in millionths
    share = clc.wrap("sm_share", share=0.25).outcome(0)
    assert share.replacement == abi.CAP_SHARE << abi.CONFINE_KIND_SHIFT | 250000


def test_green_context_is_for_sm_share_only():
    # WHEN a hook asks for a wrapper that needs device code by a green context
    with pytest.raises(HookError) as caught:
        clc.wrap("block_count", mechanism="green")
    # THEN it is told why not
    assert "mechanism green confines sm_share only: block_count runs device code" in \
        str(caught.value)
    with pytest.raises(HookError, match="mechanism must be one of green, splice, got 'fast'"):
        clc.wrap("sm_share", share=0.5, mechanism="fast")


def test_a_hook_cannot_confine_the_whole_program():
    # WHEN a hook, which answers for one kernel, asks for the whole process
    with pytest.raises(HookError, match=r"scope='program' \(the whole process\) is for policy "
                                        r"rules"):
        clc.wrap("sm_share", share=0.5, scope="program")
    # THEN it is refused; scope='kernel' is what a hook's answer always is
    assert clc.wrap("sm_share", share=0.5, scope="kernel").outcome(0).action == \
        abi.ACTION_CONFINE


@pytest.mark.parametrize("args,kwargs,fragment", [
    (("anything",), {}, "clc.wrap(): unknown wrapper 'anything'"),
    (("sm_share",), {"share": 2}, "share must be > 0 and <= 1, got 2"),
    (("deadline",), {}, "params must be {ms: N}"),
    (("block_count",), {"on_unwrappable": "skip"}, "on_unwrappable must be 'allow' or 'deny'"),
    (("missing_policy.cu",), {}, "cannot read"),
])
def test_wrap_refuses_what_cannot_be_built(args, kwargs, fragment):
    # WHEN a hook asks for a wrapper that does not exist or with bad parameters
    with pytest.raises(HookError) as caught:
        clc.wrap(*args, **kwargs)
    # THEN it is told what is wrong
    assert fragment in str(caught.value)

# ---- Hook.call ----------------------------------------------------------------------------------

def test_hook_call_times_the_function():
    # GIVEN a hook that takes at least 2 ms and one that is fast
    def slow(launch):
        time.sleep(0.002)
        return clc.deny("no")
    hook = Hook(slow, "t.py:slow")
    launch = make_launch()
    # WHEN it is called twice
    first = hook.call(launch)
    hook.fn = lambda launch: None
    second = hook.call(launch)
    # THEN its answers come back and its time is kept
    assert first == clc.deny("no") and second is None
    assert hook.calls == 2
    assert hook.max_ns >= 2_000_000 and hook.total_ns >= hook.max_ns
    assert hook.last_ns < hook.max_ns


@pytest.mark.parametrize("value", [True, "allow", 0, (clc.allow(),), Outcome(0, 0, 0, 0)])
def test_hook_call_refuses_other_return_values(value):
    # GIVEN a hook that returns something that is not a decision
    hook = Hook(lambda launch: value, "hooks.py:guard")
    # WHEN it is called
    with pytest.raises(HookError) as caught:
        hook.call(make_launch())
    # THEN the error names the hook and what it returned
    assert str(caught.value) == (f"hook hooks.py:guard returned {reprlib.repr(value)}; "
                                 "expected clc.allow(...), clc.deny(...), clc.wrap(...) or None")
    # AND the call still counts
    assert hook.calls == 1


def test_hook_call_lets_exceptions_through_and_counts_them():
    # GIVEN a hook that raises
    def broken(launch):
        raise KeyError("boom")
    hook = Hook(broken, "t.py:broken")
    # WHEN it is called
    # THEN the exception reaches the caller (the engine reports it)
    with pytest.raises(KeyError):
        hook.call(make_launch())
    assert hook.calls == 1
