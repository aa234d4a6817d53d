# SPDX-License-Identifier: Apache-2.0
"""What a hook sees of a launch (docs/hooks.md): its shape, and its arguments read from the
shim's query (the launch's fields and a copy of its arguments, made in C at the launch call, as
one bytes object). A Launch's params are valid only during the hook call: the engine reuses a
kernel's Launch objects, so that a hook asked at every launch allocates almost nothing.
Standard library only: it runs in the traced program's Python.
"""

from __future__ import annotations

import collections
import operator
import struct

from clc import abi
from clc.policy import base_name
from clc.runtime.hook_errors import HookError

__all__ = ["Dim3", "Param", "Params", "Launch", "QueryLaunch", "checked_layout"]


# ---- what a hook sees ---------------------------------------------------------------------------

class Dim3(collections.namedtuple("Dim3", "x y z", defaults=(1, 1, 1))):
    """A grid or block shape; `blocks` and `threads` are both x*y*z, so that `launch.grid.blocks`
    and `launch.block.threads` read naturally."""

    __slots__ = ()

    @property
    def blocks(self) -> int:
        return self.x * self.y * self.z

    @property
    def threads(self) -> int:
        return self.x * self.y * self.z


def _dim3(value) -> Dim3:
    # tuple.__new__ skips namedtuple's argument parsing; a query's shape is always 3 ints.
    if type(value) is Dim3:
        return value
    if len(value) == 3:
        return tuple.__new__(Dim3, value)
    return Dim3(*value)


_ENTRY_NAMES = dict(abi.ENTRY_NAMES)
_BYTE_ORDER_CHARS = "@=<>!"

# The shim's query (clc_kernel_query) and the launch's argument bytes after it, as one bytes
# object: a Launch's fields are read from it, its arguments start at _HEAD.
_QUERY = abi.KERNEL_QUERY
_HEAD = _QUERY.size
_STATUS_AT = abi.QUERY_ARGS_STATUS_AT  # clc_kernel_query.args_status, one byte

_CLOSED_MESSAGE = ("the Launch's parameters were read after its hook returned: a Launch and its "
                   "params are valid only during the hook call (keep param.raw or the values "
                   "you need instead)")
_ARGS_PROBLEMS = {
    abi.ARGS_NONE: "the launch passed neither kernelParams nor extra",
    abi.ARGS_NULL_ENTRY: "the launch's kernelParams holds a NULL pointer",
    abi.ARGS_BAD_EXTRA: ("the launch's extra is malformed (an unknown key, no "
                         "CU_LAUNCH_PARAM_END within 64 pairs, or no "
                         "CU_LAUNCH_PARAM_BUFFER_POINTER)"),
    abi.ARGS_NO_MEMORY: "clc could not allocate memory for a copy of the arguments",
    abi.ARGS_NO_LAYOUT: "the driver gives no parameter layout",
}


class _Args:
    """The bytes a launch's Params read: `blob` holds the arguments from `base` on while the
    hook runs and is None after; `limit` is where the bytes given end (an `extra` buffer may
    be shorter than the layout), -1 when the arguments cannot be read (`status` says why, or
    blob is None: whoever clears blob sets limit to -1)."""

    __slots__ = ("blob", "base", "limit", "status")

    def __init__(self, blob=None, base=0, status=abi.ARGS_OK):
        self.blob = blob
        self.base = base
        self.status = status
        self.limit = len(blob) if blob is not None and status == abi.ARGS_OK else -1

    def problem(self, param: Param) -> str:
        if self.blob is None:
            return _CLOSED_MESSAGE
        if self.status != abi.ARGS_OK:
            return f"param {param.index}: " + _ARGS_PROBLEMS.get(
                self.status, f"the arguments cannot be read (status {self.status})")
        return (f"param {param.index} (offset {param.offset}, {param.size} bytes) lies beyond "
                f"the {self.limit - self.base}-byte argument buffer that `extra` gives")


def _unpackers(formats):
    return {struct.calcsize(f): struct.Struct("<" + f).unpack_from for f in formats}


# The readers by argument size: struct's unpack_from reads at an offset without a slice.
_INT_READERS = _unpackers("bhiq")
_UINT_READERS = _unpackers("BHIQ")
_FLOAT_READERS = _unpackers("fd")


