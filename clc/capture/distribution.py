# SPDX-License-Identifier: Apache-2.0
"""The spread of a kernel's GPU times in reports: chosen percentiles (nearest rank) and the
standard deviation, named alike in the summary, the CSV and the JSON."""

import math

__all__ = ["DEFAULT_PERCENTILES", "parse_percentiles", "label", "key", "std_dev"]

# What the summary showed before percentiles could be chosen: the median and the 99th.
DEFAULT_PERCENTILES = (50.0, 99.0)


def parse_percentiles(text):
    """'50,90,99' as (50.0, 90.0, 99.0): ascending, each once; ValueError saying which item is
    wrong (not a number, or not in (0, 100])."""
    out = set()
    for item in text.split(","):
        item = item.strip()
        try:
            p = float(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a number (expected percentiles such as "
                             f"50,90,99)") from None
        if not (0 < p <= 100):  # a NaN fails this too
            raise ValueError(f"{item} is not a percentile in (0, 100]")
        out.add(p)
    return tuple(sorted(out))


def label(p):
    """The summary's column for percentile p: 'Median', 'P99', 'P99.9'."""
    return "Median" if p == 50 else f"P{p:g}"


def key(p):
    """The CSV's and the JSON's name for percentile p: 'median', 'p99', 'p99_9'."""
    return "median" if p == 50 else f"p{p:g}".replace(".", "_")


def std_dev(times):
    """The sample standard deviation (n - 1, as nsys stats gives its StdDev) of integer
    times; 0.0 for one time, None for none. Summed as integers, so that no rounding of large
    sums of squares makes a narrow spread come out wrong."""
    n = len(times)
    if not n:
        return None
    if n == 1:
        return 0.0
    s = sum(times)
    sq = sum(t * t for t in times)
    return math.sqrt((n * sq - s * s) / (n * (n - 1)))
