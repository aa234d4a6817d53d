# SPDX-License-Identifier: Apache-2.0
"""What a policy promises holds on the real driver and in a threaded Python program.

- examples/reload.c loads a module (or library), launches its kernel, unloads it, and loads
  the other kernel's, round after round; the driver hands the new kernel the unloaded one's
  handle. A deny of debug_kernel and a wrap of ok_kernel must each stay with their kernel.
- examples/torch_gil_backward.py launches kernels never launched before from autograd's device
  thread while its main thread holds the GIL. Under a YAML-only policy clc decides them
  without the program's Python, so the backward pass finishes inside the hold.
"""

import sys
from types import SimpleNamespace

import pytest

from gpu_runs import EXAMPLES, build_or_fail, build_driver_program, wrap_stats
from policy_cases import deny_debug

pytestmark = pytest.mark.gpu

ROUNDS = 20
APIS = ("module", "library")
CUDA_ERROR_NOT_PERMITTED = 800


# ---- examples/reload.c --------------------------------------------------------------------

@pytest.fixture(scope="session")
def reload_bin(nvcc, cuda_arch, build_dir):
    """The program and its two PTX files: run as [exe, ok_ptx, debug_ptx, api, rounds]."""
    kernels = EXAMPLES / "reload_kernels.cu"
    ok_ptx = build_dir / "reload_ok.ptx"
    debug_ptx = build_dir / "reload_debug.ptx"
    build_or_fail("reload_ok.ptx", [[nvcc, "-ptx", f"-arch={cuda_arch}", "-o", ok_ptx, kernels]])
    build_or_fail("reload_debug.ptx", [[nvcc, "-ptx", f"-arch={cuda_arch}", "-DRELOAD_DEBUG",
                                 "-o", debug_ptx, kernels]])
    return SimpleNamespace(exe=build_driver_program(nvcc, build_dir, "reload"), ok_ptx=ok_ptx,
                           debug_ptx=debug_ptx)


def reload_argv(reload_bin, api, rounds=ROUNDS):
    return [reload_bin.exe, reload_bin.ok_ptx, reload_bin.debug_ptx, api, rounds]


def _pairs(text):
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def reload_output(text):
    """The program's launch lines ({api, round, kernel, handle, owner, reused, rc, value, ok})
    and its info and summary lines by api."""
    out = SimpleNamespace(launches=[], info={}, summary={})
    for line in (text or "").splitlines():
        if line.startswith("launch "):
            out.launches.append(_pairs(line[len("launch "):]))
        elif line.startswith("info reload "):
            fields = _pairs(line[len("info reload "):])
            out.info[fields["api"]] = fields
        elif line.startswith("summary "):
            fields = _pairs(line[len("summary "):])
            out.summary[fields["api"]] = fields
    return out


def launch_table(launches):
    return "\n".join(f"  round {x['round']:>2} {x['kernel']:<12} handle={x['handle']} "
                     f"reused={x['reused']} rc={x['rc']} value={x['value']}" for x in launches)


def check_launches(out, api, want, describe):
    """Every launch of `api` returned want[kernel][0] and left want[kernel][1] in the buffer."""
    rows = [x for x in out.launches if x["api"] == api]
    assert len(rows) == 2 * ROUNDS, f"{len(rows)} launch lines for {api}\n{describe}"
    bad = [x for x in rows
           if (int(x["rc"]), int(x["value"])) != want[x["kernel"]]]
    assert not bad, (f"launches with another result than {want} ((rc, value) per kernel):\n"
                     f"{launch_table(bad)}\n\nall {api} launches:\n{launch_table(rows)}\n"
                     f"{describe}")
    return rows


def reuse_counts(rows):
    """(debug_kernel launches on ok_kernel's old handle, ok_kernel launches on debug's)."""
    debug_on_ok = sum(1 for x in rows if x["kernel"] == "debug_kernel" and x["reused"] == "1")
    ok_on_debug = sum(1 for x in rows if x["kernel"] == "ok_kernel" and x["reused"] == "1")
    return debug_on_ok, ok_on_debug


