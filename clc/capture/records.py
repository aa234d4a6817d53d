# SPDX-License-Identifier: Apache-2.0
"""The record scanner: a capture file opened and checked (only a regular file, its header's
magic, version and size), then its records read as a stream through one buffer of fixed size
(layout: shim/clc_abi.h, mirrored in clc.abi). What the records mean is the reader's
(clc.capture.reader), the launch stream's (clc.capture.launches) and the counts' copies'
(clc.capture.counts)."""

import errno
import os
import stat

from clc import abi, words

__all__ = ["CHUNK", "MAX_RECORD", "MAX_GPU_NS", "CaptureError", "file_kind", "open_capture",
           "Records", "checked_gpu_ns", "iter_file", "gpu_times", "body_text", "named"]

CHUNK = 1 << 20
# The shim's records are at most half of its 256 KiB per-thread buffer, but for its COUNTS
# records (at most about 9.5 MiB: 65536 kernels' counts, twice); a size above this is not a
# record but garbage (a file overwritten, or not a capture past its header).
MAX_RECORD = 16 << 20
# GPU times are u64 nanoseconds; one of 2**63 or more (292 years) is no kernel's: an end
# before its start taken as unsigned, or a damaged file. Such a record is refused with its
# offset rather than counted into every total and distribution.
MAX_GPU_NS = (1 << 63) - 1


class CaptureError(Exception):
    """A file that cannot be read as a capture at all."""

    def __init__(self, path, message):
        super().__init__(f"{path}: {message}")
        self.path = str(path)
        self.message = message


def body_text(raw):
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")


def named(names, value, what):
    return names.get(value, f"{what} {value}")


def file_kind(mode):
    """'a directory', 'a FIFO (named pipe)'... for an st_mode that is not a regular file's."""
    return words.file_kind(mode, unknown="not a regular file")


def _open(path):
    """The capture at `path`, open for reading, and its size. Only a regular file is read: a
    FIFO or a device could block or never end. O_NONBLOCK keeps the open itself from waiting
    for a FIFO's writer; links are followed, a link to one's own capture being a fine input."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        mode = None
        if e.errno == errno.ENXIO:  # a socket, or a device with nothing behind it
            try:
                mode = os.stat(path).st_mode
            except OSError:
                pass
        if mode is None:
            raise CaptureError(path, f"cannot read: {e.strerror or e}") from None
        raise _refusal(path, mode) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refusal(path, st.st_mode)
        f = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    return f, st.st_size


def _refusal(path, mode):
    return CaptureError(path, f"is {file_kind(mode)}, not a capture file (captures are regular "
                              f"files)")


def _read_exact(f, n):
    out = b""
    while len(out) < n:
        more = f.read(n - len(out))
        if not more:
            break
        out += more
    return out


def open_capture(path):
    """Open and check the header: (file, header fields, file size)."""
    path = str(path)
    f, size = _open(path)
    try:
        try:
            head = _read_exact(f, abi.CAPTURE_HEADER.size)
        except OSError as e:
            raise CaptureError(path, f"cannot read: {e.strerror or e}") from None
        # A prefix of the magic (an empty file included) is a header the program died writing.
        if not abi.CAPTURE_MAGIC.startswith(head[:len(abi.CAPTURE_MAGIC)]):
            raise CaptureError(path, "not a clc capture file")
        if len(head) < abi.CAPTURE_HEADER.size:
            raise CaptureError(path, f"header cut short ({len(head)} of "
                                     f"{abi.CAPTURE_HEADER.size} bytes): the program died at "
                                     f"start, or its capture could not be written")
        fields = abi.CAPTURE_HEADER.unpack(head)
        version, header_size = fields[1], fields[2]
        if version != abi.CAPTURE_VERSION:
            raise CaptureError(path, f"unsupported capture version {version} "
                                     f"(this clc reads version {abi.CAPTURE_VERSION})")
        if header_size < abi.CAPTURE_HEADER.size or header_size > size:
            raise CaptureError(path, f"bad header size {header_size}")
        if header_size > len(head):
            f.seek(header_size)
    except BaseException:
        f.close()
        raise
    return f, fields, size


class Records:
    """The records of an open capture, read through one buffer of CHUNK bytes: iterating
    yields (type, buffer, body start, body end), the buffer being reused at the next step;
    `offset(body start)` is then the record's offset in the file. Afterwards `trailing`
    counts the bytes after the last whole record."""

    def __init__(self, f, start, size):
        self._f = f
        self._start = start
        self._size = size
        self._base = start
        self.trailing = 0

    def offset(self, body):
        """The file offset of the record being looked at, whose body starts at `body`."""
        return self._base + body - abi.RECORD_HEADER.size

    def __iter__(self):
        f = self._f
        unpack = abi.RECORD_HEADER.unpack_from
        buf = bytearray(CHUNK)
        pos = end = 0  # the unread records are buf[pos:end]
        base = self._start  # file offset of buf[0]
        eof = False
        while True:
            need = 8
            if end - pos >= 8:
                rtype, _, size = unpack(buf, pos)
                # A size that cannot be right means the rest is not records (a writer that
                # died between reserving space and filling it leaves zeros): stop as at a cut.
                if size < 8 or size % 8 or size > MAX_RECORD:
                    break
                if end - pos >= size:
                    yield rtype, buf, pos + 8, pos + size
                    pos += size
                    continue
                need = size
            if eof:
                break
            # Move the part of a record left at the end to the front, and read after it into
            # the same buffer: one buffer, grown only for a record larger than it.
            rest = end - pos
            buf[:rest] = buf[pos:end]
            base += pos
            self._base = base
            pos, end = 0, rest
            if need > len(buf):
                # A record the file cannot hold is cut short, or garbage: stop as at a cut,
                # before making room for it.
                if base + need > os.fstat(f.fileno()).st_size:
                    break
                buf += bytes(need - len(buf))
            with memoryview(buf) as whole, whole[end:] as free:
                n = f.readinto(free)
            if not n:
                eof = True
            end += n or 0
        self.trailing = max(self._size, base + end) - (base + pos)


def checked_gpu_ns(path, records, b, gpu_ns):
    """A TIMING record's gpu_ns, or CaptureError naming the record when it is no GPU time."""
    if gpu_ns > MAX_GPU_NS:
        raise CaptureError(path, f"TIMING record at byte {records.offset(b)}: a GPU time of "
                                 f"{gpu_ns} ns (2**63 or more) is not one the shim measured: "
                                 "the capture is damaged")
    return gpu_ns


def iter_file(cap):
    """The records of `cap`'s file, read again; the caller closes the file it gets."""
    f, _, size = open_capture(cap.path)
    return f, Records(f, cap.header_size, size)


def gpu_times(cap):
    """(kernel_id, gpu_ns, source name) of each TIMING record of cap's file, read again, in
    file order: the GPU time of every timed launch, for distributions (reports)."""
    f, records = iter_file(cap)
    timing = abi.REC_TIMING_BODY
    try:
        for rtype, buf, b, e in records:
            if rtype == abi.REC_TIMING and e - b >= timing.size:
                _, kernel_id, source, gpu_ns = timing.unpack_from(buf, b)
                yield (kernel_id, checked_gpu_ns(cap.path, records, b, gpu_ns),
                       abi.TIMING_SOURCES.get(source, str(source)))
    except OSError as e:
        raise CaptureError(cap.path, f"cannot read: {e.strerror or e}") from None
    finally:
        f.close()