class Param:
    """One kernel argument: where it lies in the kernel's parameter block, and its bytes as
    the GPU receives them (the shim copies them at the launch call); the readers interpret
    them as little-endian values."""

    __slots__ = ("index", "offset", "size", "_args", "_start", "_end", "_int", "_uint")

    def __init__(self, index: int, offset: int, size: int, args: _Args):
        self.index = index
        self.offset = offset
        self.size = size
        self._args = args
        self._start = args.base + offset
        self._end = self._start + size
        self._int = _INT_READERS.get(size)
        self._uint = _UINT_READERS.get(size)

    @classmethod
    def from_bytes(cls, data: bytes, index: int = 0, offset: int = 0) -> Param:
        """A Param over bytes already in hand (for tests of a hook outside a program)."""
        data = bytes(data)
        return cls(index, offset, len(data), _Args(bytes(offset) + data))

    def _blob(self) -> bytes:
        """The bytes the argument lies in, or HookError saying why it cannot be read."""
        args = self._args
        if self._end > args.limit:  # limit is -1 while blob is None
            raise HookError(args.problem(self))
        return args.blob

    @property
    def raw(self) -> bytes:
        return self._blob()[self._start:self._end]

    def _need_int_size(self, reader: str) -> None:
        raise HookError(f"param {self.index}.{reader}(): the parameter is {self.size} bytes; "
                        "integers are 1, 2, 4 or 8 bytes (use as_struct() or raw)")

    def as_int(self) -> int:
        """The argument as a signed integer (int8_t to int64_t)."""
        read = self._int
        if read is None:
            self._need_int_size("as_int")
        # _blob(), inlined: an every_launch hook reads this at every launch
        args = self._args
        if self._end > args.limit:  # limit is -1 while blob is None
            raise HookError(args.problem(self))
        return read(args.blob, self._start)[0]

    def as_uint(self) -> int:
        """The argument as an unsigned integer (uint8_t to uint64_t, size_t)."""
        read = self._uint
        if read is None:
            self._need_int_size("as_uint")
        return read(self._blob(), self._start)[0]

    def as_float(self) -> float:
        """The argument as a float (4 bytes) or a double (8 bytes)."""
        read = _FLOAT_READERS.get(self.size)
        if read is None:
            raise HookError(f"param {self.index}.as_float(): the parameter is {self.size} bytes; "
                            "a float is 4 bytes and a double 8")
        return read(self._blob(), self._start)[0]

    def as_ptr(self) -> int:
        """The argument as a pointer (a device address, usually), as an int."""
        if self.size != 8:
            raise HookError(f"param {self.index}.as_ptr(): the parameter is {self.size} bytes; "
                            "a pointer is 8 bytes")
        return self._uint(self._blob(), self._start)[0]

    def as_struct(self, fmt: str) -> tuple:
        """The argument unpacked with struct.unpack(fmt); '<' (no padding) is prepended unless
        fmt starts with a byte-order character, so write C padding with 'x' or use '@'."""
        if not isinstance(fmt, str):
            raise HookError(f"param {self.index}.as_struct(): the format must be a string, "
                            f"got {type(fmt).__name__}")
        full = fmt if fmt and fmt[0] in _BYTE_ORDER_CHARS else "<" + fmt
        try:
            size = struct.calcsize(full)
        except struct.error as e:
            raise HookError(f"param {self.index}.as_struct(): bad format '{fmt}': {e}") from None
        if size != self.size:
            raise HookError(f"param {self.index}.as_struct(): format '{fmt}' is {size} bytes but "
                            f"the parameter is {self.size} bytes")
        return struct.unpack_from(full, self._blob(), self._start)

    def __repr__(self) -> str:
        return f"Param(index={self.index}, offset={self.offset}, size={self.size})"


class _Layout(tuple):
    """A parameter layout already checked: ((offset, size), ...)."""

    __slots__ = ()


def _check_layout(layout) -> _Layout:
    if type(layout) is _Layout:
        return layout
    checked = []
    for entry in layout:
        offset, size = (operator.index(v) for v in entry)
        if offset < 0 or size < 0:
            raise HookError(f"parameter layout entry {entry!r} is negative")
        checked.append((offset, size))
    return _Layout(checked)


def checked_layout(layout) -> _Layout:
    """A layout checked once, for Params built from it many times."""
    return _check_layout(layout)


class Params(tuple):
    """The arguments of one launch, a tuple of Param: len(), params[i], slices, iteration."""

    __slots__ = ()

    def __new__(cls, params=()):
        return tuple.__new__(cls, params)

    @classmethod
    def over(cls, layout, args: _Args) -> Params:
        """One Param per (offset, size) of `layout`, reading `args`."""
        return tuple.__new__(cls, [Param(i, offset, size, args)
                                   for i, (offset, size) in enumerate(_check_layout(layout))])

    @classmethod
    def from_block(cls, layout, block: bytes) -> Params:
        """The arguments in a parameter block as a kernel receives it (for tests of a hook
        outside a program): argument i is block[offset_i:offset_i + size_i]."""
        return cls.over(layout, _Args(bytes(block)))

    def __repr__(self) -> str:
        return f"Params({len(self)} parameters)"


