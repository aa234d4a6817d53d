# SPDX-License-Identifier: Apache-2.0
"""Find a kernel's code in CUDA images: fatbins, cubins, PTX, and the host ELF files holding them.

`parse_image(data)` classifies `data` and lists its code entries; each `Entry` gives its
bytes (decompressed: clc/wrapping/decompress.py) and the kernels it defines. Standard library
only at import time: the engine runs inside the traced program.

What is not documented by NVIDIA below was worked out from nvcc/fatbinary 13.0 output (sm_75
to sm_120, -gencode lists, -rdc, -G, --compress-mode default/size/speed/balance/none,
fatbinary --ident/--cmdline/-g, LTO-IR) and checked against cuobjdump 13.5's listings; it is
marked "inferred". All integers are little-endian.

Fatbin wrapper (what cudart registers; only in process memory, never parsed here since its
fields are pointers), 24 bytes:
    0x00 u32 magic 0x466243B1
    0x04 u32 version
    0x08 u64 pointer to the first fatbin container
    0x10 u64 pointer to the file name / prelinked fatbins
In a host ELF file the containers are the section `.nv_fatbin` (executable code) and, for
objects compiled with -rdc, `__nv_relfatbin` (the relocatable code the device link used);
`.nvFatBinSegment` holds the wrapper.

Fatbin container, 16-byte header, containers back to back (a section can hold several: one
per linked object):
    0x00 u32 magic 0xBA55ED50
    0x04 u16 version, 1
    0x06 u16 header size, 16
    0x08 u64 payload size: the entries that follow the header

Entry header, at the start of each entry in the payload; entries back to back:
    0x00 u16 kind: 1 PTX, 2 ELF cubin, 8 LTO-IR (NVVM, from -gencode code=lto_XX; inferred)
    0x02 u16 0x0101 in every entry seen (inferred: a header format version)
    0x04 u32 header size: 64, or more when the optional strings below follow
    0x08 u64 payload size: the bytes after the header, padded with zeros to a multiple of 8
    0x10 u32 compressed size: the payload bytes that are compressed data; 0 when uncompressed
    0x14 u32 offset in this header of the options block; 0 when none (inferred). The block is
             {u32 offset in this header of the text, u32 its length without the NUL}; for PTX
             the text is the ptxas options fatbinary's --cmdline gave ("--compile-only " for
             -rdc, "-g --dont-merge-basicblocks --return-at-end" for -G); for sm_100+ cubins
             it is 36 bytes of binary data (meaning unknown)
    0x18 u16 code version minor, 0x1A u16 major: the PTX ISA version for PTX (9.0 for CUDA 13);
             [1,8] for cubins (cuobjdump prints both as "code version = [major,minor]")
    0x1C u32 arch: 90 for sm_90 / compute_90
    0x20 u32 offset in this header of the identifier (fatbinary --ident, the source file name
             under -G); 0 when none (inferred)
    0x24 u32 length of the identifier, without the NUL (inferred)
    0x28 u64 flags (inferred, from what changes them): 0x1 64-bit code, 0x2 debug (-g/-G),
             0x10 Linux host, 0x2000 LZ4-compressed, 0x8000 zstd-compressed, 0x10000 (with
             0x8000) a magicless zstd frame that needs a dictionary clc does not have (seen on
             compressed LTO-IR; zstd says "Dictionary mismatch"; 0x30 is then nonzero),
             0x100000 arch-specific ("a": sm_90a), 0x200000 family-specific ("f": sm_100f),
             0x1000000 set on sm_100+ cubins (meaning unknown)
    0x30 u64 0, except with flag 0x10000 (unknown: a dictionary or key identifier?)
    0x38 u64 uncompressed size; 0 when uncompressed. For PTX it counts the terminating NUL
    0x40 ...  the options block and identifier strings, when the header is longer than 64
nvcc 13.0 compresses PTX (and the cubins of -rdc and -G builds) with zstd by default, with
LZ4 under --compress-mode=speed, not at all under --compress-mode=none or -no-compress. The
zstd payload is one zstd frame; the LZ4 payload is one raw LZ4 block (no frame header).

PTX as stored: fatbinary drops `//` comments and the blanks that start a line, and turns
each run of spaces and tabs into one space ("<tab>{ // callseq 0, 0" becomes "{ "), keeping every
line; so an entry's PTX is nvcc -ptx's output in that form, not byte-identical to it, and the
same program. `Entry.data()` returns it without the trailing NUL padding.

Cubin (ELF64, e_machine 190 = EM_CUDA, e_ident[EI_OSABI] 0x41): the SM arch is in e_flags,
bits 8..15 when e_ident[EI_ABIVERSION] >= 8 (every CUDA 13 cubin: 0x6005a04 for sm_90,
0x6005004 for sm_80, 0x6006402 for sm_100), and bits 0..7 in ABI version 7 cubins (those of
CUDA 12.9's libcurand for sm_50..sm_90: 0x5a055a for sm_90, the virtual arch in bits 16..23).
e_flags does not tell sm_90a from sm_90.
A kernel is an STT_FUNC symbol with STO_CUDA_ENTRY (0x10) in st_other, defined in its own
section `.text.<name>`; -rdc device functions also have `.text.<name>` and `.nv.info.<name>`
sections but not that bit, so `.nv.info.<name>` alone does not mark a kernel.
"""

