# SPDX-License-Identifier: Apache-2.0
"""Bounded, seeded fuzzing of what clc reads from files it did not write: policies (the loader),
CUDA images (`clc inspect`'s path: fatbin, cubin, PTX, host ELF) and captures (the reader, and
every report and `clc metrics` made of them).

Valid inputs are mutated (bytes flipped, cut, repeated; numbers and tokens that stress
parsers put in) a fixed number of times with a fixed seed, so every run sees the same inputs.
Each must give a result or the module's own error (PolicyError, FatbinError, CaptureError),
never another exception, within the time and memory guards; a command gives its output, or
an error that names the file.
"""

import contextlib
import io
import json
import pathlib
import random
import resource
import struct
import textwrap
import time

import pytest

from alarms import deadline
from capture_writer import CaptureWriter, record
from clc import abi
from clc.capture.reader import CaptureError, launch_stream, read_capture, scan_capture
from clc.cli.main import main
from clc.cli.inspect import format_text, inspect_image
from clc.policy import KernelInfo, Policy, PolicyError, parse_policy
from clc.wrapping.fatbin import CONTAINER_MAGIC, FatbinError, parse_image

REPO = pathlib.Path(__file__).resolve().parents[2]
# Per input: far above what any takes (milliseconds), so only a runaway trips it.
INPUT_SECONDS = 5
# Growth of the process's peak memory over a whole test.
MEMORY_GROWTH = 512 << 20


@pytest.fixture
def guard():
    """Fail instead of running away: the whole test within 120 s, its peak memory within
    MEMORY_GROWTH of where it started; yields a check for each input's time."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def timed(fn, data):
        started = time.monotonic()
        try:
            return fn(data)
        finally:
            assert time.monotonic() - started < INPUT_SECONDS, data[:200]

    with deadline(120, TimeoutError("the fuzz test ran for more than 120 s")):
        yield timed
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak < MEMORY_GROWTH


def mutate(rng, data, tokens):
    """data with one to four mutations: a byte changed, a 4- or 8-byte field set to an edge
    value, a piece cut or repeated, the rest cut off, or one of `tokens` put in."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not data:
            data += rng.choice(tokens)
        at = rng.randrange(len(data))
        op = rng.randrange(8)
        if op == 0:
            data[at] = rng.randrange(256)
        elif op == 1:
            data[at] ^= 1 << rng.randrange(8)
        elif op == 2 and at + 8 <= len(data):
            struct.pack_into("<Q", data, at, rng.choice([0, 1, 2**31, 2**63, 2**64 - 1,
                                                         rng.randrange(2**64)]))
        elif op == 3 and at + 4 <= len(data):
            struct.pack_into("<I", data, at, rng.choice([0, 1, 8, 64, 0xFFFF, 2**31,
                                                         2**32 - 1]))
        elif op == 4:
            del data[at:at + rng.randint(1, 64)]
        elif op == 5:
            start = rng.randrange(len(data))
            data[at:at] = data[start:start + rng.randint(1, 256)]
        elif op == 6:
            del data[at:]
        else:
            data[at:at] = rng.choice(tokens)
    return bytes(data)


# ---- policies ------------------------------------------------------------------------------

POLICY_TOKENS = [b"&a ", b"*a", b"[", b"]", b"{", b"}", b": ", b"\n- ", b"\n  - ", b"!!str ",
                 b"!custom ", b"9" * 5000, b"0x" + b"f" * 200, b"\t", b"\x07", b"---\n", b"<<: ",
                 b"'", b'"', b"#", b"\xff", b"[" * 3000, b"1e400", b".nan", b"yes",
                 b"kernel_regex: '(a+)+$'", b"kernel_regex: '" + b"(" * 200 + b"'",
                 b"grid_blocks: {gt: 5, lt: 3}", b"action: hook\n    hook: x.py:f",
                 b"action: wrap\n    wrapper: sm_share\n    params: {share: 2}",
                 b"x: &b [&c [1, 2], *c, *c]\ny: [*b, *b, *b, *b]\n"]


def policy_seeds():
    seeds = [path.read_bytes() for path in sorted((REPO / "policies").glob("*.yaml"))]
    seeds.append(textwrap.dedent("""\
        version: 1
        default: deny
        on_error: deny
        rules:
          - name: shared
            match: &m {kernel: ["*gemm*", "*conv*"], tenant: a, device: [0, 1]}
            action: allow
            record: true
          - name: again
            match: *m
            action: deny
            error: CUDA_ERROR_INVALID_VALUE
            message: "no"
          - name: shapes
            match: {grid_blocks: {gt: 10, le: 100}, block_threads: 256, user: [alice, 1000]}
            action: allow
            time: true
          - name: regex
            match: {kernel_regex: "^_Z.*gemm", group: "*", cgroup: "/system.slice/*"}
            action: wrap
            wrapper: deadline
            params: {ms: 5}
            on_unwrappable: deny
          - name: confine
            match: {tenant: b}
            action: wrap
            wrapper: sm_share
            params: {share: 0.25, place: last}
        """).encode())
    return seeds