def skip_without_reuse(rows, api):
    debug_on_ok, ok_on_debug = reuse_counts(rows)
    if debug_on_ok + ok_on_debug == 0:
        pytest.skip(f"the driver never gave a new {api} kernel the unloaded one's handle in "
                    f"{ROUNDS} rounds: every result above was right, but no launch could have "
                    "met a stale decision")
    print(f"{api}: debug_kernel ran on ok_kernel's old handle {debug_on_ok} times, ok_kernel "
          f"on debug_kernel's {ok_on_debug} times")


@pytest.fixture(scope="module")
def reload_native(reload_bin, run_native, tools):
    proc = run_native(reload_argv(reload_bin, "both"))
    assert proc.returncode == 0, tools.describe(proc)
    out = reload_output(proc.stdout)
    for api in APIS:
        check_launches(out, api, {"ok_kernel": (0, 1), "debug_kernel": (0, 2)},
                       tools.describe(proc))
        assert out.summary[api]["wrong"] == "0", tools.describe(proc)
    return out


DENY_DEBUG = deny_debug(on_error="deny", message="debug kernels are refused in this test",
                        record_rest=True)

WRAP_OK = """\
# SPDX-License-Identifier: Apache-2.0
version: 1
default: allow
on_error: allow
rules:
  - name: wrap-ok
    match: {kernel: "ok_kernel"}
    action: wrap
    wrapper: block_count
    on_unwrappable: allow
    record: true
  - name: record-rest
    match: {kernel: "*"}
    action: allow
    record: true
"""


def records_by_kernel(report, tools, kernel):
    return [(r.get("action"), r.get("rule"), r.get("result"))
            for r in tools.launch_rows(report, kernel)]


@pytest.mark.parametrize("api", APIS)
def test_deny_stays_with_its_kernel_when_handles_are_reused(reload_bin, reload_native, run_clc,
                                                            tools, tmp_path, api):
    # GIVEN a policy that refuses *debug* kernels and records the others
    policy = tmp_path / "deny-debug.yaml"
    policy.write_text(DENY_DEBUG)
    # WHEN the program loads, launches and unloads ok_kernel and debug_kernel in turn, each
    # launch on a zeroed buffer
    proc, report = run_clc(policy, reload_argv(reload_bin, api), tmp_path)
    describe = tools.describe(proc) + "\n" + tools.report_summary(report)
    assert proc.returncode == 0, describe
    out = reload_output(proc.stdout)
    # THEN every ok_kernel launch ran and wrote its 1s, and every debug_kernel launch returned
    # CUDA_ERROR_NOT_PERMITTED and left the zeros, whichever kernel had the handle before
    rows = check_launches(out, api, {"ok_kernel": (0, 1),
                                     "debug_kernel": (CUDA_ERROR_NOT_PERMITTED, 0)}, describe)
    assert out.summary[api]["wrong"] == "0", describe
    # AND the capture agrees: ROUNDS launches of each, all of debug_kernel's denied by the rule
    tools.assert_capture_ok(report, proc)
    assert tools.kernel_total(report, "ok_kernel", "launches") == ROUNDS, describe
    assert tools.kernel_total(report, "ok_kernel", "denied") == 0, describe
    assert tools.kernel_total(report, "debug_kernel", "launches") == ROUNDS, describe
    assert tools.kernel_total(report, "debug_kernel", "denied") == ROUNDS, describe
    ok_records = records_by_kernel(report, tools, "ok_kernel")
    assert ok_records == [("allow", "record-rest", 0)] * ROUNDS, (ok_records, describe)
    debug_records = records_by_kernel(report, tools, "debug_kernel")
    assert debug_records, f"no record of a denied launch\n{describe}"
    assert set(debug_records) == {("deny", "no-debug", CUDA_ERROR_NOT_PERMITTED)}, \
        (debug_records, describe)
    # AND the driver did reuse handles, or this proved nothing
    skip_without_reuse(rows, api)


