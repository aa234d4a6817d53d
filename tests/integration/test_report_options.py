# SPDX-License-Identifier: Apache-2.0
"""`clc report`'s kernel selection, order, CSV and distributions, over a real capture: a
program run by clc-run under time-all over the fake driver (every launch timed)."""

import csv
import io
import subprocess
import sys

import pytest
from harness import ROOT, TIME_ALL, clc_command, env_for


def timed_run(native, d, prog):
    (d / "time-all.yaml").write_text(TIME_ALL)
    out = d / f"{prog}.clc"
    p = subprocess.run(clc_command() + ["--policy", str(d / "time-all.yaml"), "-o", str(out),
                                        "--no-report", "--", str(native[prog])],
                       env=env_for(native), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture(scope="module")
def timed(native, tmp_path_factory):
    return timed_run(native, tmp_path_factory.mktemp("timed"), "prog_cudart")


@pytest.fixture(scope="module")
def other(native, tmp_path_factory):
    """prog_linked: vecAdd 4 launches under clc (prog_cudart: 5), fill 3 (none there), no
    scale."""
    return timed_run(native, tmp_path_factory.mktemp("other"), "prog_linked")


def report(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "clc", "report", *map(str, args)],
                          capture_output=True, text=True, timeout=60, cwd=cwd or ROOT)


def rows(text):
    return {ln.rsplit("  ", 1)[-1]: ln for ln in text.splitlines()}


def test_the_summary_has_each_kernels_distribution_and_share(timed):
    p = report(timed)
    assert p.returncode == 0, p.stderr
    header = next(ln for ln in p.stdout.splitlines() if ln.startswith("Launches"))
    for col in ("Share (%)", "Min (us)", "Median (us)", "Max (us)", "P99 (us)"):
        assert col in header
    vec = rows(p.stdout)["vecAdd(float const*, float const*, float*, int)"].split()
    # 5 launches timed by the fake driver's events; shares of the GPU total add up to 100
    assert vec[0] == "5" and float(vec[6]) > 0 and float(vec[8]) <= float(vec[9]) <= \
        float(vec[10])


def test_kernels_are_picked_by_glob_or_regex(timed):
    p = report(timed, "--kernel", "vec*")
    names = [ln for ln in p.stdout.splitlines() if ln.endswith(")") and "Total" not in ln
             and "pid" not in ln]
    assert len(names) == 1 and "vecAdd" in names[0], p.stdout
    assert "Total (1 kernel of 3)" in p.stdout
    p = report(timed, "--kernel-regex", "^sc")
    assert "scale(float*, float)" in p.stdout and "vecAdd(" not in p.stdout.split("Total")[0]
    p = report(timed, "--kernel-regex", "(a")
    assert p.returncode == 2 and "--kernel-regex '(a'" in p.stderr


def test_sorted_by_any_column(timed):
    p = report(timed, "--sort", "name", "--format", "csv")
    names = [r["kernel"] for r in csv.DictReader(io.StringIO(p.stdout))]
    assert names == sorted(names)
    p = report(timed, "--sort", "gpu-total", "--format", "csv")
    totals = [float(r["gpu_total_ms"] or -1) for r in csv.DictReader(io.StringIO(p.stdout))]
    assert totals == sorted(totals, reverse=True)


def test_csv_has_whole_names_and_numbers(timed):
    p = report(timed, "--format", "csv", "-o", "-")
    assert p.returncode == 0 and p.stderr == ""
    table = list(csv.DictReader(io.StringIO(p.stdout)))
    by = {r["mangled"]: r for r in table}
    vec = by["_Z6vecAddPKfS0_Pfi"]
    assert vec["kernel"] == "vecAdd(float const*, float const*, float*, int)"
    assert int(vec["launches"]) == 5 and int(vec["timed"]) == 5
    assert float(vec["gpu_min_us"]) <= float(vec["gpu_median_us"]) <= float(vec["gpu_p99_us"]) \
        <= float(vec["gpu_max_us"])
    assert sum(float(r["share_pct"]) for r in table if r["share_pct"]) == pytest.approx(100, 0.01)
    assert by["_Z12debug_kernelPi"]["denied"] == "0"


def test_an_output_file_is_named_when_written(timed, tmp_path):
    out = tmp_path / "r.csv"
    p = report(timed, "--format", "csv", "-o", out)
    assert p.returncode == 0
    assert p.stderr.strip() == f"clc: csv report of 1 capture written to {out}"
    assert out.read_text().startswith("kernel,mangled,launches,")


def test_selection_is_refused_where_it_does_not_apply(timed):
    p = report(timed, "--format", "json", "--sort", "name")
    assert p.returncode == 2 and "--sort orders the kernels of a summary or a per-kernel csv, " \
        "not --format json" in p.stderr


def test_names_whole_or_cut_in_the_middle(timed):
    assert report(timed, "--width", "5").returncode == 2
    p = report(timed, "--width", "12")
    assert "vecA... int)" in p.stdout
    p = report(timed, "--width", "0")
    assert "vecAdd(float const*, float const*, float*, int)" in p.stdout


def test_two_runs_side_by_side(timed, other):
    p = report(other, "--baseline", timed, "--format", "csv")
    assert p.returncode == 0, p.stderr
    by = {r["mangled"]: r for r in csv.DictReader(io.StringIO(p.stdout))}
    vec = by["_Z6vecAddPKfS0_Pfi"]
    assert (vec["launches_base"], vec["launches"], vec["launches_change"]) == ("5", "4", "-1")
    assert float(vec["gpu_total_ms_base"]) > 0 and vec["gpu_total_change_pct"] != ""
    fill = next(r for m, r in by.items() if "fill" in m)
    assert (fill["launches_base"], fill["gpu_total_ms_base"]) == ("0", "")
    # a kernel only the baseline ran comes last
    assert list(by)[-1] == "_Z5scalePff" and by["_Z5scalePff"]["launches"] == "0"


def test_a_comparison_as_summary_and_json(timed, other):
    import json
    p = report(other, "--baseline", timed)
    assert p.stdout.startswith(f"baseline: {timed}\ncurrent:  {other}\n")
    assert "Launches (base)" in p.stdout and "of the baseline did not run" in p.stdout
    p = report(other, "--baseline", timed, "--format", "json", "--kernel", "vec*")
    doc = json.loads(p.stdout)
    assert [k["kernel"] for k in doc["kernels"]] == [
        "vecAdd(float const*, float const*, float*, int)"]
    assert doc["kernels"][0]["launches_change"] == -1 and doc["baseline"] == [str(timed)]
    assert report(other, "--baseline", timed, "--format", "chrome").returncode == 2