def load_and_use(data):
    """The policy of `data`, decided for a kernel and sent through JSON as clc-run sends it."""
    policy = parse_policy(data.decode("utf-8", "replace"), "fuzz.yaml")
    info = KernelInfo("_Z4gemmPf", "gemm(float*)", 0, ("app",), "a")
    policy.decide(info)
    policy.explain(info, grid=(64, 1, 1), block=(256, 1, 1))
    assert Policy.from_json(policy.to_json()).rules == policy.rules
    return policy


def test_mutated_policies_load_or_give_policy_errors(guard):
    # GIVEN the shipped policies and a policy of every kind of rule, mutated 4,000 times
    rng = random.Random(20241)
    seeds = policy_seeds()
    loaded = refused = 0
    for _ in range(4000):
        data = mutate(rng, rng.choice(seeds), POLICY_TOKENS)
        # WHEN each is loaded (and, when it loads, used)
        try:
            guard(load_and_use, data)
            loaded += 1
        except PolicyError:
            refused += 1
    # THEN each loaded or was refused with a PolicyError, and both happened often
    assert loaded > 100 and refused > 100


# ---- CUDA images ---------------------------------------------------------------------------

PTX = b"""//
// Generated by NVIDIA NVVM Compiler
//
.version 8.5
.target sm_80
.address_size 64

.visible .entry _Z6vecAddPKfS0_Pfi(
\t.param .u64 _Z6vecAddPKfS0_Pfi_param_0,
\t.param .u32 _Z6vecAddPKfS0_Pfi_param_1
)
{
\t.reg .pred \t%p<2>;
\t.reg .b32 \t%r<6>;
\t.reg .f32 \t%f<4>;
\t.reg .b64 \t%rd<11>;

\tld.param.u64 \t%rd1, [_Z6vecAddPKfS0_Pfi_param_0];
\tld.param.u32 \t%r2, [_Z6vecAddPKfS0_Pfi_param_1];
\tmov.u32 \t%r3, %ctaid.x;
\tmov.u32 \t%r4, %ntid.x;
\tmov.u32 \t%r5, %tid.x;
\tmad.lo.s32 \t%r1, %r3, %r4, %r5;
\tsetp.ge.s32 \t%p1, %r1, %r2;
\t@%p1 bra \t$L__BB0_2;
\tbar.sync \t0;
\tcvta.to.global.u64 \t%rd4, %rd1;
\tmul.wide.s32 \t%rd5, %r1, 4;
\tadd.s64 \t%rd6, %rd4, %rd5;
\tld.global.f32 \t%f1, [%rd6];
\tadd.f32 \t%f3, %f1, %f1;
\tst.global.f32 \t[%rd6], %f3;

$L__BB0_2:
\tret;

}
\t/* a block comment */
.func helper()
{
\tret;
}
.visible .entry plain_c(.param .u64 plain_c_param_0)
{
\t.reg .b32 %r<3>;
\tmov.u32 %r1, %nctaid.x;
\texit;
}
"""

IMAGE_TOKENS = [b"\v", b"\0", b"/*", b"*/", b"//", b"\n", b"{", b"}", b".entry k()\n", b"9" * 5000,
                b"a" * 5000, b"%r" + b"7" * 3000 + b"x", b"{" * 3000, b"(" * 3000, b"[" * 3000,
                b"\n@%p1 bra $L__BB0_2;\n" * 50, b".reg .b32 %q<x>;", b"bar.sync 0;", b"\xff",
                b"_ZS", b".target sm_", b".version 99999999999999999999.0\n"]


def entry(kind, arch, payload, compression="none", options=None):
    """One fatbin entry, as fatbinary lays it out (see clc/wrapping/fatbin.py)."""
    flags = 0x11 | {"none": 0, "lz4": 0x2000, "zstd": 0x8000}[compression]
    stored, usize = payload, 0
    if compression == "zstd":
        import zstandard
        stored, usize = zstandard.ZstdCompressor().compress(payload), len(payload)
    elif compression == "lz4":
        import lz4.block
        stored, usize = lz4.block.compress(payload, store_size=False), len(payload)
    extra, opt_off = b"", 0
    if options is not None:
        text = options.encode() + b"\0"
        extra = struct.pack("<II", 72, len(options)) + text + b"\0" * (-len(text) % 8)
        opt_off = 64
    padded = stored + b"\0" * (-len(stored) % 8)
    return struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64 + len(extra), len(padded),
                       len(stored) if compression != "none" else 0, opt_off, 0,
                       9 if kind == 1 else 1, arch, 0, 0, flags, 0, usize) + extra + padded


