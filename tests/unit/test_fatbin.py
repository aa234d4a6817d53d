# SPDX-License-Identifier: Apache-2.0
"""clc.wrapping.fatbin: finding kernels' code in fatbins, cubins, PTX and host ELF files.

Most inputs are built with nvcc at test time (once per module, in parallel) so that the
layout is checked against what the real toolchain writes; a few hand-built fatbins cover
the parsing and error paths where nvcc is absent.
"""

import re
import struct
import subprocess
import sys

import pytest

from clc.wrapping.fatbin import (CONTAINER_MAGIC, WRAPPER_MAGIC, FatbinError, parse_image,
                        ptx_kernels)
from kernel_zoo import nvcc_build

KERNELS_CU = r"""
template <typename T> __global__ void scale(T *x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
template __global__ void scale<float>(float *, float, int);
extern "C" __global__ void plain_c(float *x) { x[threadIdx.x] = 1.0f; }
namespace ns { __global__ void inner(int *p, double d) { p[0] = (int)d; } }
__device__ __noinline__ int helper(int v) { return v * 3 + 1; }
__global__ void uses_helper(int *p) { p[threadIdx.x] = helper(p[threadIdx.x]); }
__global__ void noargs() {}
"""

MAIN_CU = r"""
int main() { plain_c<<<1, 1>>>(nullptr); return 0; }
"""

# The kernels of KERNELS_CU, mangled; helper is a device function, never a kernel.
KERNELS = {"_Z5scaleIfEvPT_S0_i", "plain_c", "_ZN2ns5innerEPid", "_Z11uses_helperPi",
           "_Z6noargsv"}
HELPER = "_Z6helperi"

MULTI = ["-gencode", "arch=compute_80,code=sm_80", "-gencode",
         "arch=compute_90,code=[sm_90,compute_90]"]
TWO_PTX = ["-gencode", "arch=compute_80,code=[sm_80,compute_80]", "-gencode",
           "arch=compute_90,code=[sm_90,compute_90]"]

