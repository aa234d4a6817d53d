# SPDX-License-Identifier: Apache-2.0
"""clc.abi is what shim/clc_abi.h says: the generated module is the header's, read afresh, and
the layer clc/abi.py builds on it reads the header's layouts.

The header is also parsed here on its own (defines and structs, computed with natural x86-64
alignment) rather than compiled, so that this runs without a C compiler: the generator (which
takes the layouts from cffi) and this parser must agree.
"""

import re
import runpy
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from clc import _abi_generated, abi

HEADER = Path(__file__).resolve().parents[2] / "shim" / "clc_abi.h"
SLURM_HEADER = HEADER.parent / "slurm" / "clc_slurm.h"
GEN = runpy.run_path(str(HEADER.parent / "abi_gen.py"))

# (size, alignment, struct format code) of each scalar type the header uses (LP64).
SCALARS = {
    "uint16_t": (2, 2, "H"),
    "uint32_t": (4, 4, "I"),
    "int32_t": (4, 4, "i"),
    "uint64_t": (8, 8, "Q"),
    "char": (1, 1, "c"),
    "pointer": (8, 8, "P"),
}

# The Python struct for each C struct that the capture file or the engine reads or writes.
MIRRORS = {
    "REPLACEMENT": "clc_replacement",
    "LAUNCH_ARG": "clc_launch_arg",
    "KERNEL_QUERY": "clc_kernel_query",
    "PARAM_INFO": "clc_param_info",
    "DECIDE_REQUEST": "clc_decide_request",
    "DECIDE_REPLY": "clc_decide_reply",
    "OUTCOME": "clc_outcome",
    "KERNEL_COUNTS": "clc_kernel_counts",
    "CAPTURE_HEADER": "clc_capture_header",
    "RECORD_HEADER": "clc_record_header",
    "COUNTS_COPY": "clc_counts_copy",
    **{name: "clc_rec_" + name[len("REC_"):-len("_BODY")].lower()
       for name in abi.__all__ if name.startswith("REC_") and name.endswith("_BODY")},
}

# Header macros mirrored as the keys of a names dict rather than as constants.
NAME_DICTS = {
    "CLC_ACTION_": "ACTION_NAMES",
    "CLC_LOAD_": "LOAD_NAMES",
    "CLC_IMAGE_": "IMAGE_NAMES",
    "CLC_ENTRY_": "ENTRY_NAMES",
}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_defines(text):
    """{name: int, float or bytes} for every #define with a value (continued over lines,
    adjacent string literals joined); a value of another form is kept as its text, which then
    matches nothing of Python's."""
    defines = {}
    text = strip_comments(text).replace("\\\n", " ")
    for name, value in re.findall(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+(.+?)[ \t]*$", text,
                                  flags=re.M):
        if value.startswith('"'):
            defines[name] = "".join(re.findall(r'"([^"]*)"', value)).encode()
        elif re.fullmatch(r"\(?-?\d+\.\d*\)?", value):
            defines[name] = float(value.strip("()"))
        elif re.fullmatch(r"\(?-?(0x[0-9a-fA-F]+|\d+)\)?", value):
            defines[name] = int(value.strip("()"), 0)
        elif m := re.fullmatch(r"\((\d+)u?\s*<<\s*(\d+)\)", value):
            defines[name] = int(m[1]) << int(m[2])
        else:
            defines[name] = value
    return defines