import re
import struct
from dataclasses import dataclass, field

from clc.words import count as count_of
from clc.wrapping.decompress import DecompressError, decompress

__all__ = ["FatbinError", "Entry", "Image", "parse_image", "ptx_kernels", "cubin_kernels",
           "WRAPPER_MAGIC", "CONTAINER_MAGIC", "EM_CUDA", "STO_CUDA_ENTRY", "FATBIN_SECTIONS",
           "MAX_COMPRESSION_RATIO", "MIN_DECOMPRESSED_CAP", "MAX_DECOMPRESSED_BYTES",
           "MAX_IMAGE_COMPRESSION_RATIO", "MIN_IMAGE_DECOMPRESSED_CAP"]

WRAPPER_MAGIC = 0x466243B1
CONTAINER_MAGIC = 0xBA55ED50
EM_CUDA = 190
STO_CUDA_ENTRY = 0x10

# The sections of a host ELF that hold fatbin containers, in the order reported.
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")

_CONTAINER = struct.Struct("<IHHQ")
# kind, format, header size, payload size, compressed size, options offset, minor, major,
# arch, identifier offset, identifier length, flags, unknown, uncompressed size
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
assert _ENTRY.size == 64

# What a compressed entry may claim to decompress to, checked against its compressed size
# before any of it is decompressed, so that a few bytes cannot ask for gigabytes (and
# decompressing stops at the claim). Code compresses a few times over; zstd can pack a run of
# zeros some 30000 times.
MAX_COMPRESSION_RATIO = 1024
# Whatever the ratio, a small entry may claim this much: a tiny PTX text compresses oddly.
MIN_DECOMPRESSED_CAP = 1 << 20
# Whatever the ratio, no entry is read larger: far above the code of any kernel, and within
# what a machine that runs CUDA programs can hold.
MAX_DECOMPRESSED_BYTES = 512 << 20
# What all the compressed entries of one image may claim together, checked as the image is
# parsed: the per-entry cap alone lets thousands of tiny entries claim a MiB each. Code
# compresses a few times to some 40 times over (unrolled PTX); an image too small for the
# ratio may claim the floor. Reading an image (clc inspect, a wrap in the engine) then costs
# time and memory in proportion to its size, and no entry is kept decompressed (see Entry).
MAX_IMAGE_COMPRESSION_RATIO = 64
MIN_IMAGE_DECOMPRESSED_CAP = 4 << 20

