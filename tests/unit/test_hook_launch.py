# SPDX-License-Identifier: Apache-2.0
"""What a hook sees of a launch (clc.runtime.hook_launch): the argument readers, Launch."""

import ctypes
import struct

import pytest

from clc import abi
from clc.runtime.hooks import Dim3, HookError, Launch, Param, Params

from hook_cases import ARGS, BLOCK, LAYOUT, Padded, Pair, make_launch, query


# ---- arguments ---------------------------------------------------------------------------------

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
