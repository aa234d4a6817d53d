# SPDX-License-Identifier: Apache-2.0
"""The Python hook API: decorators, decisions, argument readers, Launch, Hook, hook files."""

import ctypes
import os
import pathlib
import reprlib
import struct
import subprocess
import sys
import textwrap
import time

import pytest

import clc
from clc import abi
from clc.runtime import hooks
from clc.cuda_errors import CUDA_ERRORS
from clc.runtime.hooks import (
    Dim3, ExitStats, Hook, HookDecision, HookError, HookLoadError, KernelStats, Launch, Param,
    Params, load_hook_file, resolve_hook_ref,
)
from clc.policy import KernelInfo, Outcome, parse_policy

REPO = pathlib.Path(__file__).resolve().parents[2]
NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]


def kernel(demangled="vecAdd(float const*, float const*, float*, int)",
           mangled="_Z6vecAddPKfS0_Pfi"):
    return KernelInfo(mangled, demangled, 0, ("a.out",), "")


def write(directory: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


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


# ---- arguments ---------------------------------------------------------------------------------

class Pair(ctypes.Structure):
    # struct {int a; float b; double c;}: 16 bytes, no padding
    _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_float), ("c", ctypes.c_double)]


class Padded(ctypes.Structure):
    # struct {char a; double b;}: 7 bytes of padding after a
    _fields_ = [("a", ctypes.c_char), ("b", ctypes.c_double)]


# The arguments of one imaginary kernel, as (name, ctypes type, value).
ARGS = [
    ("i8", ctypes.c_int8, -5),
    ("u8", ctypes.c_uint8, 250),
    ("i16", ctypes.c_int16, -300),
    ("u16", ctypes.c_uint16, 65000),
    ("i32", ctypes.c_int32, -70000),
    ("u32", ctypes.c_uint32, 4_000_000_000),
    ("i64", ctypes.c_int64, -(2**40)),
    ("u64", ctypes.c_uint64, 2**63 + 5),
    ("f32", ctypes.c_float, 1.5),
    ("f64", ctypes.c_double, -2.25),
    ("ptr", ctypes.c_void_p, 0x7F00_DEAD_B000),
    ("pair", Pair, (7, 0.5, 3.25)),
    ("padded", Padded, (b"z", 9.75)),
]


class Block(ctypes.Structure):
    # The kernel's parameter block as the compiler lays it out: each argument at its own
    # alignment, which is what `extra` buffers hold and what the driver reports as offsets.
    _fields_ = [(name, ctype) for name, ctype, _ in ARGS]


LAYOUT = [(getattr(Block, name).offset, getattr(Block, name).size) for name, _, _ in ARGS]


def make_value(ctype, value):
    return ctype(*value) if isinstance(value, tuple) else ctype(value)


BLOCK = bytes(Block(*[make_value(ctype, value) for _, ctype, value in ARGS]))


def query(args=BLOCK, *, status=abi.ARGS_OK, entry=abi.ENTRY_LAUNCH, layout=LAYOUT):
    """A query block as the shim hands it to the engine: clc_kernel_query, then the launch's
    argument bytes laid out as the kernel's parameter block."""
    head = abi.KERNEL_QUERY.pack(0x1234, 0x5000, 1, entry, 3, status, 0, 1024, 2, 1, 256, 1, 1,
                                 4096, 4242, 0x77, 0, 0, 0, len(layout), len(args),
                                 abi.ASK_KERNEL)
    return head + args


def make_launch(blob=None, layout=LAYOUT, **kwargs):
    return hooks.QueryLaunch.from_query(
        query(**kwargs) if blob is None else blob, "_Z6vecAddPKfS0_Pfi",
        "vecAdd(float const*, float const*, float*, int)", layout)


@pytest.fixture
def params():
    return make_launch().params


def test_layout_matches_the_c_struct_layout():
    # GIVEN the compiler's layout of the parameter block
    # THEN the packed structs sit at their alignment with their C sizes
    assert ctypes.sizeof(Pair) == 16 and ctypes.sizeof(Padded) == 16
    assert dict(zip([n for n, _, _ in ARGS], LAYOUT))["f64"][0] % 8 == 0