def container(*entries):
    payload = b"".join(entries)
    return struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, len(payload)) + payload


def elf(machine, flags, sections):
    """An ELF64 file of `sections`, each (name, type, data, link, entsize), after the null
    section and the section name table."""
    names = b"\0.shstrtab\0" + b"".join(name.encode() + b"\0" for name, *_ in sections)
    body, headers = b"", [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    name_at = len(b"\0.shstrtab\0")
    for name, stype, data, link, entsize in [(".shstrtab", 3, names, 0, 0)] + sections:
        offset = 64 + len(body)
        body += data + b"\0" * (-len(data) % 8)
        at = 1 if name == ".shstrtab" else name_at
        if name != ".shstrtab":
            name_at += len(name) + 1
        headers.append(struct.pack("<IIQQQQIIQQ", at, stype, 0, 0, offset, len(data), link,
                                   1, 8, entsize))
    ident = b"\x7fELF\x02\x01\x01" + (b"\x41\x08" if machine == 190 else b"\0\0") + b"\0" * 7
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, 64 + len(body), flags,
                                 64, 0, 0, 64, len(headers), 1)
    return header + body + b"".join(headers)


def cubin(arch=90, names=("_Z6vecAddPKfS0_Pfi", "plain_c")):
    strtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    symbols, at = b"\0" * 24, 1
    for name in names:
        symbols += struct.pack("<IBBHQQ", at, 0x12, 0x10, 4, 0, 16)   # a kernel: STO_CUDA_ENTRY
        at += len(name) + 1
    return elf(190, (arch << 8) | 0x6000004, [(".strtab", 3, strtab, 0, 0),
                                              (".symtab", 2, symbols, 2, 24),
                                              (".text.plain_c", 1, b"\0" * 16, 0, 0)])


def image_seeds():
    ptx = PTX + b"\0"
    fatbins = [container(entry(1, 80, ptx, compression, "--compile-only"),
                         entry(2, 90, cubin(), compression),
                         entry(8, 90, b"lto-ir", compression))
               for compression in ("none", "zstd", "lz4")]
    host = elf(62, 0, [(".nv_fatbin", 1, fatbins[1] + b"\0" * 8 + fatbins[0], 0, 0)])
    return [PTX, PTX.replace(b"sm_80", b"sm_90a"), cubin(), *fatbins, host]


def inspected(data):
    report = inspect_image(parse_image(data), "fuzz")
    format_text(report)
    return json.dumps(report)


def test_mutated_cuda_images_inspect_or_give_fatbin_errors(guard):
    # GIVEN PTX, a cubin, fatbins of each compression and a host ELF file, mutated 5,000 times
    rng = random.Random(90)
    seeds = image_seeds()
    for seed in seeds:
        assert "vecAdd" in inspected(seed)
    listed = refused = 0
    for _ in range(5000):
        data = mutate(rng, rng.choice(seeds), IMAGE_TOKENS)
        # WHEN each is inspected
        try:
            guard(inspected, data)
            listed += 1
        except FatbinError:
            refused += 1
    # THEN each was listed or refused with a FatbinError, and both happened often
    assert listed > 300 and refused > 300


# ---- captures ------------------------------------------------------------------------------

CAPTURE_TOKENS = [abi.RECORD_HEADER.pack(rtype, 0, size) for rtype in (abi.REC_POLICY,
                  abi.REC_KERNEL, abi.REC_LAUNCH, abi.REC_TIMING, abi.REC_MESSAGE, abi.REC_END,
                  99) for size in (8, 16, 88, 1 << 20, 16 << 20, 2**32 - 8)] + [
                  b"[" * 5000, b"\0" * 64, b"\xff" * 16]


# Whole records, put in between the seed's records: JSON nested deeper than json reads, a
# record that claims 16 MiB of a short file, a kernel of a long name.
CAPTURE_RECORDS = [record(abi.REC_POLICY, b"[" * 5000 + b"\0"),
                   abi.RECORD_HEADER.pack(abi.REC_MESSAGE, 0, 16 << 20),
                   record(abi.REC_KERNEL, b"\0" * 32 + b"_Z" + b"9" * 5000 + b"\0"),
                   record(abi.REC_LAUNCH, b"\xff" * 80)]


