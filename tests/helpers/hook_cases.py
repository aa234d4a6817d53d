# SPDX-License-Identifier: Apache-2.0
"""What the hook API's tests share: a kernel to ask about, hook files written on the spot, and
one imaginary kernel's launch as the shim hands it to the engine (its query and arguments)."""

import ctypes
import pathlib
import textwrap

from clc import abi
from clc.policy import KernelInfo
from clc.runtime import hooks


def kernel(demangled="vecAdd(float const*, float const*, float*, int)",
           mangled="_Z6vecAddPKfS0_Pfi"):
    """The KernelInfo of a launch of `demangled` by a.out."""
    return KernelInfo(mangled, demangled, 0, ("a.out",), "")


def write(directory: pathlib.Path, name: str, text: str) -> pathlib.Path:
    """directory/name holding `text`, dedented."""
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


# ---- a launch ------------------------------------------------------------------------------------

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