_KINDS = {1: "ptx", 2: "cubin", 8: "ltoir"}
_FLAG_LZ4 = 0x2000
_FLAG_ZSTD = 0x8000
_FLAG_ZSTD_DICT = 0x10000
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY_SPECIFIC = 0x200000


class FatbinError(ValueError):
    """What is wrong with an image, and at which byte offset (None when it is not about one)."""

    def __init__(self, message, offset=None):
        self.message = message
        self.offset = offset
        super().__init__(message if offset is None else f"{message} (at byte {offset})")


@dataclass(eq=False)
class Entry:
    """One piece of code: a PTX text, a cubin, or LTO-IR; `offset`s are into the parsed data."""

    kind: str                    # "ptx" | "cubin" | "ltoir" | "unknown"
    arch: int                    # 90 for sm_90 / compute_90
    compression: str             # "none" | "zstd" | "lz4"
    offset: int                  # of the stored (maybe compressed) bytes
    size: int                    # stored bytes (without padding when compressed)
    uncompressed_size: int       # bytes after decompression (== size when uncompressed)
    variant: str = ""            # "a" (sm_90a: that chip only), "f" (family), or ""
    header_offset: int | None = None   # of the fatbin entry header; None outside a fatbin
    kind_code: int = 0           # the fatbin entry kind, as stored
    flags: int = 0               # the fatbin entry flags, as stored
    code_version: tuple[int, int] | None = None   # (major, minor) from the entry header
    identifier: str | None = None
    options: str | None = None   # ptxas options stored with a PTX entry
    section: str | None = None   # the host ELF section it came from
    _buffer: object = field(default=None, repr=False)
    _kernels: list | None = field(default=None, repr=False)
    _directives: dict | None = field(default=None, repr=False)

    # The decompressed bytes and text are made anew at each call, never kept: an image of
    # thousands of entries holds at most one of them decompressed at a time, and what is kept
    # of each (its kernels, its PTX version and target) is small.

    def data(self):
        """The decompressed bytes; for PTX, the text without its trailing NUL padding."""
        if self.flags & _FLAG_ZSTD_DICT:
            raise FatbinError("this entry is compressed with a zstd dictionary of NVIDIA's "
                              "that clc does not have (flag 0x10000)", self.header_offset)
        raw = bytes(self._buffer[self.offset:self.offset + self.size])
        if self.compression != "none":
            try:
                raw = decompress(self.compression, raw, self.uncompressed_size)
            except DecompressError as e:
                raise FatbinError(str(e), self.header_offset if self.header_offset is not None
                                  else self.offset) from None
        if self.kind == "ptx":
            # Stored PTX ends with one NUL (compressed) or up to 8 (padding): strip them so
            # that the same program gives the same bytes whatever the compression.
            raw = raw.rstrip(b"\0")
        return raw

    def kernels(self):
        """The kernel names (mangled) this entry defines; [] for LTO-IR and unknown kinds."""
        if self._kernels is None:
            if self.kind == "ptx":
                self._read_ptx()
            elif self.kind == "cubin":
                try:
                    self._kernels = cubin_kernels(self.data())
                except FatbinError as e:
                    # Offsets inside a compressed cubin are not offsets in the parsed data.
                    raise FatbinError(f"cubin entry: {e.message} (byte {e.offset} of the cubin)",
                                      self.offset) from None
            else:
                self._kernels = []
        return list(self._kernels)

    def text(self):
        """A PTX entry's text (None for other kinds)."""
        if self.kind != "ptx":
            return None
        return self.data().decode("utf-8", "replace")

    def _read_ptx(self):
        """Kernels, version and target, from one decompression and one pass over comments."""
        code = _strip_ptx_comments(self.text())
        self._kernels = _ptx_entries(code)
        self._directives = {name: _ptx_directive(code, name, stripped=True)
                            for name in ("version", "target")}

    def _directive(self, name):
        if self._directives is None:
            self._read_ptx()
        return self._directives[name]

    @property
    def ptx_version(self):
        """The `.version` of a PTX entry, such as "9.0"; None for other kinds."""
        return self._directive("version") if self.kind == "ptx" else None

    @property
    def ptx_target(self):
        """The first `.target` of a PTX entry, such as "sm_90a"; None for other kinds."""
        return self._directive("target") if self.kind == "ptx" else None

    @property
    def arch_name(self):
        """sm_90 / compute_90a / lto_90, as nvcc's -gencode spells them."""
        prefix = {"ptx": "compute", "ltoir": "lto"}.get(self.kind, "sm")
        return f"{prefix}_{self.arch}{self.variant}"

    def runs_on(self, arch):
        """Whether the driver can run (cubin) or JIT (PTX) this entry on an sm_`arch` GPU."""
        if self.variant == "a":
            return arch == self.arch
        if self.variant == "f":
            return arch // 10 == self.arch // 10 and arch >= self.arch
        if self.kind == "cubin":
            # SASS runs on the same major version, same or higher minor.
            return arch // 10 == self.arch // 10 and arch >= self.arch
        return arch >= self.arch


