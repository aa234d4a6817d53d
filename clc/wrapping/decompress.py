# SPDX-License-Identifier: Apache-2.0
"""The codecs of compressed fatbin entries (zstd, LZ4), within a bound on what they write.

Standard library only at import time: the engine runs inside the traced program, so zstandard
and lz4 (the `wrap` extra) are imported only when an entry compressed with them is read.
"""

__all__ = ["DecompressError", "decompress"]

_PACKAGES = {"zstd": "zstandard", "lz4": "lz4"}


class DecompressError(ValueError):
    """A payload that does not decompress to the size it claims, or a codec not installed."""


def decompress(method, raw, size):
    """raw, compressed by method ("zstd" or "lz4"), decompressed to exactly size bytes; never
    more than size + 1 bytes are written or allocated, whatever its headers claim."""
    package = _PACKAGES[method]
    try:
        if method == "zstd":
            import zstandard
            out = _zstd_frame(zstandard, raw, size)
        else:
            import lz4.block
            # Never more than uncompressed_size is written, nor allocated.
            out = lz4.block.decompress(raw, uncompressed_size=size)
    except ImportError:
        raise DecompressError(f"this entry is {method}-compressed and the Python package "
                              f"'{package}' is not installed (it comes with clc's wrap extra: "
                              f"pip install 'clc-launch-control[wrap]')") from None
    except Exception as e:      # each codec raises its own error type for damaged data
        raise DecompressError(f"{method} data of the entry does not decompress: {e}") from None
    if len(out) > size:
        raise DecompressError(f"{method} data decompresses to more than the {size} bytes the "
                              "entry header says (decompressing stopped there)")
    if len(out) != size:
        raise DecompressError(f"{method} data decompressed to {len(out)} bytes, the entry "
                              f"header says {size}")
    return out


def _zstd_frame(zstandard, raw, size):
    """The first zstd frame of raw, decompressed, but no more than size + 1 bytes of it: a
    frame's header may claim any content size, and decompress() would allocate all of it."""
    parts = []
    left = size + 1
    with zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        while left > 0:
            part = reader.read(min(left, 1 << 20))
            if not part:
                break
            parts.append(part)
            left -= len(part)
    return b"".join(parts)