def test_integer_readers(params):
    # GIVEN the arguments of a launch
    by_name = {name: params[i] for i, (name, _, _) in enumerate(ARGS)}
    # THEN signed and unsigned integers of each size read back
    assert by_name["i8"].as_int() == -5 and by_name["u8"].as_uint() == 250
    assert by_name["i8"].as_uint() == 251 and by_name["u8"].as_int() == -6
    assert by_name["i16"].as_int() == -300 and by_name["u16"].as_uint() == 65000
    assert by_name["i32"].as_int() == -70000 and by_name["u32"].as_uint() == 4_000_000_000
    assert by_name["i64"].as_int() == -(2**40) and by_name["u64"].as_uint() == 2**63 + 5
    assert by_name["u64"].as_int() == 2**63 + 5 - 2**64


def test_float_pointer_and_struct_readers(params):
    # GIVEN the arguments of a launch
    by_name = {name: params[i] for i, (name, _, _) in enumerate(ARGS)}
    # THEN floats, doubles and pointers read back
    assert by_name["f32"].as_float() == 1.5 and by_name["f64"].as_float() == -2.25
    assert by_name["ptr"].as_ptr() == 0x7F00_DEAD_B000
    # AND structs by value unpack with their real C layout
    assert by_name["pair"].as_struct("ifd") == (7, 0.5, 3.25)
    assert by_name["pair"].as_struct("@ifd") == (7, 0.5, 3.25)
    assert by_name["padded"].as_struct("c7xd") == (b"z", 9.75)
    assert by_name["padded"].as_struct("@cd") == (b"z", 9.75)
    # AND raw is the argument's bytes
    assert by_name["pair"].raw == bytes(Pair(7, 0.5, 3.25))


def test_params_is_a_sequence(params):
    # GIVEN the arguments of a launch
    # THEN len, indexing (negative too), slicing and iteration work
    assert len(params) == len(ARGS)
    assert [p.index for p in params] == list(range(len(ARGS)))
    assert [(p.offset, p.size) for p in params] == LAYOUT
    assert params[-1] is params[len(ARGS) - 1]
    assert [p.index for p in params[1:3]] == [1, 2]
    with pytest.raises(IndexError):
        params[len(ARGS)]


def test_params_from_a_block_for_tests_of_a_hook():
    # GIVEN a parameter block in hand (a user's test of their hook)
    params = Params.from_block(LAYOUT, BLOCK)
    # THEN it reads as a launch's do
    assert params[2].as_int() == -300 and params[-2].as_struct("ifd") == (7, 0.5, 3.25)
    launch = Launch(name="k", grid=(2, 1, 1), params=params)
    assert launch.params[0].as_int() == -5 and launch.grid.blocks == 2
    assert len(Launch(name="k").params) == 0


@pytest.mark.parametrize("name,reader,fragment", [
    ("pair", "as_int", "the parameter is 16 bytes; integers are 1, 2, 4 or 8 bytes"),
    ("pair", "as_uint", "the parameter is 16 bytes; integers are 1, 2, 4 or 8 bytes"),
    ("i16", "as_float", "the parameter is 2 bytes; a float is 4 bytes and a double 8"),
    ("i32", "as_ptr", "the parameter is 4 bytes; a pointer is 8 bytes"),
])
def test_readers_refuse_wrong_sizes(params, name, reader, fragment):
    # GIVEN an argument of one size
    param = params[[n for n, _, _ in ARGS].index(name)]
    # WHEN it is read as a value of another size
    with pytest.raises(HookError) as caught:
        getattr(param, reader)()
    # THEN the error gives both sizes
    assert fragment in str(caught.value)


def test_as_struct_names_both_sizes_when_they_differ(params):
    # GIVEN a 16-byte struct argument
    param = params[[n for n, _, _ in ARGS].index("padded")]
    # WHEN it is unpacked without its padding
    with pytest.raises(HookError) as caught:
        param.as_struct("cd")
    # THEN the error names the format's size and the parameter's
    assert "format 'cd' is 9 bytes but the parameter is 16 bytes" in str(caught.value)
    with pytest.raises(HookError, match="bad format"):
        param.as_struct("q?Z")