@dataclass(eq=False)
class Image:
    """What `parse_image` found: the kind of image and its code entries, in file order."""

    kind: str                    # "fatbin" | "cubin" | "ptx" | "host-elf"
    entries: list
    description: str = ""        # for people: "ELF shared library, .nv_fatbin: 2 containers"

    def best_ptx_for(self, arch):
        """The PTX entry with the highest arch <= `arch` that can be JIT-compiled for it."""
        best = None
        for entry in self.entries:
            if entry.kind == "ptx" and entry.arch <= arch and entry.runs_on(arch):
                if best is None or entry.arch > best.arch:
                    best = entry
        return best

    def kernels(self):
        """Every kernel name (mangled) of every entry, each once, in order of appearance."""
        seen = {}
        for entry in self.entries:
            for name in entry.kernels():
                seen.setdefault(name, None)
        return list(seen)


def parse_image(data):
    """Classify `data` (a fatbin, a cubin, PTX text, or a host ELF) and list its entries.

    A fatbin *wrapper* is refused: its fields are pointers into a process's memory.
    Raises FatbinError, with the byte offset, when `data` is none of these or is damaged.
    """
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if len(buf) < 4:
        raise FatbinError(f"too short for any CUDA image ({len(buf)} bytes)", 0)
    magic = _u32(buf, 0)
    if magic == WRAPPER_MAGIC:
        raise FatbinError("this is a fatbin wrapper, whose fields are pointers into a process: "
                          "parse the fatbin container it points to", 0)
    if magic == CONTAINER_MAGIC:
        entries, count = _parse_containers(buf, 0, len(buf), None, [], _Claims(len(buf)))
        return Image("fatbin", entries, f"fatbin, {count_of(count, 'container')}")
    if bytes(buf[:4]) == b"\x7fELF":
        elf = _Elf(buf)
        if elf.machine == EM_CUDA:
            arch = elf.cuda_arch()
            entry = Entry("cubin", arch, "none", 0, len(buf), len(buf), _buffer=buf)
            return Image("cubin", [entry], f"cubin for sm_{arch}")
        return _parse_host_elf(buf, elf)
    ptx = _as_ptx(buf)
    if ptx is None:
        raise FatbinError("not a fatbin, cubin, PTX text or ELF file (starts with "
                          f"{bytes(buf[:8]).hex(' ')})", 0)
    text, major, minor = ptx
    target = _ptx_directive(text, "target")
    m = _PTX_SM_TARGET.fullmatch(target or "")
    if not m:
        raise FatbinError(f"PTX .target {_shown(target)} names no sm_XX architecture",
                          _directive_offset(text, "target"))
    entry = Entry("ptx", int(m.group(1)), "none", 0, len(buf), len(buf), variant=m.group(2),
                  code_version=(major, minor), _buffer=buf)
    return Image("ptx", [entry], f"PTX {major}.{minor} for {target}")