class Launch:
    """One kernel launch as a hook sees it.

    `params` is valid only during the hook call (clc reuses its memory for later launches);
    keep the values you need (param.raw, as_int(), ...) rather than the Launch or its Params.
    """

    __slots__ = ("handle", "name", "mangled", "grid", "block", "shared_mem", "stream", "device",
                 "context", "thread", "entry", "ptsz", "params")

    def __init__(self, *, name: str = "", mangled: str = "", grid=(1, 1, 1), block=(1, 1, 1),
                 shared_mem: int = 0, stream: int = 0, device: int = 0, context: int = 0,
                 thread: int = 0, entry: str = "cuLaunchKernel", ptsz: bool = False,
                 handle: int = 0, params=()):
        """A Launch to call a hook with outside a program (a test of the hook); params is a
        Params (Params.from_block(layout, bytes)) or a sequence of Param."""
        self.handle = handle
        self.name = name or mangled
        self.mangled = mangled
        self.grid = _dim3(grid)
        self.block = _dim3(block)
        self.shared_mem = shared_mem
        self.stream = stream
        self.device = device
        self.context = context
        self.thread = thread
        self.entry = entry
        self.ptsz = ptsz
        self.params = params if isinstance(params, Params) else Params(params)

    @property
    def base(self) -> str:
        """The kernel's name without return type and parameters (`vecAdd`)."""
        return base_name(self.name)

    def __repr__(self) -> str:
        return (f"Launch({self.name!r}, grid={tuple(self.grid)}, block={tuple(self.block)}, "
                f"shared_mem={self.shared_mem}, stream={self.stream:#x}, device={self.device}, "
                f"entry={self.entry!r}{', ptsz' if self.ptsz else ''})")


_PICK = abi.KERNEL_QUERY_FIELDS.picker
_GRID = _PICK("grid").unpack_from
_BLOCK = _PICK("block").unpack_from
_ENTRY = _PICK("entry").unpack_from


def _field(name):
    """A property reading the query's field of that name (clc_abi.h's)."""
    unpack = _PICK(name).unpack_from
    return property(lambda self: unpack(self._blob)[0])


class QueryLaunch(Launch):
    """A Launch read from the shim's query (clc_kernel_query and the argument bytes after it,
    as one bytes object): each field is unpacked when a hook reads it. The engine keeps a few
    per kernel and reuses them (launch_view), so that a hook asked at every launch costs no
    allocation beyond the bytes."""

    __slots__ = ("_blob", "_names", "_args", "refs")

    handle = _field("handle")
    context = _field("ctx")
    device = _field("device")
    shared_mem = _field("shared_mem")
    thread = _field("tid")
    stream = _field("stream")
    mangled = property(lambda self: self._names[0])
    name = property(lambda self: self._names[1] or self._names[0])
    grid = property(lambda self: tuple.__new__(Dim3, _GRID(self._blob)))
    block = property(lambda self: tuple.__new__(Dim3, _BLOCK(self._blob)))
    ptsz = property(lambda self: bool(_ENTRY(self._blob)[0] & abi.ENTRY_PTSZ))

    @property
    def entry(self):
        api = _ENTRY(self._blob)[0] & ~abi.ENTRY_PTSZ
        return _ENTRY_NAMES.get(api) or f"entry {api}"

    def __init__(self, mangled: str, demangled: str, layout):
        """A reusable Launch of one kernel: set(blob) before each hook call, clear() after."""
        self._names = (mangled, demangled)
        self._blob = None
        self._args = _Args(None, _HEAD)
        self.params = Params.over(layout, self._args)

    def set(self, blob: bytes) -> None:
        self._blob = blob
        args = self._args
        args.blob = blob
        status = args.status = blob[_STATUS_AT]
        args.limit = len(blob) if not status else -1

    def clear(self) -> None:
        """After the hook: its params refuse reads (the fields stay readable)."""
        args = self._args
        args.blob, args.limit = None, -1

    @staticmethod
    def from_query(blob: bytes, mangled: str = "", demangled: str = "", layout=()) -> QueryLaunch:
        """A QueryLaunch over one query block (clc_kernel_query, then args_size bytes)."""
        launch = QueryLaunch(mangled, demangled, layout)
        launch.set(blob)
        return launch