def test_a_short_extra_buffer_reads_what_it_holds():
    # GIVEN the shim's copy of an extra buffer that says it is 8 bytes long
    params = make_launch(query(BLOCK[:8])).params
    # THEN the arguments inside it read, and one past its end is refused with the sizes
    assert params[0].as_int() == -5 and params[3].as_uint() == 65000
    with pytest.raises(HookError, match=r"param 12 \(offset \d+, 16 bytes\) lies beyond the "
                       "8-byte argument buffer that `extra` gives"):
        params[len(ARGS) - 1].raw


@pytest.mark.parametrize("status,fragment", [
    (abi.ARGS_NULL_ENTRY, "param 0: the launch's kernelParams holds a NULL pointer"),
    (abi.ARGS_BAD_EXTRA, "param 0: the launch's extra is malformed (an unknown key"),
    (abi.ARGS_NONE, "param 0: the launch passed neither kernelParams nor extra"),
    (abi.ARGS_NO_MEMORY, "could not allocate"),
])
def test_arguments_the_shim_could_not_copy_say_why(status, fragment):
    # GIVEN a query whose arguments the shim could not copy
    params = make_launch(query(b"", status=status)).params
    # THEN the layout is still known, and reading any argument gives the reason
    assert len(params) == len(ARGS)
    with pytest.raises(HookError) as caught:
        params[0].as_int()
    assert fragment in str(caught.value)


def test_param_from_bytes():
    # GIVEN bytes already in hand
    param = Param.from_bytes(struct.pack("<d", 0.25), index=2, offset=8)
    # THEN the readers work on them
    assert param.as_float() == 0.25 and param.size == 8 and param.index == 2
    assert param.raw == struct.pack("<d", 0.25)
    assert repr(param) == "Param(index=2, offset=8, size=8)"


# ---- launches ---------------------------------------------------------------------------------

def test_launch_fields_from_a_query():
    # WHEN a Launch is made from the shim's query
    launch = make_launch(entry=abi.ENTRY_LAUNCH_EX | abi.ENTRY_PTSZ)
    # THEN every field reads naturally
    assert launch.name == "vecAdd(float const*, float const*, float*, int)"
    assert launch.base == "vecAdd"
    assert launch.mangled == "_Z6vecAddPKfS0_Pfi"
    assert launch.grid == Dim3(1024, 2, 1) and launch.grid.blocks == 2048
    assert launch.block == (256, 1, 1) and launch.block.threads == 256
    assert (launch.shared_mem, launch.stream, launch.device, launch.context, launch.thread) == \
        (4096, 0x77, 1, 0x5000, 4242)
    assert launch.entry == "cuLaunchKernelEx" and launch.ptsz
    assert launch.handle == 0x1234
    assert len(launch.params) == len(ARGS) and launch.params[0].as_int() == -5
    assert "vecAdd" in repr(launch) and "ptsz" in repr(launch)
    # AND a kernel whose layout the driver does not give has no params
    assert len(make_launch(layout=[]).params) == 0


@pytest.mark.parametrize("entry", sorted(abi.ENTRY_NAMES))
def test_launch_entry_names(entry):
    # GIVEN each entry point, without and with the per-thread stream
    # THEN the name is the driver API's, and ptsz says which
    assert make_launch(entry=entry).entry == abi.ENTRY_NAMES[entry]
    assert not make_launch(entry=entry).ptsz
    assert make_launch(entry=entry | abi.ENTRY_PTSZ).ptsz


def test_cleared_launch_refuses_reads_and_a_reused_one_reads_the_new_launch():
    # GIVEN a launch whose hook kept a Param after the call
    launch = make_launch()
    first = launch.params[0]
    value = first.as_int()
    # WHEN clc clears it (the launch call went on)
    launch.clear()
    # THEN the value read stays, the fields stay readable, and the params refuse new reads
    assert value == -5 and launch.grid.blocks == 2048
    with pytest.raises(HookError, match="valid only during the hook call"):
        first.as_int()
    with pytest.raises(HookError, match="valid only during the hook call"):
        launch.params[1].raw
    # AND set() with the next launch's query reads that one
    launch.set(query(struct.pack("<b", 9) + BLOCK[1:]))
    assert launch.params[0].as_int() == 9