# -- fatbin containers -----------------------------------------------------------------------

class _Claims:
    """What the compressed entries of one image claim to decompress to, in all, against the
    image's cap (MAX_IMAGE_COMPRESSION_RATIO)."""

    def __init__(self, image_size):
        self.image_size = image_size
        self.cap = max(MIN_IMAGE_DECOMPRESSED_CAP, MAX_IMAGE_COMPRESSION_RATIO * image_size)
        self.total = 0

    def add(self, size, index, where):
        self.total += size
        if self.total > self.cap:
            raise FatbinError(
                f"fatbin entries 0 to {index} claim {self.total} bytes uncompressed in all, "
                f"from an image of {self.image_size} bytes: clc reads at most {self.cap} from "
                f"one image (the larger of {MAX_IMAGE_COMPRESSION_RATIO} times its size and "
                f"{MIN_IMAGE_DECOMPRESSED_CAP >> 20} MiB)", where)


def _parse_containers(buf, start, end, section, entries, claims):
    """The entries of the containers in buf[start:end] appended to `entries` (those of the
    image so far), and how many containers there were; `claims` counts what the image's
    compressed entries claim."""
    entries = list(entries)
    count = 0
    off = start
    while off < end:
        if buf[off] == 0:
            # Separately compiled objects' containers are aligned in a section: skip the zeros
            # between them and after the last one (a container starts with a nonzero byte).
            found = _NONZERO.search(buf, off, end)
            off = found.start() if found else end
            continue
        if end - off < _CONTAINER.size:
            raise FatbinError(f"truncated fatbin container header: {end - off} bytes left, "
                              f"{_CONTAINER.size} needed", off)
        magic, version, hsize, payload = _CONTAINER.unpack_from(buf, off)
        if magic != CONTAINER_MAGIC:
            raise FatbinError(f"bad fatbin container magic {magic:#010x} "
                              f"(expected {CONTAINER_MAGIC:#010x})", off)
        if version != 1:
            raise FatbinError(f"unsupported fatbin container version {version}", off + 4)
        if hsize < _CONTAINER.size:
            raise FatbinError(f"fatbin container header size {hsize} is below 16", off + 6)
        body = off + hsize
        if body + payload > end:
            raise FatbinError(f"fatbin container payload of {payload} bytes runs past the end "
                              f"of the data ({max(0, end - body)} bytes left)", off + 8)
        entries += _parse_entries(buf, body, body + payload, section, len(entries), claims)
        count += 1
        off = body + payload
    if count == 0:
        raise FatbinError("no fatbin container", start)
    return entries, count


