# SPDX-License-Identifier: Apache-2.0
"""examples/torch_snippet.py (PyTorch eager ops, cuBLAS included) under clc-run.

PyTorch's kernel launches are counted independently by torch.profiler (CUPTI) in a separate
native run; clc's capture must agree with it kernel by kernel.
"""

import re
from collections import Counter

import pytest

from library_suite import AUDIT_DIFFERS, TIME_ALL_DIFFERS, python_snippet, run_as_native

pytestmark = pytest.mark.gpu

ITERATIONS = 12


@pytest.fixture(scope="module")
def snippet():
    return python_snippet("torch_snippet.py", ITERATIONS, "torch")


@pytest.fixture(scope="module")
def native(snippet, run_native, tools):
    proc = run_native(snippet)
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.parse(proc.stdout).done is not None, tools.describe(proc)
    return proc


@pytest.fixture(scope="module")
def profiled(snippet, run_native, tools):
    """Kernel name -> launches, as torch.profiler saw them."""
    proc = run_native([*snippet, "--profile"])
    assert proc.returncode == 0, tools.describe(proc)
    counts = tools.parse(proc.stdout).counts
    assert counts, f"the profiler saw no kernels\n{tools.describe(proc)}"
    return counts


def _norm(name):
    return re.sub(r"\s+", "", name or "")


def capture_counts(report):
    """Demangled kernel name -> launches, summed over rows of the same name."""
    counts = Counter()
    for r in report.get("kernels", []):
        counts[r.get("name") or r.get("mangled")] += r.get("launches") or 0
    return dict(counts)


def match_by_name(profiler, captured, strip_params):
    """Pair profiler names with capture names. Returns (pairs, problems).

    Exact match (ignoring whitespace) first; then a capture name that contains the profiler
    name or the other way round; then equal names without parameter lists.
    """
    pairs, problems, used = {}, [], set()
    cap_norm = {c: _norm(c) for c in captured}
    for p in sorted(profiler):
        pn = _norm(p)
        cands = [c for c, cn in cap_norm.items() if cn == pn]
        if not cands:
            cands = [c for c, cn in cap_norm.items() if pn in cn or cn in pn]
        if not cands:
            pb = _norm(strip_params(p))
            cands = [c for c in captured if _norm(strip_params(c)) == pb]
        cands = [c for c in cands if c not in used]
        if len(cands) != 1:
            problems.append(f"profiler kernel {p!r}: {len(cands)} candidates in the capture "
                            f"{cands[:3]}")
            continue
        used.add(cands[0])
        pairs[p] = cands[0]
    for c in captured:
        if c not in used:
            problems.append(f"capture kernel {c!r} ({captured[c]} launches) not paired with a "
                            "profiler kernel")
    for p, c in pairs.items():
        if profiler[p] != captured[c]:
            problems.append(f"{p!r}: profiler {profiler[p]} launches, capture {captured[c]}")
    return pairs, problems


def tables(profiler, captured):
    lines = ["--- torch.profiler (native run) ---"]
    lines += [f"{n:>6}  {k}" for k, n in sorted(profiler.items())]
    lines.append(f"{sum(profiler.values()):>6}  TOTAL")
    lines.append("--- clc capture ---")
    lines += [f"{n:>6}  {k}" for k, n in sorted(captured.items())]
    lines.append(f"{sum(captured.values()):>6}  TOTAL")
    return "\n".join(lines)


def test_audit(native, profiled, snippet, run_clc, tools, tmp_path):
    _, report = run_as_native(run_clc, "audit.yaml", snippet, tmp_path, native, AUDIT_DIFFERS)
    assert not any(r.get("denied") for r in report.get("kernels", [])), \
        tools.report_summary(report)

    captured = capture_counts(report)
    pairs, problems = match_by_name(profiled, captured, tools.strip_params)
    if problems:
        # Names can differ in form between CUPTI's demangler and clc's; the launch counts
        # cannot. Equal multisets of counts are accepted, the name problems shown as a note.
        same_counts = sorted(profiled.values()) == sorted(captured.values())
        assert same_counts, ("kernel launches differ between torch.profiler and clc:\n"
                             + "\n".join(problems) + "\n\n" + tables(profiled, captured))
        print("names did not pair up, counts agree as multisets:\n" + "\n".join(problems))


def _softmax_rows(report):
    return [r for r in report.get("kernels", [])
            if "softmax" in (r.get("name") or r.get("mangled") or "").lower()]


def test_deny_softmax(native, snippet, run_clc, tools, tmp_path):
    # Which kernel implements softmax depends on the PyTorch version: ask an audit run.
    _, audit = run_clc("audit.yaml", snippet, tmp_path)
    targets = _softmax_rows(audit)
    assert targets, f"no softmax kernel in the audit capture\n{tools.report_summary(audit)}"
    # Mangled names hold only [A-Za-z0-9_]: each is an exact glob for its kernel.
    mangled = sorted({r["mangled"] for r in targets})
    policy = tools.deny_policy(tmp_path / "deny-softmax.yaml", mangled)

    proc, report = run_clc(policy, snippet, tmp_path)
    out = tools.parse(proc.stdout)
    assert proc.returncode == 0, tools.describe(proc)
    assert out.errors and all(tools.not_permitted.search(msg) for _, msg in out.errors), (
        f"expected `cuda_error softmax ...` lines that say the launch was not permitted "
        f"(denied: {mangled})\n{tools.describe(proc)}")
    assert {op for op, _ in out.errors} == {"softmax"}, tools.describe(proc)
    tools.assert_capture_ok(report, proc)
    problems = []
    for r in report.get("kernels", []):
        want = r.get("launches") if r.get("mangled") in mangled else 0
        if r.get("denied") != want:
            problems.append(f"{r.get('name')}: denied {r.get('denied')}, expected {want}")
    denied_total = sum(r.get("denied") or 0 for r in report.get("kernels", []))
    assert denied_total > 0 and not problems, (
        "\n".join(problems) + f"\ndenied: {mangled}\n{tools.report_summary(report)}")
    # The snippet tried the softmax every other iteration and saw each attempt refused.
    assert out.error_counts.get("*") == denied_total, tools.describe(proc)


def test_time_all(native, snippet, run_clc, tools, tmp_path):
    proc, report = run_as_native(run_clc, "time-all.yaml", snippet, tmp_path, native,
                                 TIME_ALL_DIFFERS)
    tools.assert_all_timed(report, run=proc)