def test_dim3_is_a_tuple():
    # GIVEN a grid shape
    grid = Dim3(4, 3, 2)
    # THEN it compares and unpacks as a tuple, and counts blocks and threads
    assert grid == (4, 3, 2) and tuple(grid) == (4, 3, 2)
    x, y, z = grid
    assert (x, y, z) == (grid.x, grid.y, grid.z)
    assert grid.blocks == grid.threads == 24
    assert Dim3(5) == (5, 1, 1)


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


# ---- hook files ---------------------------------------------------------------------------------

GOOD = """\
    import clc

    @clc.on_launch(kernel="*softmax*")
    def guard(launch):
        if launch.grid.blocks > 65536:
            return clc.deny("grid too large for this tenant")
        return clc.allow(record=True)

    @clc.on_launch(kernel="*gemm*", every_launch=True)
    def log_big(launch):
        return None

    @clc.on_exit
    def summary(stats):
        pass

    @clc.on_launch
    def everything(launch):
        return None

    def plain(launch):
        return clc.allow()

    NOT_A_FUNCTION = 3
    """


def test_load_hook_file_collects_hooks_in_definition_order(tmp_path):
    # GIVEN a hook file with three launch hooks and an exit function
    path = write(tmp_path, "good_hooks.py", GOOD)
    # WHEN it is loaded
    hook_file = load_hook_file(path)
    # THEN its hooks come in definition order with their options and names
    assert [h.name for h in hook_file.hooks] == \
        ["good_hooks.py:guard", "good_hooks.py:log_big", "good_hooks.py:everything"]
    guard, log_big, everything = hook_file.hooks
    assert guard.kernel == ("*softmax*",) and guard.mode == abi.MODE_CACHED
    assert log_big.every_launch and everything.kernel is None
    assert [f.__name__ for f in hook_file.exit_functions] == ["summary"]
    assert hook_file.name == "good_hooks.py" and hook_file.path == os.fsdecode(path)
    assert all(h.file == str(path.resolve()) for h in hook_file.hooks)
    # AND the hooks decide as written
    big = Launch(name="softmax", grid=(70000, 1, 1))
    assert guard.call(big) == clc.deny("grid too large for this tenant")
    assert guard.call(Launch(name="softmax")) == clc.allow(record=True)
    # AND the file's directory is not left on sys.path
    assert str(tmp_path) not in sys.path


def test_each_file_has_its_own_registry(tmp_path):
    # GIVEN two hook files
    first = write(tmp_path, "first_reg.py", "import clc\n@clc.on_launch\ndef a(l): pass\n")
    second = write(tmp_path, "second_reg.py", "import clc\n@clc.on_launch\ndef b(l): pass\n")
    # WHEN both are loaded, with a decorator used outside any load in between
    one = load_hook_file(first)

    @clc.on_launch
    def stray(launch):
        return None
    two = load_hook_file(second)
    # THEN each file holds only its own hooks
    assert [h.name for h in one.hooks] == ["first_reg.py:a"]
    assert [h.name for h in two.hooks] == ["second_reg.py:b"]


def test_a_file_is_imported_once(tmp_path):
    # GIVEN a hook file that notes each import of itself
    marker = tmp_path / "imports.txt"
    path = write(tmp_path, "once_hooks.py", f"""\
        import clc
        with open({str(marker)!r}, "a") as f:
            f.write("x")

        @clc.on_launch
        def guard(launch):
            return None
        """)
    # WHEN it is loaded twice, through another spelling of its path, and by reference
    first = load_hook_file(path)
    again = load_hook_file(tmp_path / "." / "once_hooks.py")
    hook = resolve_hook_ref("once_hooks.py:guard", tmp_path)
    # THEN it was imported once and every route gives the same objects
    assert marker.read_text() == "x"
    assert again is first and hook is first.hooks[0]