def _parse_entries(buf, start, end, section, first_index, claims):
    """The entries of one container's payload buf[start:end]; first_index is the number of
    the first in the image, for errors."""
    entries = []
    off = start
    while off < end:
        if end - off < _ENTRY.size:
            raise FatbinError(f"truncated fatbin entry header: {end - off} bytes left in the "
                              f"container, {_ENTRY.size} needed", off)
        (kind_code, _fmt, hsize, payload, csize, opt_off, minor, major, arch, id_off, id_len,
         flags, _unknown, usize) = _ENTRY.unpack_from(buf, off)
        if hsize < _ENTRY.size:
            raise FatbinError(f"fatbin entry header size {hsize} is below {_ENTRY.size}", off + 4)
        if off + hsize + payload > end:
            raise FatbinError(f"fatbin entry of {hsize} + {payload} bytes runs past its "
                              f"container ({end - off} bytes left)", off + 8)
        if flags & _FLAG_LZ4 and flags & _FLAG_ZSTD:
            raise FatbinError(f"fatbin entry flags {flags:#x} say both LZ4 and zstd", off + 0x28)
        compression = "lz4" if flags & _FLAG_LZ4 else "zstd" if flags & _FLAG_ZSTD else "none"
        if compression == "none":
            size = usize_out = payload
        else:
            if csize == 0 or csize > payload:
                raise FatbinError(f"compressed size {csize} of a fatbin entry does not fit its "
                                  f"payload of {payload} bytes", off + 0x10)
            cap = _decompressed_cap(csize)
            # (An entry that needs NVIDIA's zstd dictionary is never decompressed: data()
            # refuses it.)
            if usize > cap and not flags & _FLAG_ZSTD_DICT:
                kind = _KINDS.get(kind_code, "unknown")
                raise FatbinError(
                    f"fatbin entry {first_index + len(entries)} ({kind} for arch {arch}, "
                    f"{compression}) claims {usize} bytes uncompressed from "
                    f"{csize} compressed: clc reads at most {cap} (the larger of "
                    f"{MAX_COMPRESSION_RATIO} times the compressed size and "
                    f"{MIN_DECOMPRESSED_CAP >> 20} MiB, and {MAX_DECOMPRESSED_BYTES >> 20} MiB "
                    "at most)", off + 0x38)
            if not flags & _FLAG_ZSTD_DICT:
                claims.add(usize, first_index + len(entries), off + 0x38)
            size, usize_out = csize, usize
        variant = ("a" if flags & _FLAG_ARCH_SPECIFIC else
                   "f" if flags & _FLAG_FAMILY_SPECIFIC else "")
        options = None
        if opt_off:
            if opt_off + 8 > hsize:
                raise FatbinError(f"options block at {opt_off} is outside the {hsize}-byte entry "
                                  "header", off + 0x14)
            text_off, text_len = struct.unpack_from("<II", buf, off + opt_off)
            if kind_code == 1:
                options = _header_string(buf, off, hsize, text_off, text_len, off + opt_off)
        identifier = (_header_string(buf, off, hsize, id_off, id_len, off + 0x20)
                      if id_off else None)
        entries.append(Entry(_KINDS.get(kind_code, "unknown"), arch, compression, off + hsize,
                             size, usize_out, variant=variant, header_offset=off,
                             kind_code=kind_code, flags=flags, code_version=(major, minor),
                             identifier=identifier, options=options, section=section,
                             _buffer=buf))
        off += hsize + payload
    return entries


def _header_string(buf, entry_off, hsize, text_off, text_len, field_off):
    if text_off + text_len > hsize:
        raise FatbinError(f"string of {text_len} bytes at {text_off} is outside the "
                          f"{hsize}-byte entry header", field_off)
    raw = bytes(buf[entry_off + text_off:entry_off + text_off + text_len])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _decompressed_cap(compressed):
    """The most bytes clc decompresses `compressed` bytes of an entry to."""
    return min(MAX_DECOMPRESSED_BYTES, max(MIN_DECOMPRESSED_CAP,
                                           MAX_COMPRESSION_RATIO * compressed))


# -- ELF -------------------------------------------------------------------------------------