@pytest.mark.parametrize("api", APIS)
def test_wrap_stays_with_its_kernel_when_handles_are_reused(reload_bin, reload_native, run_clc,
                                                            tools, tmp_path, api):
    # GIVEN a policy that wraps ok_kernel with block_count and records every launch
    policy = tmp_path / "wrap-ok.yaml"
    policy.write_text(WRAP_OK)
    # WHEN the program loads, launches and unloads ok_kernel and debug_kernel in turn
    proc, report = run_clc(policy, reload_argv(reload_bin, api), tmp_path,
                           env={"CLC_CACHE_DIR": str(tmp_path / "cache")})
    describe = tools.describe(proc) + "\n" + tools.report_summary(report)
    assert proc.returncode == 0, describe
    out = reload_output(proc.stdout)
    # THEN every debug_kernel launch wrote its own 2s (it never ran ok_kernel's wrapped copy),
    # and every ok_kernel launch wrote 1s
    rows = check_launches(out, api, {"ok_kernel": (0, 1), "debug_kernel": (0, 2)}, describe)
    assert out.summary[api]["wrong"] == "0", describe
    # AND the capture says ok_kernel's launches were replaced by its wrapped copy and
    # debug_kernel's went through as they were
    tools.assert_capture_ok(report, proc)
    ok_records = records_by_kernel(report, tools, "ok_kernel")
    assert ok_records == [("replace", "wrap-ok", 0)] * ROUNDS, (ok_records, describe)
    debug_records = records_by_kernel(report, tools, "debug_kernel")
    assert debug_records == [("allow", "record-rest", 0)] * ROUNDS, (debug_records, describe)
    # AND the wrapped kernel counted exactly ok_kernel's blocks and threads: no debug_kernel
    # launch ran it
    grid, block = int(out.info[api]["grid"]), int(out.info[api]["block"])
    stats = wrap_stats(report)
    ok_stats = [s for s in stats if s.get("kernel") == "ok_kernel"]
    assert ok_stats and all(s.get("wrapper") == "block_count" for s in ok_stats), \
        (stats, describe)
    assert [s for s in stats if s.get("kernel") != "ok_kernel"] == [], (stats, describe)
    assert sum(s["blocks"] for s in ok_stats) == ROUNDS * grid, (stats, describe)
    assert sum(s["threads"] for s in ok_stats) == ROUNDS * grid * block, (stats, describe)
    # AND the driver did reuse handles, or this proved nothing
    skip_without_reuse(rows, api)


# ---- examples/torch_gil_backward.py -------------------------------------------------------

# The backward pass's new kernels are launched about 0.75 s into the 3.5 s hold; had they
# waited for the GIL, at its end. Launches in the last LATE_NS of the hold count as waiting.
LATE_NS = 1_000_000_000
MIN_NEW_KERNELS = 3


def gil_output(text):
    """The program's key=value lines: gate, threads, hold, check; and its result lines."""
    out = SimpleNamespace(gate={}, threads={}, hold={}, check={})
    for line in (text or "").splitlines():
        word, _, rest = line.partition(" ")
        if word in ("gate", "threads", "hold", "check"):
            getattr(out, word).update(_pairs(rest))
    return out


def window_made(out, describe, where):
    """The window was made as designed: the gate was closed when the hold began and open when
    it ended."""
    assert out.check, f"no check line ({where})\n{describe}"
    assert out.check["gate_closed_at_hold_begin"] == "1", (
        f"the spin kernel had ended before the hold began ({where}): the backward pass was not "
        f"held back until the GIL was taken; see the gate line\n{describe}")
    assert out.check["stream_idle_at_hold_end"] == "1", (
        f"the spin kernel was still running when the hold ended ({where})\n{describe}")


def backward_done_in_hold(out, describe, where):
    assert out.check["grads_set_at_hold_end"] == "1", (
        f"the backward pass had not finished when the 3.5 s hold ended ({where}): its new "
        f"kernels waited for the GIL (or autograd needed it)\n{describe}")