def parse_structs(text, defines):
    """{name: (size, align, fields)}; fields are (name, offset, size, type, count)."""
    structs = {}
    body_re = re.compile(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", re.S)
    field_re = re.compile(r"^(const\s+)?(\w+)\s*(\**)\s*(\w+)\s*(?:\[\s*(\w+)\s*\])?$")
    for tag, body, name in body_re.findall(strip_comments(text)):
        assert tag == name, f"typedef name {name} differs from struct tag {tag}"
        offset = 0
        align = 1
        fields = []
        decls = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            # `uint64_t a, b, c` declares three fields of the first one's type
            first, *more = [part.strip() for part in decl.split(",")]
            decls.append(first)
            base = first.rsplit(None, 1)[0] if more else ""
            decls += [f"{base} {extra}" for extra in more]
        for decl in decls:
            m = field_re.match(" ".join(decl.split()))
            assert m, f"{name}: cannot parse field {decl!r}"
            _, ctype, star, fname, count = m.groups()
            n = 1 if count is None else (int(count) if count.isdigit() else defines[count])
            if star:
                ctype = "pointer"
            if ctype in SCALARS:
                fsize, falign, _ = SCALARS[ctype]
            else:
                assert ctype in structs, f"{name}.{fname}: unknown type {ctype}"
                fsize, falign, _ = structs[ctype]
            offset = (offset + falign - 1) // falign * falign
            fields.append((fname, offset, fsize * n, ctype, n))
            offset += fsize * n
            align = max(align, falign)
        size = (offset + align - 1) // align * align
        structs[name] = (size, align, fields)
    return structs


def layout_of_c(structs, name):
    """The struct's bytes as format codes; padding reads as 'x', a reserved field as ('r', n)."""
    size, _, fields = structs[name]
    codes = []
    end = 0
    for fname, offset, fsize, ctype, n in fields:
        codes += ["x"] * (offset - end)
        if fname.startswith("reserved"):
            codes.append(("r", fsize))
        elif ctype == "char":
            codes.append(f"{n}s")
        else:
            assert ctype in SCALARS, f"{name}.{fname}: nested structs have no mirror"
            codes += [SCALARS[ctype][2]] * n
        end = offset + fsize
    return codes + ["x"] * (size - end)


def layout_of_python(st):
    assert st.format[0] == "<", "capture layouts are little-endian with no native padding"
    codes = []
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", st.format[1:]):
        n = int(count or 1)
        codes += [f"{n}s"] if code == "s" else [code] * n
    return codes


def same_layout(py_codes, c_codes):
    """Whether the Python codes spell the C layout; Python may skip a reserved field as pad
    bytes or read it as any integer of its size, and reads pointers as uint64."""
    i = 0
    for c in c_codes:
        if isinstance(c, tuple):
            n = c[1]
            if py_codes[i:i + n] == ["x"] * n:
                i += n
                continue
            if i < len(py_codes) and py_codes[i] in "bBhHiIqQ" \
                    and struct.calcsize("<" + py_codes[i]) == n:
                i += 1
                continue
            return False
        # a pointer is read as the 8-byte integer it is on LP64
        if i >= len(py_codes) or py_codes[i] != c and (c, py_codes[i]) != ("P", "Q"):
            return False
        i += 1
    return i == len(py_codes)


@pytest.fixture(scope="module")
def header_text():
    return HEADER.read_text()


@pytest.fixture(scope="module")
def defines(header_text):
    # both contract headers: clc_slurm.h's names are Python's too
    return parse_defines(header_text) | parse_defines(SLURM_HEADER.read_text())


@pytest.fixture(scope="module")
def structs(header_text, defines):
    return parse_structs(header_text, defines)


def python_constants():
    return {name: getattr(abi, name) for name in abi.__all__
            if name.isupper() and isinstance(getattr(abi, name), (int, float, bytes))}


def test_the_generated_module_is_what_the_headers_give():
    # GIVEN the module the build wrote (installed or in the tree), and the headers now
    # THEN it is what the generator makes of them: a header changed since the build fails here
    assert Path(_abi_generated.__file__).read_text() == GEN["generate"](), \
        "clc/_abi_generated.py is older than the headers: pip install -e . again"


def generated(tmp_path, *texts):
    """The module the generator makes of headers holding `texts`, as a dict."""
    headers = []
    for i, text in enumerate(texts):
        path = tmp_path / f"h{i}.h"
        path.write_text(text)
        headers.append((path, "CLC_"))
    module = {}
    exec(GEN["generate"](tuple(headers)), module)
    return module


def test_a_header_change_is_the_python_sides(tmp_path, header_text):
    # GIVEN the header as it is, and with a record's member widened, a record renumbered, a
    # constant added
    same = generated(tmp_path, header_text)
    assert same["LAYOUTS"] == abi.LAYOUTS and same["REC_END"] == abi.REC_END
    widened = header_text.replace("    uint32_t shared_mem;\n    uint32_t tid;",
                                  "    uint64_t shared_mem;\n    uint32_t tid;")
    changed = generated(tmp_path, widened.replace("#define CLC_REC_END 9", "#define CLC_REC_END 99")
                        + "\n#define CLC_NEW_THING 7\n")
    # THEN the generated module follows, with nothing written on the Python side
    assert changed["LAYOUTS"]["clc_rec_launch"][0] == abi.REC_LAUNCH_BODY.size + 8
    assert ("shared_mem", 56, "uint64_t", 1) in changed["LAYOUTS"]["clc_rec_launch"][1]
    assert changed["REC_END"] == 99 and changed["NEW_THING"] == 7
    assert "NEW_THING" in changed["__all__"]


@pytest.mark.parametrize("text,message", [
    ("#define CLC_A some_call(3)\n", "CLC_A: cannot read"),
    ("#define CLC_A sizeof(int)\n", "CLC_A: cannot read"),
    ("#define CLC_A \"x\\n\"\n", "CLC_A: a string with escapes"),
    ("#define CLC_F(a) ((a) + 1)\n", "only X-macro lists"),
    ("#define CLC_L(X) X(a) + X(b)\n", "only X-macro lists"),
])
def test_the_generator_refuses_what_it_cannot_read(tmp_path, text, message):
    # GIVEN a header with something that has no Python form
    # THEN the build stops, naming it, rather than leaving it out
    with pytest.raises(ValueError, match=re.escape(message)):
        generated(tmp_path, text)


def test_two_headers_cannot_give_one_python_name(tmp_path):
    with pytest.raises(ValueError,
                       match="h1.h: CLC_A gives Python's A, which .*h0.h gives already"):
        generated(tmp_path, "#define CLC_A 1\n", "#define CLC_A 2\n")


def test_the_generators_layouts_are_the_parsers(structs):
    # GIVEN every struct as cffi laid it out for the generator, and as this file's parser does
    assert set(abi.LAYOUTS) == set(structs)
    for name, (size, members) in abi.LAYOUTS.items():
        # THEN both give the same size and the same members at the same offsets
        assert size == structs[name][0], name
        assert [(m[0], m[1], m[3]) for m in members] == \
            [(f[0], f[1], f[4]) for f in structs[name][2]], name


def test_a_tree_never_built_says_how_to_build_it(tmp_path):
    # GIVEN the package without the module the build writes (a checkout not yet installed)
    shutil.copytree(HEADER.parents[1] / "clc", tmp_path / "clc", ignore=shutil.ignore_patterns(
        "_abi_generated.py", "__pycache__", "*.so", "demo"))
    # WHEN clc.abi is imported from it (no site: only that tree is on the path)
    proc = subprocess.run([sys.executable, "-S", "-c", "import clc.abi"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    # THEN it fails saying what is missing and how to make it
    assert proc.returncode != 0
    assert "ImportError: clc/_abi_generated.py is missing" in proc.stderr, proc.stderr
    assert "pip install -e ." in proc.stderr


def test_python_refuses_a_layout_with_implicit_padding(monkeypatch):
    # GIVEN a layout with a hole (the header promises none, so that "<" formats read it)
    monkeypatch.setitem(abi._h.LAYOUTS, "clc_holey", (16, (("a", 0, "uint32_t", 1),
                                                          ("b", 8, "uint64_t", 1))))
    # THEN Python refuses to read it rather than misplace a field
    with pytest.raises(ValueError, match="clc_holey: 4 bytes of implicit padding before b"):
        abi._layout("clc_holey")


def test_parser_agrees_with_the_headers_size_comments(header_text, structs):
    # The header states the size of most structs in a trailing comment; if the parser
    # computed something else, the checks below would be checking nothing.
    stated = re.findall(r"\}\s*(\w+)\s*;\s*/\*\s*(\d+)\s+bytes\s*\*/", header_text)
    assert len(stated) >= 8
    for name, size in stated:
        assert structs[name][0] == int(size), name


@pytest.mark.parametrize("name", sorted(python_constants()))
def test_python_constant_matches_header(name, defines):
    assert "CLC_" + name in defines, f"abi.{name} has no CLC_{name} in clc_abi.h"
    assert python_constants()[name] == defines["CLC_" + name]


def test_every_header_define_is_mirrored(defines):
    constants = python_constants()
    for name, value in defines.items():
        short = name[len("CLC_"):]
        if short in constants:
            continue
        prefix = next((p for p in NAME_DICTS if name.startswith(p)), None)
        assert prefix is not None, f"{name} has no mirror in clc/abi.py"
        assert value in getattr(abi, NAME_DICTS[prefix]), f"{name} missing from " \
                                                           f"abi.{NAME_DICTS[prefix]}"


@pytest.mark.parametrize("prefix,dict_name", sorted(NAME_DICTS.items()))
def test_name_dicts_cover_exactly_the_headers_values(prefix, dict_name, defines):
    # CLC_ENTRY_PTSZ is a flag on top of an entry, not an entry of its own.
    values = {v for k, v in defines.items() if k.startswith(prefix) and k != "CLC_ENTRY_PTSZ"}
    assert set(getattr(abi, dict_name)) == values


def test_every_record_struct_is_mirrored(structs):
    c_records = {n for n in structs if n.startswith("clc_rec_")}
    c_records |= {"clc_capture_header", "clc_record_header", "clc_replacement",
                  "clc_launch_arg", "clc_kernel_query", "clc_param_info", "clc_decide_request",
                  "clc_decide_reply", "clc_outcome", "clc_kernel_counts", "clc_counts_copy"}
    assert set(MIRRORS.values()) == c_records


@pytest.mark.parametrize("py_name", sorted(MIRRORS))
def test_struct_size_matches(py_name, structs):
    c_name = MIRRORS[py_name]
    assert getattr(abi, py_name).size == structs[c_name][0], f"{py_name} vs {c_name}"


@pytest.mark.parametrize("py_name", sorted(MIRRORS))
def test_struct_layout_matches(py_name, structs):
    c_name = MIRRORS[py_name]
    py_codes = layout_of_python(getattr(abi, py_name))
    c_codes = layout_of_c(structs, c_name)
    assert same_layout(py_codes, c_codes), f"{py_name} {py_codes} vs {c_name} {c_codes}"


@pytest.mark.parametrize("py_name", sorted(MIRRORS))
def test_capture_structs_have_no_implicit_padding(py_name, structs):
    # The header promises explicit layouts, which is what lets Python use "<" formats.
    size, _, fields = structs[MIRRORS[py_name]]
    end = 0
    for fname, offset, fsize, _, _ in fields:
        assert offset == end, f"{MIRRORS[py_name]}: padding before {fname}"
        end = offset + fsize
    assert end == size, f"{MIRRORS[py_name]}: tail padding"


def test_record_sizes_keep_records_aligned(structs):
    assert structs["clc_record_header"][0] % 8 == 0
    assert structs["clc_capture_header"][0] % 8 == 0


def test_parser_catches_a_one_sided_change(header_text, defines, structs):
    # Edit the header text the way a careless change would, and check the comparison fails.
    widened = header_text.replace("    uint32_t shared_mem;\n    uint32_t tid;",
                                  "    uint64_t shared_mem;\n    uint32_t tid;")
    assert widened != header_text
    changed = parse_structs(widened, defines)
    assert abi.REC_LAUNCH_BODY.size != changed["clc_rec_launch"][0]

    renumbered = parse_defines(header_text.replace("#define CLC_REC_END 9",
                                                   "#define CLC_REC_END 10"))
    assert renumbered["CLC_REC_END"] != abi.REC_END

    signed = header_text.replace("uint32_t kernel_id; /* from 0", "int32_t kernel_id; /* from 0")
    assert signed != header_text
    py_codes = layout_of_python(abi.REC_KERNEL_BODY)
    assert same_layout(py_codes, layout_of_c(structs, "clc_rec_kernel"))
    assert not same_layout(py_codes, layout_of_c(parse_structs(signed, defines),
                                                  "clc_rec_kernel"))


def test_a_packed_decision_has_clc_decisions_layout(structs):
    # clc-run's decider sends clc_decision whole: its size, and where the fallback lies.
    size, _, fields = structs["clc_decision"]
    from clc.policy import Outcome
    clause = Outcome(abi.ACTION_ALLOW, abi.FLAG_TIME, 0, 1)
    last = Outcome(abi.ACTION_DENY, abi.FLAG_RECORD, 800, 3)
    data = abi.pack_decision([((1, 2), (3, 4), (5, 6), clause)], last)
    assert len(data) == size
    offsets = {name: offset for name, offset, _, _, _ in fields}
    assert struct.unpack_from("<II", data, offsets["n_clauses"]) == (1, abi.MODE_CACHED)
    assert struct.unpack_from("<6QIIii", data, offsets["clauses"]) == (1, 2, 3, 4, 5, 6, 0, 2,
                                                                          0, 1)
    assert struct.unpack_from("<IIii", data, offsets["fallback"]) == (1, 1, 800, 3)


def test_the_query_status_offset_is_the_headers(structs):
    offsets = {name: offset for name, offset, _, _, _ in structs["clc_kernel_query"][2]}
    assert abi.QUERY_ARGS_STATUS_AT == offsets["args_status"]


def test_stats_layout_is_the_devices():
    # GIVEN clc_stats as the engine reads it (abi.STATS) and as the splice declares it
    # THEN it is the stripes, then skipped, max_resident and share_sms, padded to a stripe
    assert abi.STATS.size == abi.STATS_STRIPES * abi.STATS_STRIPE_BYTES + 16
    stripes = -(-abi.STATS.size // abi.STATS_STRIPE_BYTES)
    assert abi.STATS_BYTES == stripes * abi.STATS_STRIPE_BYTES
    # AND the device runtime is compiled with exactly these values (its static_asserts hold it)
    assert f"-DCLC_STATS_BYTES={abi.STATS_BYTES}" in abi.DEVICE_DEFINES
    assert f"-DCLC_STATS_STRIPES={abi.STATS_STRIPES}" in abi.DEVICE_DEFINES


def test_launch_arg_offsets_are_the_headers(structs):
    # GIVEN the offsets the splice reads __clc_arg's fields at
    # THEN they are clc_launch_arg's, field by field
    _, _, fields = structs["clc_launch_arg"]
    assert abi.LAUNCH_ARG_AT == {name: offset for name, offset, *_ in fields}


FIELDS = {"KERNEL_QUERY_FIELDS": "clc_kernel_query", "REC_LAUNCH_FIELDS": "clc_rec_launch",
          "KERNEL_COUNTS_FIELDS": "clc_kernel_counts",
          "REC_KERNEL_STATS_FIELDS": "clc_rec_kernel_stats",
          "REC_WRAP_STATS_FIELDS": "clc_rec_wrap_stats",
          "COUNTS_COPY_FIELDS": "clc_counts_copy"}


def test_every_fields_table_is_checked():
    assert sorted(FIELDS) == sorted(n for n in abi.__all__ if n.endswith("_FIELDS"))


@pytest.mark.parametrize("py_name", sorted(FIELDS))
def test_field_names_and_offsets_are_the_headers(py_name, structs):
    # GIVEN a layout Python reads fields of by name
    fields = getattr(abi, py_name)
    _, _, c_fields = structs[FIELDS[py_name]]
    c_fields = [f for f in c_fields if not f[0].startswith("reserved")]  # pad bytes in Python
    # THEN its names are the header's members, in order, at the header's offsets
    assert fields.names == tuple(f[0] for f in c_fields)
    assert fields.at == {f[0]: f[1] for f in c_fields}


def test_a_picker_reads_the_named_fields_and_skips_the_rest():
    body = abi.REC_LAUNCH_BODY.pack(7, 8, 9, 3, 1, 4, 1, 1, 256, 1, 1, 0, 55, 1, 2, -5, 1)
    pick = abi.REC_LAUNCH_FIELDS.picker
    assert pick("kernel_id", "entry", "action", "rule", "result").unpack_from(body) == (
        3, 1, 1, 2, -5)
    assert pick("grid", "flags").unpack_from(body) == (4, 1, 1, 1)
    with pytest.raises(ValueError, match="before"):
        pick("flags", "seq")


def test_the_counter_list_is_the_headers(header_text, structs):
    # GIVEN the header's one list of a kernel's counters (CLC_KERNEL_COUNTERS)
    macro = re.search(r"#define\s+CLC_KERNEL_COUNTERS\(X\)((?:[^\n]*\\\n)*[^\n]*)", header_text)
    assert macro, "CLC_KERNEL_COUNTERS is not in the header"
    counters = tuple(re.findall(r"X\((\w+)\)", macro.group(1)))
    # THEN Python's is the same, and both layouts that hold counters hold them in that order
    assert abi.KERNEL_COUNTERS == counters
    for name in ("clc_kernel_counts", "clc_rec_kernel_stats"):
        members = [f[0] for f in structs[name][2]]
        first = members.index(counters[0])
        assert tuple(members[first:first + len(counters)]) == counters, name


def test_exit_statistics_have_every_counter():
    # GIVEN what an on_exit hook gets for a kernel
    from dataclasses import fields

    from clc.runtime.exit_stats import KernelStats
    # THEN it has the name and every counter, in the header's order
    assert tuple(f.name for f in fields(KernelStats)) == ("name", *abi.KERNEL_COUNTERS)


def _prototypes(text):
    """{name: (result, (parameter types...))} of the header's clc_shim_* prototypes, each type
    as written, without the parameter's name."""
    out = {}
    for result, name, params in re.findall(r"^([\w ]+?\s*\**)\s*(clc_shim_\w+)\(([^)]*)\);",
                                           strip_comments(text), re.M):
        types = []
        for param in params.split(","):
            param = " ".join(param.split())
            types.append(re.sub(r"\s*\b\w+$", "", param).replace(" *", " *").strip())
        out[name] = (" ".join(result.split()), tuple(types))
    return out


def test_the_shims_exports_are_the_headers_prototypes(header_text):
    # GIVEN the functions stage 1 exports to the engine, as the header declares them
    declared = _prototypes(header_text)
    assert declared, "no clc_shim_ prototype in the header"
    # THEN Python calls exactly those, with the header's types
    assert {n: (r, p) for n, (r, p) in abi.SHIM_EXPORTS.items()} == declared
    # AND shim_calls knows how each of those types crosses
    from clc.runtime import shim_calls
    for result, params in abi.SHIM_EXPORTS.values():
        assert {result, *params} <= set(shim_calls._CTYPES)


def test_every_export_the_engine_calls_is_declared():
    # GIVEN every clc_shim_ function the shim exports, and every one Python names
    shim = HEADER.parent
    exported = set()
    for src in shim.glob("*/*.c"):
        exported |= set(re.findall(r"CLC_EXPORT\s[^;{(]*?\b(clc_shim_\w+)\(", src.read_text()))
    named = set()
    for src in (shim.parent / "clc").rglob("*.py"):
        named |= set(re.findall(r"\bclc_shim_\w+", src.read_text()))
    # THEN each is one of the declared exports
    assert exported == set(abi.SHIM_EXPORTS)
    assert named <= set(abi.SHIM_EXPORTS)


def test_the_bridges_first_call_types_the_setting_as_declared():
    # GIVEN the bridge's embedding code, which reads CLC_PKG_PATH before clc can be imported
    code = (HEADER.parent / "bridge" / "bridge_build.py").read_text()
    from clc.runtime import shim_calls
    result, params = abi.SHIM_EXPORTS["clc_shim_setting"]
    # THEN it types clc_shim_setting as the header declares it
    assert '"clc_shim_setting"' in code
    assert f"_get.restype = ctypes.{shim_calls._CTYPES[result].__name__}" in code
    assert ("_get.argtypes = [" + ", ".join(f"ctypes.{shim_calls._CTYPES[p].__name__}"
                                            for p in params) + "]") in code


def test_stage_twos_exports_are_declared_with_the_headers_types(header_text):
    # GIVEN the functions stage 2 exports to stage 1, typed in the header
    names = re.findall(r"typedef int \(\*clc_bridge_(\w+)_fn\)", header_text)
    assert sorted(names) == ["decide", "exit", "launch", "module", "start"]
    bridge = (HEADER.parent / "bridge" / "bridge.c").read_text()
    loader = (HEADER.parent / "deciding" / "bridge_loader.c").read_text()
    for name in names:
        # THEN stage 2 declares each with its type (its definition must then agree, or it does
        # not compile), and stage 1 looks each up by that name into a pointer of that type
        assert f"CLC_STAGE2_EXPORT(clc_bridge_{name}_fn, clc_bridge_{name})" in bridge, name
        assert f'"clc_bridge_{name}"' in loader, name
        assert f"clc_bridge_{name}_fn " in loader, name


def test_the_status_words_are_the_headers(defines):
    # GIVEN the words a process tells clc-run over the status socket, in the header
    words = {name: value for name, value in defines.items() if name.startswith("CLC_STATUS_")}
    assert words
    # THEN the shim sends only those (never a word spelled in place)
    sent = set()
    for src in HEADER.parent.glob("*/*.c"):
        sent |= set(re.findall(r"clc_announce\((\w+|\"[^\"]*\")", src.read_text()))
    assert sent - {"const"} == set(words), sent  # less the definition's parameter
    # AND clc-run's listener reads each of them
    status = (HEADER.parents[1] / "clc" / "runtime" / "status.py").read_text()
    for name in words:
        assert f"abi.{name[len('CLC_'):]}" in status, name


def test_the_priority_settings_cross_through_the_header(defines):
    # GIVEN what the header says of the priority classes' settings
    names = [n for n in defines if n.startswith("CLC_PRIORITY_")]
    assert "CLC_PRIORITY_FLOOR_MIN" in names and "CLC_PRIORITY_MAX_TRUSTED" in names
    # THEN the shim reads each of them from there, and spells none of their values itself
    code = "".join(strip_comments(f.read_text())
                   for f in sorted((HEADER.parent / "priority").glob("*.[ch]")))
    for name in names:
        assert re.search(rf"\b{name}\b", code), f"shim/priority/ does not use {name}"
    for word in ('"lc"', '"be"', '"/dev/shm'):
        assert word not in code, word
    # AND clc-run's side takes its words, board, limits, ranges and defaults from clc.abi
    from clc.policy.keys import CLASS_KEYS, PRIORITY_KEYS
    from clc.policy.priority import DEFAULT_BOARD, Priority, PriorityClass
    from clc.runtime import priority_class
    floor, run_ahead = CLASS_KEYS["floor"].value, CLASS_KEYS["run_ahead"].value
    idle = PRIORITY_KEYS["idle_after_ms"].value
    assert (floor.lo, floor.hi) == (abi.PRIORITY_FLOOR_MIN, abi.PRIORITY_FLOOR_MAX)
    assert (run_ahead.lo, run_ahead.hi) == (abi.PRIORITY_RUN_AHEAD_MIN,
                                            abi.PRIORITY_RUN_AHEAD_MAX)
    assert (idle.lo, idle.lo_open, idle.hi) == (0, True, abi.PRIORITY_IDLE_MS_MAX)
    assert DEFAULT_BOARD.encode() == abi.PRIORITY_BOARD_DEFAULT
    some = PriorityClass("x", "best-effort")
    assert (some.floor, some.run_ahead) == (abi.PRIORITY_FLOOR_DEFAULT,
                                            abi.PRIORITY_RUN_AHEAD_DEFAULT)
    assert Priority(()).idle_after_ms == abi.PRIORITY_IDLE_MS_DEFAULT
    assert priority_class._MAX_TRUSTED_USERS == abi.PRIORITY_MAX_TRUSTED - 2


def test_the_slurm_headers_names_are_pythons():
    # GIVEN clc_slurm.h, which the Slurm plugin and its launcher build with on their own
    slurm_defines = parse_defines(SLURM_HEADER.read_text())
    assert slurm_defines
    # THEN each of its names is in clc.abi, and clc-run reads the job's environment by them
    for name, value in slurm_defines.items():
        assert getattr(abi, name[len("CLC_"):]) == value, name
    from clc.runtime import slurm
    assert (slurm.ENV_FD.encode(), slurm.ENV_MEMFD.encode()) == (abi.SLURM_ENV_FD,
                                                                 abi.SLURM_ENV_MEMFD)
