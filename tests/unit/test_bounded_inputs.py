# SPDX-License-Identifier: Apache-2.0
"""Files that are hostile or broken in size or shape, given to `clc inspect`, the capture
reader and `clc report`: each gives a clean answer or a clean error, in bounded time and
memory; a capture named twice is read once; a closed output pipe ends a command quietly."""

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import tracemalloc

import pytest

import alarms
from capture_writer import CaptureWriter, record
from clc import abi
from clc.capture.reader import read_capture, scan_capture
from clc.cli.main import EXIT_BROKEN_PIPE, main, run_command
from clc.wrapping import fatbin
from clc.wrapping.fatbin import CONTAINER_MAGIC, FatbinError, parse_image

VECADD = "_Z6vecAddPKfS0_Pfi"
PTX = """\
.version 9.0
.target sm_90
.address_size 64

.visible .entry k(.param .u64 k_param_0)
{
\t.reg .b32 %r<4>;
\tmov.u32 %r1, %tid.x;
\tret;
}
"""


@pytest.fixture
def alarm():
    """Fail instead of hanging or running for minutes: a guard far above what a test needs."""
    with alarms.deadline(60, TimeoutError("took more than 60 s")):
        yield


def inspect(path, capsys):
    code = main(["inspect", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def entry(payload, *, usize, csize=None, flags=0x11 | 0x8000, kind=1):
    """A fatbin entry header with `payload` after it (padded to 8 bytes)."""
    padded = payload + b"\0" * (-len(payload) % 8)
    return struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(padded),
                       len(payload) if csize is None else csize, 0, 0, 9, 90, 0, 0, flags, 0,
                       usize) + padded


def container(*entries):
    payload = b"".join(entries)
    return struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, len(payload)) + payload