# name -> (source, nvcc options); each built once per module, all at the same time.
BUILDS = {
    "default.fatbin": ("k.cu", ["-arch=sm_90", "-fatbin"]),
    "speed.fatbin": ("k.cu", ["-arch=sm_90", "-fatbin", "--compress-mode=speed"]),
    "none.fatbin": ("k.cu", ["-arch=sm_90", "-fatbin", "--compress-mode=none"]),
    "multi.fatbin": ("k.cu", [*MULTI, "-fatbin"]),
    "rdc.fatbin": ("k.cu", ["-arch=sm_90", "-rdc=true", "-fatbin"]),
    "arch_specific.fatbin": ("k.cu", ["-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]",
                                      "-fatbin"]),
    "lto.fatbin": ("k.cu", ["-gencode", "arch=compute_90,code=lto_90", "-rdc=true", "-fatbin"]),
    "sm80.cubin": ("k.cu", ["-arch=sm_80", "-cubin"]),
    "sm90.cubin": ("k.cu", ["-arch=sm_90", "-cubin"]),
    "rdc.cubin": ("k.cu", ["-arch=sm_90", "-rdc=true", "-cubin"]),
    "sm80.ptx": ("k.cu", ["-arch=sm_80", "-ptx"]),
    "sm90.ptx": ("k.cu", ["-arch=sm_90", "-ptx"]),
    "rdc.ptx": ("k.cu", ["-arch=sm_90", "-rdc=true", "-ptx"]),
    "app": ("app.cu", TWO_PTX),
    "rdc_app": ("app.cu", ["-arch=sm_90", "-rdc=true"]),
    "libk.so": ("k.cu", ["-arch=sm_90", "-shared", "-Xcompiler", "-fPIC"]),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> path of each BUILDS input, built with nvcc in a temporary directory."""
    d = tmp_path_factory.mktemp("fatbin")
    (d / "k.cu").write_text(KERNELS_CU)
    (d / "app.cu").write_text(KERNELS_CU + MAIN_CU)
    return nvcc_build(d, BUILDS, "these tests build their fatbins, cubins and programs with it")


def parse(built, name):
    return parse_image(built[name].read_bytes())


def fatbinary_form(ptx):
    """PTX as fatbinary stores it: `//` comments and leading blanks gone, each run of spaces
    and tabs one space (so "\t{ // callseq 0" becomes "{ "), every line kept."""
    return b"\n".join(re.sub(rb"[ \t]+", b" ", line.split(b"//", 1)[0]).lstrip(b" ")
                      for line in ptx.split(b"\n"))


def by_kind(image, kind):
    return [e for e in image.entries if e.kind == kind]


# -- nvcc-built inputs -----------------------------------------------------------------------

@pytest.mark.parametrize("name,compression", [("default.fatbin", "zstd"),
                                              ("speed.fatbin", "lz4"),
                                              ("none.fatbin", "none")])
def test_ptx_recovered_for_each_compression(built, name, compression):
    # GIVEN a fatbin nvcc built for sm_90 with one of its compression modes
    image = parse(built, name)
    # THEN it holds the sm_90 cubin and the compute_90 PTX, the PTX compressed as asked
    assert image.kind == "fatbin"
    assert [(e.kind, e.arch) for e in image.entries] == [("cubin", 90), ("ptx", 90)]
    cubin, ptx = image.entries
    assert cubin.compression == "none"
    assert ptx.compression == compression
    # AND the PTX is nvcc -ptx's, byte for byte, in the form fatbinary stores
    assert ptx.data() == fatbinary_form(built["sm90.ptx"].read_bytes())
    assert ptx.ptx_version == "9.0" and ptx.ptx_target == "sm_90"
    assert ptx.code_version == (9, 0)
    # AND the cubin is nvcc -cubin's
    assert cubin.data() == built["sm90.cubin"].read_bytes()
    if compression != "none":
        assert ptx.size < ptx.uncompressed_size


def test_stored_ptx_differs_from_nvcc_ptx_only_in_comments_and_spacing(built):
    # GIVEN the uncompressed PTX entry and nvcc -ptx's output for the same source and arch
    stored = parse(built, "none.fatbin").entries[1].data().decode()
    source = built["sm90.ptx"].read_text()
    # THEN the code is the same once comments and spacing are set aside
    assert "//" in source and "//" not in stored
    assert stored.split() == [w for line in source.splitlines()
                              for w in line.split("//", 1)[0].split()]
    # AND every line is still there, so line numbers in ptxas messages still match
    assert stored.count("\n") == source.count("\n")


def test_compressions_give_the_same_bytes(built):
    datas = {parse(built, n).entries[1].data() for n in
             ("default.fatbin", "speed.fatbin", "none.fatbin")}
    assert len(datas) == 1


@pytest.mark.parametrize("name", ["default.fatbin", "sm90.cubin", "sm90.ptx", "multi.fatbin"])
def test_kernel_names(built, name):
    # GIVEN templates, extern "C", a namespace, a kernel without parameters, a device function
    image = parse(built, name)
    # THEN every PTX and cubin entry lists exactly the kernels
    for entry in image.entries:
        assert set(entry.kernels()) == KERNELS, entry
    assert set(image.kernels()) == KERNELS


def test_several_arches(built):
    # GIVEN sm_80 and sm_90 SASS and compute_90 PTX
    image = parse(built, "multi.fatbin")
    # THEN each is an entry with its arch
    assert [(e.kind, e.arch) for e in image.entries] == [("cubin", 80), ("cubin", 90),
                                                         ("ptx", 90)]
    assert [e.arch_name for e in image.entries] == ["sm_80", "sm_90", "compute_90"]
    # AND the cubins are nvcc -cubin's for each arch
    assert image.entries[0].data() == built["sm80.cubin"].read_bytes()
    # AND only the compute_90 PTX serves sm_90 and later, none serves sm_80
    assert image.best_ptx_for(90) is image.entries[2]
    assert image.best_ptx_for(120) is image.entries[2]
    assert image.best_ptx_for(89) is None
    assert image.best_ptx_for(80) is None


@pytest.mark.parametrize("name,arch", [("sm80.cubin", 80), ("sm90.cubin", 90)])
def test_cubin_arch_from_e_flags(built, name, arch):
    # WHEN a cubin file is parsed
    image = parse(built, name)
    # THEN it is one uncompressed cubin entry whose arch comes from e_flags
    assert image.kind == "cubin"
    (entry,) = image.entries
    assert (entry.kind, entry.arch, entry.compression) == ("cubin", arch, "none")
    assert entry.data() == built[name].read_bytes()
    assert image.best_ptx_for(arch) is None


def test_cubin_arch_of_abi_version_7(built):
    # GIVEN an sm_90 cubin rewritten as CUDA 12 and older wrote them: ELF ABI version 7, the
    # SM in the low byte of e_flags (0x5a055a, as in CUDA 12.9's libcurand)
    data = bytearray(built["sm90.cubin"].read_bytes())
    data[8] = 7
    struct.pack_into("<I", data, 0x30, 0x5A055A)
    # THEN the arch is read from the low byte
    assert parse_image(bytes(data)).entries[0].arch == 90


def test_relocatable_fatbin(built):
    # GIVEN a -rdc fatbin: nvcc compresses its cubin too
    image = parse(built, "rdc.fatbin")
    cubin, ptx = image.entries
    assert (cubin.kind, cubin.compression) == ("cubin", "zstd")
    # THEN the cubin is nvcc -rdc -cubin's, byte for byte
    assert cubin.data() == built["rdc.cubin"].read_bytes()
    # AND the PTX is nvcc -rdc -ptx's, with the ptxas option that marks it relocatable
    assert ptx.data() == fatbinary_form(built["rdc.ptx"].read_bytes())
    assert ptx.options.split() == ["--compile-only"]
    # AND the device function is not a kernel, though -rdc gives it .nv.info and .text
    assert set(cubin.kernels()) == set(ptx.kernels()) == KERNELS
    assert HELPER not in cubin.kernels()


def test_ptx_file(built):
    # WHEN nvcc -ptx's output is parsed
    data = built["sm90.ptx"].read_bytes()
    image = parse_image(data)
    # THEN it is one PTX entry, as it is
    assert image.kind == "ptx"
    (entry,) = image.entries
    assert (entry.kind, entry.arch, entry.compression) == ("ptx", 90, "none")
    assert entry.data() == data
    assert (entry.ptx_version, entry.ptx_target) == ("9.0", "sm_90")
    assert set(entry.kernels()) == KERNELS
    assert image.best_ptx_for(90) is entry and image.best_ptx_for(80) is None


def test_host_executable(built):
    # GIVEN an executable built from .cu with sm_80/sm_90 SASS and compute_80/compute_90 PTX
    data = built["app"].read_bytes()
    image = parse_image(data)
    # THEN its .nv_fatbin entries are found, their offsets in the file
    assert image.kind == "host-elf"
    assert image.description.startswith("ELF executable, .nv_fatbin:")
    assert {e.section for e in image.entries} == {".nv_fatbin"}
    ptx = by_kind(image, "ptx")
    assert sorted(e.arch for e in ptx) == [80, 90]
    assert {e.arch for e in by_kind(image, "cubin")} == {80, 90}
    for e in image.entries:
        assert data[e.header_offset:e.header_offset + 2] == struct.pack("<H", e.kind_code)
    # AND the PTX of each arch is nvcc -ptx's
    p80 = next(e for e in ptx if e.arch == 80)
    p90 = next(e for e in ptx if e.arch == 90)
    assert p80.data() == fatbinary_form(built["sm80.ptx"].read_bytes())
    assert p90.data() == fatbinary_form(built["sm90.ptx"].read_bytes())
    # AND best_ptx_for picks the highest arch that is not above the GPU's
    assert image.best_ptx_for(75) is None
    assert image.best_ptx_for(80) is p80
    assert image.best_ptx_for(86) is p80
    assert image.best_ptx_for(90) is p90
    assert image.best_ptx_for(100) is p90
    assert KERNELS <= set(image.kernels())


def test_shared_library(built):
    image = parse(built, "libk.so")
    assert image.description.startswith("ELF shared library, .nv_fatbin:")
    assert set(by_kind(image, "ptx")[0].kernels()) == KERNELS
    assert KERNELS <= set(image.kernels())


def test_relocatable_executable_has_both_fatbin_sections(built):
    # GIVEN an -rdc executable: the device-linked cubin and the object's relocatable code
    image = parse(built, "rdc_app")
    linked = [e for e in image.entries if e.section == ".nv_fatbin"]
    relocatable = [e for e in image.entries if e.section == "__nv_relfatbin"]
    # THEN both are found; the PTX is the relocatable one
    assert linked and relocatable
    (ptx,) = by_kind(image, "ptx")
    assert ptx.section == "__nv_relfatbin" and "--compile-only" in ptx.options
    assert set(ptx.kernels()) == KERNELS
    assert image.best_ptx_for(90) is ptx
    # AND the linked code holds only kernels (the device link may drop unused ones)
    linked_kernels = {k for e in linked for k in e.kernels()}
    assert "plain_c" in linked_kernels and linked_kernels <= KERNELS


def test_arch_specific_entries(built):
    # GIVEN sm_90a SASS and compute_90a PTX
    image = parse(built, "arch_specific.fatbin")
    # THEN they carry the "a" variant
    assert [e.arch_name for e in image.entries] == ["sm_90a", "compute_90a"]
    assert image.entries[1].ptx_target == "sm_90a"
    # AND arch-specific PTX serves sm_90 only
    assert image.best_ptx_for(90) is image.entries[1]
    assert image.best_ptx_for(100) is None


def test_lto_ir_is_listed_but_not_read(built):
    # GIVEN a fatbin with LTO-IR only
    image = parse(built, "lto.fatbin")
    (entry,) = image.entries
    # THEN it is listed, without kernels, and reading it says why it cannot be
    assert (entry.kind, entry.arch_name) == ("ltoir", "lto_90")
    assert entry.kernels() == []
    with pytest.raises(FatbinError, match="dictionary") as e:
        entry.data()
    assert e.value.offset == entry.header_offset


def test_truncated_host_executable(built):
    # GIVEN an executable cut short, in the middle of its .nv_fatbin section
    data = built["app"].read_bytes()
    image = parse_image(data)
    cut = image.entries[-1].offset + 4
    # THEN the section headers (at the end of the file) are missing, and said to be
    with pytest.raises(FatbinError, match="section headers") as e:
        parse_image(data[:cut])
    assert e.value.offset == 0x28


def test_corrupt_compressed_entry(built):
    # GIVEN the zstd PTX entry with its compressed bytes overwritten
    data = bytearray(built["default.fatbin"].read_bytes())
    ptx = parse_image(bytes(data)).entries[1]
    data[ptx.offset + 8:ptx.offset + 40] = b"\xff" * 32
    # WHEN it is read THEN the error names zstd and the entry header's offset
    with pytest.raises(FatbinError, match="zstd") as e:
        parse_image(bytes(data)).entries[1].data()
    assert e.value.offset == ptx.header_offset


# -- hand-built fatbins (no nvcc needed) -----------------------------------------------------

PTX_TEXT = """//
// a comment with .entry commented_out(
//
.version 8.5
.target sm_80
.address_size 64

.visible .entry first(
.param .u64 first_param_0
)
{
ret;
}
.weak .entry _Z6secondv()
{
ret;
}
/* .entry in_block_comment( */
.entry third
{
ret;
}
.extern .entry declared_elsewhere(
.param .u64 p
);
.visible .func (.param .b32 r) not_a_kernel(
.param .b32 a
)
{
ret;
}
"""
PTX_KERNELS = ["first", "_Z6secondv", "third"]


def entry_bytes(kind, arch, payload, *, compression="none", variant="", options=None):
    """One fatbin entry as fatbinary 13.0 lays it out (see clc/wrapping/fatbin.py)."""
    flags = 0x11 | {"none": 0, "lz4": 0x2000, "zstd": 0x8000}[compression]
    flags |= {"": 0, "a": 0x100000, "f": 0x200000}[variant]
    usize = 0
    stored = payload
    if compression == "zstd":
        import zstandard
        stored, usize = zstandard.ZstdCompressor().compress(payload), len(payload)
    elif compression == "lz4":
        import lz4.block
        stored, usize = lz4.block.compress(payload, store_size=False), len(payload)
    extra = b""
    opt_off = 0
    if options is not None:
        opt_off = 64
        text = options.encode() + b"\0"
        text += b"\0" * (-len(text) % 8)
        extra = struct.pack("<II", 72, len(options)) + text
    padded = stored + b"\0" * (-len(stored) % 8)
    header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64 + len(extra), len(padded),
                         len(stored) if compression != "none" else 0, opt_off, 0,
                         9 if kind == 1 else 1, arch, 0, 0, flags, 0, usize)
    return header + extra + padded


def container(*entries):
    payload = b"".join(entries)
    return struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, len(payload)) + payload


def ptx_for(target):
    return PTX_TEXT.replace(".target sm_80", f".target {target}").encode() + b"\0"


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_hand_built_fatbin(compression):
    # GIVEN a fatbin with PTX compressed each way and ptxas options
    data = container(entry_bytes(1, 80, ptx_for("sm_80"), compression=compression,
                                 options="--compile-only"))
    # WHEN it is parsed
    (entry,) = parse_image(data).entries
    # THEN the PTX comes back without its NUL, with its kernels and directives
    assert entry.compression == compression
    assert entry.data() == ptx_for("sm_80").rstrip(b"\0")
    assert entry.kernels() == PTX_KERNELS
    assert (entry.ptx_version, entry.ptx_target, entry.options) == ("8.5", "sm_80",
                                                                     "--compile-only")


def test_best_ptx_for_across_containers_and_variants():
    # GIVEN PTX for compute_70, compute_80 (in a second container), compute_90a and
    # compute_100f, and SASS for sm_120
    data = (container(entry_bytes(1, 70, ptx_for("sm_70")),
                      entry_bytes(1, 90, ptx_for("sm_90a"), variant="a"))
            + b"\0" * 8      # the alignment padding a linker may put between containers
            + container(entry_bytes(1, 80, ptx_for("sm_80"), compression="zstd"),
                        entry_bytes(1, 100, ptx_for("sm_100f"), variant="f"),
                        entry_bytes(2, 120, b"\x7fELF-not-read")))
    image = parse_image(data)
    by_name = {e.arch_name: e for e in image.entries}
    # THEN each GPU gets the highest PTX it can JIT
    assert image.best_ptx_for(60) is None
    assert image.best_ptx_for(75) is by_name["compute_70"]
    assert image.best_ptx_for(86) is by_name["compute_80"]
    assert image.best_ptx_for(90) is by_name["compute_90a"]
    assert image.best_ptx_for(100) is by_name["compute_100f"]
    assert image.best_ptx_for(103) is by_name["compute_100f"]
    assert image.best_ptx_for(120) is by_name["compute_80"]


def test_ptx_kernels_skips_comments_declarations_and_functions():
    assert ptx_kernels(PTX_TEXT) == PTX_KERNELS


def test_ptx_text_file_with_nul():
    image = parse_image(ptx_for("sm_90"))
    assert (image.kind, image.entries[0].arch, image.entries[0].kernels()) == (
        "ptx", 90, PTX_KERNELS)


GOOD = container(entry_bytes(1, 80, ptx_for("sm_80"), compression="zstd"))


def patched(data, offset, fmt, value):
    data = bytearray(data)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize("data,match,offset", [
    (b"", "too short", 0),
    (b"\x13\x37" * 40, "not a fatbin, cubin, PTX", 0),
    (struct.pack("<IIQQ", WRAPPER_MAGIC, 1, 0x7F0000001000, 0), "wrapper", 0),
    (GOOD[:10], "truncated fatbin container header", 0),
    (GOOD[:-9], "runs past the end", 8),
    (patched(GOOD, 4, "<H", 2), "container version 2", 4),
    (patched(GOOD, 16 + 4, "<I", 8), "entry header size 8", 20),
    (patched(GOOD, 16 + 8, "<Q", 1 << 40), "runs past its container", 24),
    (patched(GOOD, 16 + 0x10, "<I", 1 << 30), "compressed size", 32),
    (patched(GOOD, 16 + 0x28, "<Q", 0xA011), "both LZ4 and zstd", 56),
    (GOOD + b"\x01\x02\x03\x04" + b"\0" * 12, "bad fatbin container magic", len(GOOD)),
    (container(b"\x01\x00" + b"\0" * 20), "truncated fatbin entry header", 16),
    (b"\x7fELF\x01" + b"\0" * 60, "not 64-bit", 4),
    (b"\x7fELF\x02\x01" + b"\0" * 10, "truncated ELF header", 0),
    (b".version 9.0\n.target compute_90\n", "names no sm_XX", 13),
])
def test_damaged_inputs_say_what_and_where(data, match, offset):
    # WHEN damaged or foreign bytes are parsed THEN FatbinError says what and at which byte
    with pytest.raises(FatbinError, match=match) as e:
        parse_image(data)
    assert e.value.offset == offset
    assert f"(at byte {offset})" in str(e.value)


def test_corrupt_decompressed_size():
    # GIVEN an entry whose header claims more bytes than its zstd data holds
    data = patched(GOOD, 16 + 0x38, "<Q", 100000)
    # THEN reading it fails, at the entry
    with pytest.raises(FatbinError) as e:
        parse_image(data).entries[0].data()
    assert e.value.offset == 16


@pytest.mark.parametrize("compression,package,modules", [
    ("zstd", "zstandard", ["zstandard"]), ("lz4", "lz4", ["lz4", "lz4.block"])])
def test_missing_codec_names_the_package(monkeypatch, compression, package, modules):
    # GIVEN a compressed entry and its codec's package not importable
    data = container(entry_bytes(1, 80, ptx_for("sm_80"), compression=compression))
    entry = parse_image(data).entries[0]
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    # WHEN it is read THEN the error names the package to install
    with pytest.raises(FatbinError, match=f"'{package}' is not installed"):
        entry.data()


def test_import_needs_no_codec():
    # GIVEN a fresh interpreter WHEN clc.wrapping.fatbin is imported and a plain entry parsed
    code = ("import sys, clc.wrapping.fatbin as f; "
            "f.parse_image(b'.version 9.0\\n.target sm_90\\n.entry k()\\n{\\nret;\\n}\\n')"
            ".entries[0].kernels(); "
            "assert not {'zstandard', 'lz4'} & set(sys.modules), sys.modules.keys()")
    # THEN neither codec was imported
    subprocess.run([sys.executable, "-c", code], check=True)