def test_a_file_imports_its_neighbours(tmp_path):
    # GIVEN a hook file that imports a module next to it
    neighbour = f"limits_{tmp_path.name}"
    write(tmp_path, f"{neighbour}.py", "MAX_BLOCKS = 17\n")
    path = write(tmp_path, "neighbour_hooks.py", f"""\
        import clc
        from {neighbour} import MAX_BLOCKS

        @clc.on_launch
        def guard(launch):
            return clc.deny() if launch.grid.blocks > MAX_BLOCKS else None
        """)
    # WHEN it is loaded
    hook_file = load_hook_file(path)
    # THEN the neighbour was found, and sys.path is as before
    assert hook_file.module.MAX_BLOCKS == 17
    assert hook_file.hooks[0].call(Launch(grid=(18, 1, 1))) == clc.deny()
    assert str(tmp_path) not in sys.path


def test_syntax_error_gives_the_line(tmp_path):
    # GIVEN a hook file with a syntax error on line 4
    path = write(tmp_path, "syntax_hooks.py", """\
        import clc

        @clc.on_launch
        def guard(launch) return None
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN the message gives the file, the error and the line
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: SyntaxError: ")
    assert f"{path}, line 4" in message
    assert "def guard(launch) return None" in message
    assert caught.value.path == str(path)


def test_import_error_gives_the_frames_in_the_file(tmp_path):
    # GIVEN a hook file that imports a module that does not exist, on line 2
    path = write(tmp_path, "import_hooks.py", """\
        import clc
        import no_such_module_for_clc_tests
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN the message has the exception and the line in the file
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: ModuleNotFoundError: No module named "
                              "'no_such_module_for_clc_tests'")
    assert f"{path}, line 2, in <module>" in message
    assert "import no_such_module_for_clc_tests" in message
    # AND a failed import is not cached as a module
    assert not [m for m in sys.modules if m.endswith("_import_hooks")]


def test_runtime_error_at_import_lists_the_last_frames(tmp_path):
    # GIVEN a hook file whose import calls a function that fails
    path = write(tmp_path, "raise_hooks.py", """\
        import clc

        def limits():
            return {}["tenant"]

        LIMITS = limits()
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN both frames in the file are given, innermost last
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: KeyError: 'tenant'")
    assert message.index(f"{path}, line 6, in <module>") < \
        message.index(f"{path}, line 4, in limits")


def test_bad_decorator_option_in_a_file_is_a_load_error(tmp_path):
    # GIVEN a hook file whose decorator has an unclosed '[' on line 3
    path = write(tmp_path, "glob_hooks.py", """\
        import clc

        @clc.on_launch(kernel="[gemm")
        def guard(launch):
            return None
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN the import fails with the function, the glob and the line
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: HookError: @clc.on_launch on "
                              "glob_hooks.py:guard: invalid glob '[gemm' in kernel")
    assert f"{path}, line 3, in <module>" in message


def test_sys_exit_at_import_does_not_end_the_program(tmp_path):
    # GIVEN a hook file that calls sys.exit()
    path = write(tmp_path, "exit_hooks.py", "import sys\nsys.exit(3)\n")
    # WHEN it is loaded
    # THEN it is a load error, not an exit
    with pytest.raises(HookLoadError, match="cannot import: SystemExit: 3"):
        load_hook_file(path)


def test_file_without_hooks_is_refused(tmp_path):
    # GIVEN a file that defines no hook
    path = write(tmp_path, "empty_hooks.py", "import clc\n\ndef guard(launch):\n    pass\n")
    # WHEN it is loaded as a hook file
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN it is refused with what it lacks
    assert str(caught.value) == f"{path}: defines no @clc.on_launch or @clc.on_exit hook"


def test_missing_hook_file(tmp_path):
    # WHEN a hook file does not exist, or is a directory
    # THEN the error names it
    with pytest.raises(HookLoadError, match="no_such.py: no such file"):
        load_hook_file(tmp_path / "no_such.py")
    with pytest.raises(HookLoadError, match="not a file"):
        load_hook_file(tmp_path)


# ---- hook references -----------------------------------------------------------------------------