def zeros_frame(size):
    """A zstd frame of `size` zero bytes (its header says so), made without holding them."""
    import zstandard
    compressor = zstandard.ZstdCompressor(write_content_size=True).compressobj(size=size)
    chunk = bytes(1 << 22)
    parts = [compressor.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join(parts) + compressor.flush()


# ---- clc inspect: PTX ----------------------------------------------------------------------

@pytest.mark.parametrize("text", ["\v" + PTX, "\f" + PTX, PTX.replace(".target", "\v.target")])
def test_ptx_starting_with_odd_blanks_is_read(text, tmp_path, capsys):
    # GIVEN PTX whose first directive (or .target) follows a vertical tab or a form feed
    path = tmp_path / "k.ptx"
    path.write_text(text)
    # WHEN it is inspected
    code, out, err = inspect(path, capsys)
    # THEN it is read as the PTX it is
    assert (code, err) == (0, "")
    assert out.splitlines()[:2] == [f"{path}: PTX 9.0 for sm_90", "entries: 1 PTX (compute_90)"]
    assert "k: SASS none; PTX 9.0 for sm_90; wrappable" in out


@pytest.mark.parametrize("text, message", [
    (PTX.replace("9.0", "9" * 5000 + ".0", 1), "not a fatbin, cubin, PTX text or ELF file"),
    (PTX.replace("sm_90", "sm_" + "9" * 5000, 1), "PTX .target 'sm_99999999999999999999999"),
])
def test_ptx_directives_with_thousands_of_digits_are_clean_errors(text, message, tmp_path,
                                                                  capsys):
    # GIVEN PTX whose .version or .target has thousands of digits
    path = tmp_path / "k.ptx"
    path.write_text(text)
    # WHEN it is inspected THEN the file is refused with what is wrong, not a traceback
    code, out, err = inspect(path, capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"clc: {path}: {message}")
    assert len(err) < 500


def test_unclosed_comments_are_skipped_in_linear_time(alarm):
    # GIVEN PTX followed by 200,000 comment openings that never close (a regex looking for
    # each one's end would take quadratic time: about an hour)
    data = (PTX + "/* " * 200_000).encode()
    # WHEN it is parsed THEN its kernel is found, the openings being text
    assert parse_image(data).entries[0].kernels() == ["k"]


def test_comment_stripping_is_the_regex_it_replaces():
    # GIVEN random texts of comment markers, newlines and letters
    import random
    rng = random.Random(3)
    regex = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
    for _ in range(3000):
        text = "".join(rng.choice(["/", "*", "\n", "a", " ", "/*", "*/", "//"])
                       for _ in range(rng.randint(0, 30)))
        # THEN stripping gives what the regex gives
        assert fatbin._strip_ptx_comments(text) == regex.sub("", text), text


@pytest.mark.parametrize("body, verdict", [
    ("\tmov.u32 %r1, %r" + "7" * 3000 + "x;\n",
     "its compute_90 PTX does not parse: 9:17: a number of more than 100 digits (PTX numbers "
     "have at most 20)"),
    ("{" * 5000 + "}" * 5000,
     "its compute_90 PTX does not parse: 9:64: { } blocks nested more than 64 deep"),
    ("\t.reg .b32 %q<x>;\n\tbar.sync 0;\n",
     "its compute_90 PTX does not read: 9:15: expected an integer, found 'x'"),
])
def test_ptx_the_reader_cannot_take_is_a_verdict(body, verdict, tmp_path, capsys, alarm):
    # GIVEN PTX with a register of thousands of digits, blocks nested thousands deep, or a
    # register range that is not a number
    path = tmp_path / "k.ptx"
    path.write_text(PTX.replace("\tret;\n", body + "\tret;\n"))
    # WHEN it is inspected
    code, out, err = inspect(path, capsys)
    # THEN the kernel is listed, with the reason it cannot be judged
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (f"k: SASS none; PTX 9.0 for sm_90; not wrappable, not "
                                    f"loopable: {verdict}")


# ---- clc inspect: compressed entries -------------------------------------------------------

def test_entry_claiming_gigabytes_is_refused_before_decompressing(tmp_path, capsys, alarm):
    # GIVEN a 65 KB fatbin whose zstd entry holds 2 GiB of zeros, and says so
    frame = zeros_frame(2 << 30)
    path = tmp_path / "bomb.fatbin"
    path.write_bytes(container(entry(frame, usize=2 << 30)))
    assert path.stat().st_size < 100_000
    # WHEN it is inspected
    tracemalloc.start()
    code, out, err = inspect(path, capsys)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # THEN the entry is refused by its claim, named, and nothing is decompressed
    cap = 1024 * len(frame)
    assert err == (f"clc: {path}: fatbin entry 0 (ptx for arch 90, zstd) claims 2147483648 "
                   f"bytes uncompressed from {len(frame)} compressed: clc reads at most {cap} "
                   "(the larger of 1024 times the compressed size and 1 MiB, and 512 MiB at "
                   "most) (at byte 72)\n")
    assert code == 2
    assert peak < 16 << 20


@pytest.mark.parametrize("flags", [0x11 | 0x8000, 0x11 | 0x2000])
def test_claims_are_checked_for_both_codecs(flags):
    # GIVEN zstd and LZ4 entries of 100 bytes claiming 512 MiB
    data = container(entry(b"\x01" * 100, usize=512 << 20, flags=flags))
    # THEN parsing refuses them
    with pytest.raises(FatbinError, match="fatbin entry 0 .* claims 536870912 bytes"):
        parse_image(data)


def test_decompressing_stops_at_the_claim(alarm):
    # GIVEN a zstd entry whose frame holds (and says it holds) 256 MiB, the entry claiming 1000
    frame = zeros_frame(256 << 20)
    image = parse_image(container(entry(frame, usize=1000)))
    # WHEN it is read
    tracemalloc.start()
    with pytest.raises(FatbinError) as caught:
        image.entries[0].data()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # THEN it fails at the entry, having decompressed no more than the claim
    assert caught.value.message == ("zstd data decompresses to more than the 1000 bytes the "
                                    "entry header says (decompressing stopped there)")
    assert caught.value.offset == 16
    assert peak < 16 << 20


def compressed(codec, data):
    """`data` as a fatbin entry's payload and flags: one zstd frame, or one raw LZ4 block."""
    if codec == "zstd":
        import zstandard
        return zstandard.ZstdCompressor(level=19).compress(data), 0x11 | 0x8000
    import lz4.block
    return lz4.block.compress(data, store_size=False), 0x11 | 0x2000


@pytest.fixture
def deadline():
    """Fail a test that runs longer than `seconds` (what it promises), rather than waiting:
    deadline(seconds) arms it."""
    with alarms.deadline(0, TimeoutError("ran past its deadline")):
        yield signal.alarm


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_many_small_entries_are_bounded_in_all(codec, tmp_path, capsys, deadline):
    # GIVEN a fatbin of 3000 entries of a few bytes, each claiming 1 MiB of PTX (within what
    # one entry may claim): 3 GiB from half a megabyte (zstd) or 12 MB (LZ4)
    payload, flags = compressed(codec, b"A" * (1 << 20))
    path = tmp_path / "many.fatbin"
    path.write_bytes(container(*[entry(payload, usize=1 << 20, flags=flags)] * 3000))
    size = path.stat().st_size
    cap = max(4 << 20, 64 * size)
    # WHEN it is inspected
    deadline(10)
    tracemalloc.start()
    started = time.monotonic()
    code, out, err = inspect(path, capsys)
    took = time.monotonic() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # THEN the image is refused at the entry whose claim passes the image's cap, before any
    # entry is decompressed: in well under a second and a few MB beside the file
    first_over = cap // (1 << 20)
    header = 16 + first_over * (64 + len(payload) + (-len(payload) % 8))
    assert err == (f"clc: {path}: fatbin entries 0 to {first_over} claim "
                   f"{(first_over + 1) << 20} bytes uncompressed in all, from an image of "
                   f"{size} bytes: clc reads at most {cap} from one image (the larger of 64 "
                   f"times its size and 4 MiB) (at byte {header + 0x38})\n")
    assert (code, out) == (2, "")
    assert took < 2
    assert peak < size + (16 << 20)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_an_image_within_its_cap_holds_one_entry_at_a_time(codec, tmp_path, capsys, deadline):
    # GIVEN a fatbin of 16 entries each of 256 KiB of PTX text (a kernel, then comments), 4 MiB
    # in all: what a small image may claim
    line = b"// a line of comment\n"
    text = PTX.encode() + line * (((256 << 10) - len(PTX) - 1) // len(line))
    payload, flags = compressed(codec, text + b"\0")
    path = tmp_path / "within.fatbin"
    path.write_bytes(container(*[entry(payload, usize=len(text) + 1, flags=flags)] * 16))
    # WHEN it is inspected
    deadline(20)
    tracemalloc.start()
    code, out, err = inspect(path, capsys)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # THEN every entry is read, and the entries' text is not all held at once: no more than
    # a few copies of one entry (4 MiB would be all of them)
    assert (code, err) == (0, "")
    assert f"entries: 16 PTX (compute_90 {codec} x16)" in out
    assert "k: SASS none; PTX 9.0 for sm_90; wrappable" in out
    assert peak < 2 << 20


def test_a_wrap_from_an_image_refused_whole_says_why(tmp_path):
    # GIVEN a program's load of a fatbin whose entries claim more than one image may hold,
    # seen by the wrap engine as the load the kernel came from
    from clc.wrapping.engine import WrapEngine
    from clc.wrapping.splice import Unwrappable
    payload, flags = compressed("zstd", PTX.encode().ljust(1 << 20, b"\0"))
    path = tmp_path / "loaded.fatbin"
    path.write_bytes(container(*[entry(payload, usize=1 << 20, flags=flags)] * 8))
    engine = WrapEngine(lambda level, text: None)
    engine.note_load(7, 5, 0, 0, 0, str(path))
    engine.owner = lambda original: 7
    # WHEN the engine looks for the kernel's PTX THEN it says the image cannot be read, and why
    with pytest.raises(Unwrappable) as caught:
        engine.find_ptx("k", 90, original=1)
    assert str(caught.value).startswith(
        "the image it was loaded from cannot be read: fatbin entries 0 to 4 claim 5242880 "
        "bytes uncompressed in all")


def test_zeros_between_containers_are_skipped_in_linear_time(alarm):
    # GIVEN 100,000 containers (28 MB) each followed by 64 zeros (the padding a linker puts
    # between them): copying the rest of the data at each would copy a terabyte
    one = container(entry(PTX.encode(), usize=0, flags=0x11, csize=0))
    data = b"".join(one + b"\0" * 64 for _ in range(100_000))
    # WHEN it is parsed THEN every container is read
    image = parse_image(data)
    assert image.description == "fatbin, 100000 containers"


# ---- clc inspect: what is not a file -------------------------------------------------------

def test_inspect_refuses_a_fifo_without_blocking(tmp_path, capsys, alarm):
    # GIVEN a FIFO no one writes to, /dev/zero, which never ends, and a directory
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO (named pipe)"), ("/dev/zero", "a character device"),
                       (tmp_path, "a directory")):
        # WHEN it is inspected THEN it is refused at once
        code, out, err = inspect(path, capsys)
        assert (code, out) == (2, "")
        assert err == f"clc: {path}: is {kind}, not a file clc can inspect\n"


# ---- the capture reader --------------------------------------------------------------------

def capture(*extra):
    w = CaptureWriter()
    w.process("./app")
    w.kernel(0, VECADD)
    w.launch(0, 0)
    for rec in extra:
        w.records.append(rec)
    return w


def test_policy_json_nested_too_deep_is_no_policy(tmp_path):
    # GIVEN a capture whose POLICY record is JSON nested 100,000 deep
    path = capture(record(abi.REC_POLICY, b"[" * 100_000 + b"\0")).write(tmp_path / "c.clc")
    # WHEN it is read THEN it has no policy, and the rest is read
    for read in (read_capture, scan_capture):
        cap = read(path)
        assert cap.policy is None
        assert cap.launch_records == 1
        assert cap.rule_name(0) == "rule 0"


def test_a_record_larger_than_the_file_is_not_made_room_for(tmp_path):
    # GIVEN a capture ending in a record header that claims 16 MiB, in a file of a few hundred
    # bytes
    w = capture()
    w.records.append(abi.RECORD_HEADER.pack(abi.REC_MESSAGE, 0, 16 << 20) + b"\0" * 8)
    path = w.write(tmp_path / "c.clc")
    # WHEN it is read
    tracemalloc.start()
    cap = scan_capture(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # THEN the records end there, its bytes counted as trailing, without 16 MiB set aside
    assert cap.trailing_bytes == 16
    assert cap.launch_records == 1
    assert peak < 8 << 20


# ---- clc report: each capture once ---------------------------------------------------------

def test_a_capture_named_twice_is_read_once(tmp_path, monkeypatch, capsys):
    # GIVEN a capture of one launch, named as itself, as ./ itself, and through a hard link
    monkeypatch.chdir(tmp_path)
    capture().write(tmp_path / "a.clc")
    os.link("a.clc", "b.clc")
    # WHEN clc report reads them
    code = main(["report", "--format", "json", "a.clc", "./a.clc", "b.clc"])
    out, err = capsys.readouterr()
    # THEN its one launch is reported once, and the repeats are said
    assert code == 0
    assert len(json.loads(out)["launches"]) == 1
    assert err.splitlines() == ["clc: ./a.clc is the same file as a.clc: read once",
                                "clc: b.clc is the same file as a.clc: read once"]


# ---- a closed pipe -------------------------------------------------------------------------

def test_a_closed_output_pipe_ends_the_command_quietly():
    # GIVEN a command whose standard output is a pipe nobody reads (`clc ... | head -0`)
    policy = os.path.join(os.path.dirname(__file__), "..", "..", "policies", "audit.yaml")
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "clc", "policy", "check", policy],
                          stdout=write, stderr=subprocess.PIPE, timeout=60)
    os.close(write)
    # THEN it ends with the status of a process SIGPIPE ended, and says nothing
    assert proc.stderr == b""
    assert proc.returncode == EXIT_BROKEN_PIPE == 141


def test_broken_pipe_in_any_command_is_its_status():
    # GIVEN a command that finds its output closed
    class Writes:
        def run(self, args):
            raise BrokenPipeError(32, "Broken pipe")
    # WHEN it is run as clc and clc-run run commands THEN its status is SIGPIPE's
    assert run_command(Writes, None) == EXIT_BROKEN_PIPE