def capture_seed():
    w = CaptureWriter()
    w.process("./app --size 4096")
    w.policy({"version": 1, "path": "p.yaml", "default": "allow", "on_error": "deny",
              "rules": [{"name": "no-debug"}], "hooks": [], "hook_deciders": ["h.py:f"]})
    w.device(0, b"fake-gpu-0000000")
    w.kernel(0, "_Z6vecAddPKfS0_Pfi")
    w.kernel(1, "plain_c")
    w.module(path="/tmp/libk.so")
    for seq in range(24):
        w.launch(seq, seq % 2, rule=seq % 3 - 1,
                 action=abi.ACTION_DENY if seq % 5 == 0 else abi.ACTION_ALLOW)
        if seq % 3 == 0:
            w.timing(seq, seq % 2, 1000 + seq)
    w.message("a warning")
    w.kernel_stats(0, launches=12, recorded=12)
    w.rule_stats(0, 5)
    w.end()
    return w


def test_mutated_captures_read_or_give_capture_errors(tmp_path, guard):
    # GIVEN a capture of every record type, mutated 1,500 times, some with a record that
    # stresses the reader put in between its records
    rng = random.Random(4242)
    writer = capture_seed()
    seed = writer.data()
    boundaries = [len(writer.header())]
    for rec in writer.records:
        boundaries.append(boundaries[-1] + len(rec))
    path = tmp_path / "fuzz.clc"

    def read(data):
        path.write_bytes(data)
        for how in (read_capture, scan_capture):
            cap = how(path)
            list(launch_stream(cap))
        return cap

    assert read(seed).launch_records == 24
    kept = refused = 0
    for _ in range(1500):
        data = seed
        if rng.random() < 0.3:
            at = rng.choice(boundaries)
            data = data[:at] + rng.choice(CAPTURE_RECORDS) + data[at:]
        data = mutate(rng, data, CAPTURE_TOKENS)
        # WHEN each is read, whole and as a stream
        try:
            guard(read, data)
            kept += 1
        except CaptureError:
            refused += 1
    # THEN each was read or refused with a CaptureError (most are read: the reader is lenient
    # with what a crash leaves)
    assert kept > 300 and refused > 5


def field_edges(writer):
    """The writer's capture with one field of one record set to an edge value, for the first
    record of each type: every 4-byte field to 2**32 - 1, every 8-byte one to 2**63 (sizes
    and offsets the reader checks, times and counts it adds up, past int32 and int64)."""
    seed = writer.data()
    at = len(writer.header())
    seen = set()
    for rec in writer.records:
        rtype = abi.RECORD_HEADER.unpack_from(rec)[0]
        if rtype not in seen:
            seen.add(rtype)
            for field in range(abi.RECORD_HEADER.size, len(rec) - 3, 4):
                for fmt, value in (("<I", 2**32 - 1), ("<Q", 2**63)):
                    if fmt == "<Q" and (field % 8 or field + 8 > len(rec)):
                        continue
                    data = bytearray(seed)
                    struct.pack_into(fmt, data, at + field, value)
                    yield bytes(data)
        at += len(rec)


def test_mutated_captures_render_or_give_clear_errors_in_every_report(tmp_path, guard):
    # GIVEN a capture of every record type with one field at an edge value (each field of the
    # first record of each type), and 100 randomly mutated ones
    rng = random.Random(32)
    writer = capture_seed()
    writer.run({"tenant": "t", "uid": 0, "labels": {"job": "12"}})
    writer.hold(1_000_000_100, 5000, 100)
    writer.wrap_stats("k(int)", "sm_share share=0.25", blocks=4)
    good = writer.write(tmp_path / "good.clc")
    path = tmp_path / "fuzz.clc"
    out = tmp_path / "out"
    reports = [[path], [path, "--format", "csv"], [path, "--format", "json"],
               [path, "--format", "chrome"], [path, "--baseline", good],
               [path, "--baseline", good, "--format", "csv"],
               [path, "--baseline", good, "--format", "json"], [good, "--baseline", path]]
    inputs = list(field_edges(writer))
    inputs += [mutate(rng, writer.data(), CAPTURE_TOKENS) for _ in range(100)]
    rendered = refused = 0

    def command(argv):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            return main(argv), err.getvalue()

    for data in inputs:
        path.write_bytes(data)
        # WHEN every report is made of it, and clc metrics counts it
        for argv in reports:
            code, err = guard(command, ["report", *map(str, argv), "-o", str(out), "--force"])
            # THEN each renders, or says which file it cannot read, in one line
            if code == 0:
                rendered += 1
            else:
                refused += 1
                assert err.startswith(f"clc: {path}: ") and err.count("\n") == 1, err
                assert not out.exists()
        code, err = guard(command, ["metrics", str(path)])
        assert code == 0
        # a capture it reads may be partial (records lost), which it says too
        said = [line for line in err.splitlines()
                if not line.startswith("clc metrics: 1 capture partial")]
        assert not said or said[0].startswith(f"clc metrics: 1 file left out, not readable "
                                              f"as captures: {path} ("), err
    assert rendered > 1000 and refused > 10
