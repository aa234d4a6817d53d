# SPDX-License-Identifier: Apache-2.0
"""The per-kernel reports take their columns from one table (clc.capture.columns): a column
added there shows in the summary's table, the per-kernel CSV and the JSON's kernel rows, each
in its format; and clc metrics counts with the shim's list of kernel counters."""

import csv
import dataclasses
import io
import json
import re

from capture_writer import CaptureWriter
from clc import abi
from clc.capture import columns
from clc.capture.columns import Column
from clc.capture.metrics import KernelCounts
from clc.capture.reader import scan_capture
from clc.capture.reports import View, summary, write_report

VECADD = "_Z6vecAddPKfS0_Pfi"
VECADD_NAME = "vecAdd(float const*, float const*, float*, int)"


def capture(tmp_path):
    w = CaptureWriter(pid=100)
    w.kernel(0, VECADD, device=0)
    w.launch(0, 0, t_ns=1_000)
    w.timing(0, 0, 2_000_000)
    w.launch(1, 0, t_ns=2_000)
    w.timing(1, 0, 4_000_000)
    w.kernel_stats(0, launches=5, recorded=2, timed=2, gpu_ns=6_000_000)
    w.end()
    return scan_capture(w.write(tmp_path / "a.clc"))


def with_launch_count_column(monkeypatch):
    """The table with one more column: each kernel's launches not timed."""
    table = columns.kernel_columns

    def kernel_columns(percentiles=columns.distribution.DEFAULT_PERCENTILES):
        untimed = Column("untimed", lambda r, f: r.launches - r.timed, header="Untimed",
                         text=lambda v, r, f: str(v), csv=str, json="untimed", rank=99)
        return (*table(percentiles), untimed)
    monkeypatch.setattr(columns, "kernel_columns", kernel_columns)


def test_a_column_added_to_the_table_shows_in_every_per_kernel_format(tmp_path, monkeypatch):
    # GIVEN a capture of a kernel launched 5 times, 2 of them timed
    caps = [capture(tmp_path)]
    # WHEN the column table has one more column
    with_launch_count_column(monkeypatch)
    # THEN the summary's table has it, before the kernel's name, for the kernel and the Total
    lines = summary(caps, View()).splitlines()
    header = next(ln for ln in lines if ln.startswith("Launches"))
    assert re.split(r"\s{2,}", header.strip())[-2:] == ["Untimed", "Kernel"]
    row = next(ln for ln in lines if ln.endswith(VECADD_NAME))
    assert row[:-len(VECADD_NAME)].split()[-1] == "3"
    total = next(ln for ln in lines if ln.endswith("Total (1 kernel)"))
    assert total[:-len("Total (1 kernel)")].split()[-1] == "3"
    # AND the CSV has it last
    out = io.StringIO()
    write_report(caps, "csv", out, View())
    head, kernel = list(csv.reader(io.StringIO(out.getvalue())))
    assert head[-1] == "untimed" and kernel[-1] == "3"
    # AND the JSON's kernel rows have it
    out = io.StringIO()
    write_report(caps, "json", out, View())
    (k,) = json.loads(out.getvalue())["kernels"]
    assert k["untimed"] == 3 and list(k)[-1] == "untimed"


def test_the_formats_share_the_tables_columns():
    # The CSV's columns are the table's in its order; the summary's are those with a header,
    # the name last; the JSON's kernel keys those with a JSON key.
    ps = (50.0, 90.0)
    table = columns.kernel_columns(ps)
    assert [c.name for c in columns.csv_columns(ps)] == [c.name for c in table if c.csv]
    assert {c.header for c in columns.summary_columns(ps)} == \
        {c.header for c in table if c.header}
    assert columns.summary_columns(ps)[-1].name == "kernel"
    assert [c.name for c in columns.csv_columns(ps)][11:14] == ["gpu_min_us", "gpu_median_us",
                                                                "gpu_p90_us"]


def test_metrics_count_the_shims_kernel_counters():
    # GIVEN the counters the shim keeps per kernel (shim/clc_abi.h's CLC_KERNEL_COUNTERS)
    names = [f.name for f in dataclasses.fields(KernelCounts)]
    # THEN clc metrics counts each of them, and the launches confined to a green context
    assert names == [*abi.KERNEL_COUNTERS, "confined"]
    a = KernelCounts(**{c: i + 1 for i, c in enumerate(abi.KERNEL_COUNTERS)}, confined=1)
    a.add(a)
    assert [getattr(a, c) for c in names] == [2 * (i + 1) for i in range(len(names) - 1)] + [2]