def test_resolve_decorated_and_plain_functions(tmp_path):
    # GIVEN a hook file with decorated and plain functions
    path = write(tmp_path, "ref_hooks.py", GOOD)
    hook_file = load_hook_file(path)
    # WHEN a policy refers to a decorated function
    # THEN it gets that function's Hook, with its options
    assert resolve_hook_ref("ref_hooks.py:log_big", tmp_path) is hook_file.hooks[1]
    # WHEN it refers to a plain function
    plain = resolve_hook_ref("ref_hooks.py:plain", str(tmp_path))
    # THEN it is a Hook for every kernel, cached per kernel, the same one each time
    assert plain.name == "ref_hooks.py:plain" and plain.mode == abi.MODE_CACHED
    assert plain.matches(kernel()) and plain.call(Launch()) == clc.allow()
    assert resolve_hook_ref("ref_hooks.py:plain", tmp_path) is plain
    # AND an absolute FILE ignores base_dir
    assert resolve_hook_ref(f"{path}:plain", "/nonexistent") is plain


def test_resolve_relative_to_the_base_directory(tmp_path):
    # GIVEN a hook file in a subdirectory of the policy's directory
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "nested_hooks.py", "def check(launch):\n    return None\n")
    # THEN FILE is found relative to base_dir
    assert resolve_hook_ref("sub/nested_hooks.py:check", tmp_path).name == \
        "nested_hooks.py:check"


@pytest.mark.parametrize("ref,fragment", [
    ("bad_ref_hooks.py", "a hook reference is FILE:FUNCTION"),
    (":guard", "a hook reference is FILE:FUNCTION"),
    ("bad_ref_hooks.py:", "a hook reference is FILE:FUNCTION"),
    ("missing.py:guard", "missing.py: no such file"),
    ("bad_ref_hooks.py:gaurd", "has no function 'gaurd' (hook 'bad_ref_hooks.py:gaurd'); "
                               "did you mean 'guard'?"),
    ("bad_ref_hooks.py:LIMIT", "'LIMIT' is not a function, it is a int"),
    ("bad_ref_hooks.py:summary", "'summary' is an @clc.on_exit function, not a launch hook"),
])
def test_resolve_errors(tmp_path, ref, fragment):
    # GIVEN a hook file
    write(tmp_path, "bad_ref_hooks.py", """\
        import clc
        LIMIT = 3

        def guard(launch):
            return None

        @clc.on_exit
        def summary(stats):
            pass
        """)
    # WHEN a reference to it is wrong
    with pytest.raises(HookLoadError) as caught:
        resolve_hook_ref(ref, tmp_path)
    # THEN the message says how
    assert fragment in str(caught.value)


# ---- exit statistics -----------------------------------------------------------------------------

def test_exit_stats_from_rows():
    # GIVEN the engine's rows: one kernel in two contexts, another once, and two hooks
    hook = Hook(lambda launch: None, "h.py:guard")
    hook.call(Launch())
    stats = ExitStats.from_rows(
        [("vecAdd(float*)", 10, 1, 0, 9, 2, 0, 500),
         ("vecAdd(float*)", 5, 0, 1, 5, 0, 3, 100),
         {"name": "gemm", "launches": 2, "gpu_ns": 40}],
        [hook, ("other.py:f", 3, 30, 20)])
    # THEN kernels are added up by name, with dict-like access and iteration
    assert stats["vecAdd(float*)"] == KernelStats("vecAdd(float*)", 15, 1, 1, 14, 2, 3, 600)
    assert stats.get("gemm").launches == 2 and stats.get("nope") is None
    assert "gemm" in stats and len(stats) == 2 and stats.names() == ["vecAdd(float*)", "gemm"]
    assert [k.name for k in stats] == ["vecAdd(float*)", "gemm"]
    assert stats.total.launches == 17 and stats.total.gpu_ns == 640
    # AND hooks keep their calls and times
    assert stats.hooks["h.py:guard"].calls == 1
    other = stats.hooks["other.py:f"]
    assert (other.calls, other.total_ns, other.max_ns, other.mean_ns) == (3, 30, 20, 10.0)


def test_sm_share_place_last_is_carried_to_the_shim():
    # WHEN a hook confines a kernel to the device's last 32 SMs
    outcome = clc.wrap("sm_share", sms=32, place="last").outcome(0)
    # THEN the confinement word says so
    assert outcome.replacement == abi.confine_word(abi.CAP_SMS, 32, last=True)
    with pytest.raises(HookError, match="place must be first or last"):
        clc.wrap("sm_share", sms=32, place="middle")