class _Elf:
    """The little that is needed of an ELF64 little-endian file: header and sections."""

    def __init__(self, buf):
        self.buf = buf
        size = len(buf)
        if size < 64:
            raise FatbinError(f"truncated ELF header: {size} bytes, 64 needed", 0)
        if buf[4] != 2:
            raise FatbinError(f"ELF class {buf[4]} is not 64-bit (2)", 4)
        if buf[5] != 1:
            raise FatbinError("big-endian ELF is not supported", 5)
        (self.type, self.machine, _version, _entry, self.phoff, self.shoff, self.flags,
         _ehsize, self.phentsize, self.phnum, shentsize, shnum,
         shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", buf, 16)
        self.abi_version = buf[8]
        self.sections = []
        if self.shoff == 0:
            return
        if shentsize < 64:
            raise FatbinError(f"ELF section header size {shentsize} is below 64", 0x3A)
        if self.shoff + 64 > size:
            raise FatbinError(f"ELF section headers at {self.shoff} are past the end of the "
                              f"{size}-byte file", 0x28)
        first = struct.unpack_from("<IIQQQQIIQQ", buf, self.shoff)
        if shnum == 0:
            shnum = first[5]        # extended numbering: the count is section 0's sh_size
        if shstrndx == 0xFFFF:
            shstrndx = first[6]     # SHN_XINDEX: the index is section 0's sh_link
        if self.shoff + shnum * shentsize > size:
            raise FatbinError(f"{shnum} ELF section headers at {self.shoff} run past the end "
                              f"of the {size}-byte file", 0x28)
        raw = [struct.unpack_from("<IIQQQQIIQQ", buf, self.shoff + i * shentsize)
               for i in range(shnum)]
        names = None
        if 0 < shstrndx < shnum:
            names = self._bytes(raw[shstrndx][4], raw[shstrndx][5], self.shoff
                                + shstrndx * shentsize)
        for i, (name, stype, _f, _a, offset, sz, link, info, _al, entsize) in enumerate(raw):
            self.sections.append(_Section(_cstr(names, name) if names else "", stype, offset,
                                          sz, link, info, entsize,
                                          self.shoff + i * shentsize))

    def check_range(self, offset, size, where):
        if offset + size > len(self.buf):
            raise FatbinError(f"ELF section data of {size} bytes at {offset} runs past the end "
                              f"of the {len(self.buf)}-byte file", where)

    def _bytes(self, offset, size, where):
        self.check_range(offset, size, where)
        return bytes(self.buf[offset:offset + size])

    def section_data(self, section):
        return self._bytes(section.offset, section.size, section.header)

    def cuda_arch(self):
        # ABI version 8 (CUDA 12.8 and later) moved the SM number to bits 8..15.
        return (self.flags >> 8) & 0xFF if self.abi_version >= 8 else self.flags & 0xFF

    def is_executable(self):
        if self.type == 2:          # ET_EXEC
            return True
        # A PIE is ET_DYN like a shared library; it has a PT_INTERP (3) program header.
        for i in range(self.phnum if self.phoff else 0):
            at = self.phoff + i * self.phentsize
            if at + 4 <= len(self.buf) and _u32(self.buf, at) == 3:
                return True
        return False


@dataclass
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int
    header: int                 # offset of its section header, for errors


def _parse_host_elf(buf, elf):
    what = ("ELF relocatable object" if elf.type == 1 else
            "ELF executable" if elf.is_executable() else "ELF shared library")
    entries = []
    found = []
    claims = _Claims(len(buf))
    for name in FATBIN_SECTIONS:
        for section in elf.sections:
            if section.name != name or section.type == 8:      # SHT_NOBITS holds no bytes
                continue
            elf.check_range(section.offset, section.size, section.header)
            entries, count = _parse_containers(buf, section.offset,
                                               section.offset + section.size, name, entries,
                                               claims)
            found.append(f"{name}: {count_of(count, 'container')}")
    if not found:
        raise FatbinError(f"{what} (e_machine {elf.machine}) without CUDA device code: no "
                          f"{' or '.join(FATBIN_SECTIONS)} section")
    return Image("host-elf", entries, f"{what}, {'; '.join(found)}")


def cubin_kernels(data):
    """The kernel (STO_CUDA_ENTRY function) names a cubin defines, in symbol table order."""
    elf = _Elf(data)
    if elf.machine != EM_CUDA:
        raise FatbinError(f"cubin entry is an ELF for e_machine {elf.machine}, not "
                          f"{EM_CUDA} (CUDA)", 0x12)
    names = []
    for symtab in elf.sections:
        if symtab.type != 2:        # SHT_SYMTAB
            continue
        if not 0 < symtab.link < len(elf.sections):
            raise FatbinError(f"symbol table's string table index {symtab.link} is not a "
                              "section", symtab.header + 0x28)
        syms = elf.section_data(symtab)
        strtab = elf.section_data(elf.sections[symtab.link])
        entsize = symtab.entsize or 24
        for at in range(0, len(syms) - 23, entsize):
            st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", syms, at)
            if st_info & 0xF == 2 and st_other & STO_CUDA_ENTRY and st_shndx != 0:
                names.append(_cstr(strtab, st_name))
    return names


# -- PTX -------------------------------------------------------------------------------------

_PTX_COMMENT_START = re.compile(r"/[/*]")
# `.entry NAME` with any of .visible/.weak/.extern before it; an `.extern .entry` only declares.
_PTX_ENTRY = re.compile(r"^[^\S\n]*((?:\.(?:visible|weak|extern)\s+)*)\.entry\s+"
                        r"([A-Za-z_$%][\w$]*)", re.M)
# What PTX text starts with, after blanks and comments. The digits are bounded: PTX ISA
# versions have one or two, and Python's int() of a long run of digits is slow or refused.
_PTX_VERSION = re.compile(r"\s*\.version[ \t]+(\d{1,4})\.(\d{1,4})(?![\w.])")
_PTX_SM_TARGET = re.compile(r"sm_(\d{1,4})([af]?)")
_NONZERO = re.compile(rb"[^\0]")


def _strip_ptx_comments(text):
    r"""text without its // and /* */ comments, as re.sub(r"//[^\n]*|/\*.*?\*/", "", text,
    flags=re.S) gives it (a `/*` never closed is left as text), in time linear in the text: that
    regex looks for a `*/` after each unclosed `/*`."""
    out = []
    at = 0
    closes = True           # whether a `*/` may still come: once none does, none ever will
    while True:
        found = _PTX_COMMENT_START.search(text, at)
        if found is None:
            break
        start = found.start()
        if text[start + 1] == "/":
            out.append(text[at:start])
            end = text.find("\n", start)
            at = len(text) if end < 0 else end
            continue
        end = text.find("*/", start + 2) if closes else -1
        if end < 0:
            closes = False
            out.append(text[at:start + 1])
            at = start + 1
            continue
        out.append(text[at:start])
        at = end + 2
    out.append(text[at:])
    return "".join(out)


def ptx_kernels(text):
    """The names of the kernels (`.entry`) a PTX text defines, in order."""
    return _ptx_entries(_strip_ptx_comments(text))


def _ptx_entries(code):
    """ptx_kernels of a text without comments."""
    return [m.group(2) for m in _PTX_ENTRY.finditer(code) if ".extern" not in m.group(1)]


def _ptx_directive(text, name, stripped=False):
    # Any blank but a line break may start the line: \v and \f are blanks to ptxas too.
    code = text if stripped else _strip_ptx_comments(text or "")
    m = re.search(rf"^[^\S\n]*\.{name}[ \t]+([^\n]*)", code, re.M)
    if not m:
        return None
    return m.group(1).split(",")[0].strip()


def _directive_offset(text, name):
    m = re.search(rf"\.{name}\b", text)
    return len(text[:m.start()].encode()) if m else 0


def _shown(text, limit=80):
    """text for a message: quoted, and cut short when long."""
    if text is None or len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"... ({len(text)} characters)"


def _as_ptx(buf):
    """(text, major, minor) if `buf` is PTX (a `.version` first, and a `.target`), else None."""
    raw = bytes(buf).rstrip(b"\0")
    if b"\0" in raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    code = _strip_ptx_comments(text)
    version = _PTX_VERSION.match(code)
    if not version or _ptx_directive(code, "target", stripped=True) is None:
        return None
    return text, int(version.group(1)), int(version.group(2))


# -- helpers ---------------------------------------------------------------------------------

def _u32(buf, off):
    return struct.unpack_from("<I", buf, off)[0]


def _cstr(table, off):
    end = table.find(b"\0", off)
    return table[off:end if end >= 0 else len(table)].decode("utf-8", "replace")