@pytest.fixture(scope="module")
def gil_argv(tools):
    pytest.importorskip("torch")
    return [sys.executable, tools.examples / "torch_gil_backward.py"]


@pytest.fixture(scope="module")
def gil_native(gil_argv, run_native, tools):
    proc = run_native(gil_argv)
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.parse(proc.stdout).done is not None, tools.describe(proc)
    # Without clc, autograd's device thread finishes the backward pass inside the hold: the
    # program itself needs no GIL there.
    out = gil_output(proc.stdout)
    window_made(out, tools.describe(proc), "native run")
    backward_done_in_hold(out, tools.describe(proc), "native run")
    return proc


def test_new_kernels_are_decided_while_another_thread_holds_the_gil(gil_native, gil_argv,
                                                                    run_clc, tools, tmp_path):
    # GIVEN a YAML-only policy that denies nothing and records every launch
    # WHEN the program's backward pass launches kernels it never launched before, from
    # autograd's device thread, while the main thread holds the GIL for 3.5 s
    proc, report = run_clc("audit.yaml", gil_argv, tmp_path)
    describe = tools.describe(proc)
    # THEN the program ran to its end with the native run's loss and gradients, bit for bit
    assert proc.returncode == 0, describe
    got, want = tools.parse(proc.stdout), tools.parse(gil_native.stdout)
    assert got.done is not None, describe
    assert set(want.results) == {"loss", "grad_w1", "grad_w2"}, tools.describe(gil_native)
    assert got.results == want.results, (f"results differ from the native run: {want.results}"
                                         f"\n{describe}")
    out = gil_output(proc.stdout)
    window_made(out, describe, "under clc-run")

    # AND the capture shows the backward pass's launches inside the hold, by a thread other
    # than the main one, none of them late in the hold or after it, and kernels first
    # launched among them
    tools.assert_capture_ok(report, proc)
    begin, end = int(out.hold["begin_ns"]), int(out.hold["end_ns"])
    main_tid = int(out.threads["main_tid"])
    assert end - begin >= 3_000_000_000, f"the hold lasted {(end - begin) / 1e9:.3f} s\n{describe}"
    launches = sorted(report.get("launches", []), key=lambda r: r["t_ns"])
    assert launches, f"no launch records\n{tools.report_summary(report)}"

    def at(r):
        return (f"  {(r['t_ns'] - begin) / 1e6:+10.3f} ms  tid {r['tid']}  {r['action']}  "
                f"{r['kernel']}")

    first = {}
    for r in launches:
        first.setdefault(r["mangled"], r)
    new_in_hold = [r for r in first.values() if begin <= r["t_ns"] < end]
    other = [r for r in launches if r["tid"] != main_tid and r["t_ns"] >= begin]
    window = "\n".join(at(r) for r in launches if r["t_ns"] >= begin - 50_000_000)
    context = (f"\nlaunches from 50 ms before the hold (offsets from the hold's start, which "
               f"lasted {(end - begin) / 1e6:.0f} ms; main thread {main_tid}):\n{window}\n"
               f"{tools.report_summary(report)}\n{describe}")
    assert not [r for r in launches if begin <= r["t_ns"] < end and r["tid"] == main_tid], \
        "the main thread launched while it held the GIL in usleep" + context
    late = [r for r in other if r["t_ns"] >= end - LATE_NS]
    assert not late, (f"{len(late)} launches of the backward pass in the last second of the "
                      "hold or after it: first sight waited for the GIL" + context)
    assert len(new_in_hold) >= MIN_NEW_KERNELS, (
        f"{len(new_in_hold)} kernels were first launched inside the hold, expected at least "
        f"{MIN_NEW_KERNELS} (the backward pass's *_backward kernels)" + context)
    assert all(r["tid"] != main_tid for r in new_in_hold), context
    # AND the program saw the backward pass finished when the hold ended, as natively
    backward_done_in_hold(out, describe, "under clc-run")
    print("kernels first launched inside the hold:\n" + "\n".join(at(r) for r in new_in_hold))
