# SPDX-License-Identifier: Apache-2.0
"""`action: wrap` end to end on the CPU: a program's PTX kernels spliced, linked by nvJitLink
into a cubin inside the traced program, loaded into the fake driver, and launched by the shim
in place of the originals, with the clc_launch_arg appended and, for sm_share, a capped grid.

The tests run prog_wrap (tests/fixtures/native/prog_wrap.c), which prints after every launch
what the fake driver really received (`seen` lines): the function (the program's, or one from a
cubin), the grid, the program's own arguments and the 32-byte argument a wrapped launch
carries. The fake's occupancy rule (blocks per SM = min(32, 2048 / block threads,
232448 / shared memory), 132 SMs) lets a test compute the grid sm_share must launch.
"""

import json
import re
import sys

import pytest

from clc import abi
from clc.cuda_errors import CUDA_ERRORS
from clc.wrapping.build import build, wrapper_spec
from clc.wrapping.engine import N_SLOTS
from harness import fake_counts

pytest.importorskip("cuda.bindings.nvjitlink", reason="wrapping needs cuda-bindings (nvJitLink)")
pytest.importorskip("cuda.bindings.nvrtc", reason="wrapping needs cuda-bindings (NVRTC)")

WRAPPABLE = ("vec_add", "scale")
UNWRAPPABLE = "bump_counter"   # adds to a __device__ variable of its module
PADDED = 11                    # prog_wrap's launch whose `extra` buffer is larger than the layout
LAUNCHES = {"vec_add": 8, "scale": 2, "bump_counter": 2}
SLOT_BYTES = 32
RING = N_SLOTS * SLOT_BYTES   # a context's slot ring; its graph slots follow it

# The fake GPU (tests/fixtures/native/fake_cuda.c): an H100-like part.
SMS, SM_THREADS, SM_BLOCKS, SM_SHARED = 132, 2048, 32, 232448


def blocks_per_sm(threads, shared_mem):
    n = min(SM_BLOCKS, SM_THREADS // threads)
    return min(n, SM_SHARED // shared_mem) if shared_mem else n


def expected_grid(params, grid, threads, shared_mem):
    """The grid an sm_share launch must get, whatever the share (the kernel keeps the blocks
    on its share of the SMs): one wave, (min(SMs x blocks per SM, the program's blocks), 1,
    1)."""
    return (min(SMS * blocks_per_sm(threads, shared_mem), grid[0] * grid[1] * grid[2]), 1, 1)


def wrap_policy(wrapper="sm_share", params=None, kernels=WRAPPABLE, on_unwrappable=None):
    lines = ["version: 1", "default: allow", "rules:", "  - name: wrap-them",
             f"    match: {{kernel_regex: \"^({'|'.join(kernels)})$\"}}", "    action: wrap",
             f"    wrapper: {wrapper}"]
    if wrapper == "sm_share":  # these tests are of the splice (a green context has its own)
        lines.append("    mechanism: splice")
    if params:
        lines.append(f"    params: {json.dumps(params)}")
    if on_unwrappable:
        lines.append(f"    on_unwrappable: {on_unwrappable}")
    return "\n".join(lines) + "\n"


def _fields(text):
    out = {}
    for kv in text.split():
        key, value = kv.split("=", 1)
        if key in ("grid", "block", "vgrid"):
            value = tuple(int(v) for v in value.split(","))
        elif key in ("slot", "slot_base"):
            value = int(value, 16)
        elif re.fullmatch(r"-?\d+", value):
            value = int(value)
        out[key] = value
    return out


def launches(stdout):
    """[{kernel, arg: {...}, rc, seen: {...}}] of prog_wrap's launches, in order: what the
    program passed, what it got back, what the driver received."""
    args = [(m[1], _fields(m[2])) for m in re.finditer(r"^arg (\S+) (.*)$", stdout, re.M)]
    rcs = [int(m[1]) for m in re.finditer(r"^launch \S+ via \S+ -> (-?\d+)$", stdout, re.M)]
    seen = [_fields(m[2]) for m in re.finditer(r"^seen (\S+) (.*)$", stdout, re.M)]
    assert len(args) == len(rcs) == len(seen), stdout
    return [{"kernel": kernel, "arg": arg, "rc": rc, "seen": s}
            for (kernel, arg), rc, s in zip(args, rcs, seen)]


def messages(run, prefix=""):
    return [m.text for m in run.capture().messages if m.text.startswith(prefix)]


def ok(run):
    """The program ran to its end, and clc built and loaded every wrapped kernel it tried (a
    failure would only show as launches let through unwrapped)."""
    assert run.proc.returncode == 0, f"exit {run.proc.returncode}\n{run.stderr}"
    assert "fake:" in run.stdout, run.stderr
    assert not messages(run, "wrapping "), run.stderr


def assert_unwrapped(launch):
    """The driver ran the program's own kernel with the program's grid and arguments."""
    seen, arg = launch["seen"], launch["arg"]
    assert launch["rc"] == 0
    assert (seen["original"], seen["code"], seen["clc_arg"]) == (1, "ptx", 0), launch
    assert (seen["grid"], seen["block"], seen["smem"]) == (arg["grid"], arg["block"], arg["smem"])
    assert seen["own_args"] == "same"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One disk cache for the tests that do not look at it: each kernel is built once."""
    return tmp_path_factory.mktemp("wrap-cache")


@pytest.fixture
def run_wrap(clc_run, native, shared_cache):
    def run(policy, mode="library", cache=None, output=None, args=()):
        return clc_run(policy, [native["prog_wrap"], mode, *args], output=output,
                       env={"CLC_CACHE_DIR": str(cache or shared_cache)})

    return run


# ---- the fake driver and the program ---------------------------------------------------------

FAKE_LOADS_CUBIN = """\
import ctypes, sys
cubin = open(sys.argv[1], "rb").read()
cuda = ctypes.CDLL("libcuda.so.1")
lib, kernel, missing = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
assert cuda.cuInit(0) == 0
assert cuda.cuLibraryLoadData(ctypes.byref(lib), cubin, None, None, 0, None, None, 0) == 0
print("kernel", cuda.cuLibraryGetKernel(ctypes.byref(kernel), lib, b"vec_add"))
print("other", cuda.cuLibraryGetKernel(ctypes.byref(missing), lib, b"scale"))
print("managed", cuda.cuLibraryGetManaged(ctypes.byref(ptr), ctypes.byref(size), lib,
                                          b"clc_stats"),
      size.value >= int(sys.argv[2]), ctypes.string_at(ptr.value, size.value) == bytes(size.value))
print("no-such", cuda.cuLibraryGetManaged(ctypes.byref(ptr), ctypes.byref(size), lib, b"nope"))
"""


def test_fake_driver_loads_the_cubin_clc_links(run_native, native, tmp_path):
    # GIVEN vec_add of prog_wrap's PTX, spliced and linked by nvJitLink as clc does
    ptx = run_native([native["prog_wrap"], "ptx"])
    assert ptx.returncode == 0 and ".entry vec_add(" in ptx.stdout, ptx.stderr
    built = build(ptx.stdout, "vec_add", wrapper_spec("sm_share", {"share": 0.25}), 90)
    cubin = tmp_path / "vec_add.cubin"
    cubin.write_bytes(built.cubin)
    script = tmp_path / "load.py"
    script.write_text(FAKE_LOADS_CUBIN)
    # WHEN a process loads it into the fake driver with cuLibraryLoadData
    proc = run_native([sys.executable, script, cubin, abi.STATS.size])
    assert proc.returncode == 0, proc.stderr
    # THEN its entry is a kernel (and only it), and clc_stats is a zeroed buffer as large as
    # what clc reads of it
    assert proc.stdout.splitlines() == [
        "kernel 0", f"other {CUDA_ERRORS['CUDA_ERROR_NOT_FOUND']}", "managed 0 True True",
        f"no-such {CUDA_ERRORS['CUDA_ERROR_NOT_FOUND']}"]


@pytest.mark.parametrize("mode", ["library", "module"])
def test_prog_wrap_runs_its_own_kernels_without_clc(run_native, native, mode):
    # WHEN prog_wrap runs over the fake driver without clc
    proc = run_native([native["prog_wrap"], mode])
    # THEN every launch succeeds with the program's own function, grid and arguments, and
    # nothing more
    assert proc.returncode == 0, proc.stderr
    got = launches(proc.stdout)
    assert len(got) == 12
    for launch in got:
        assert_unwrapped(launch)
        assert launch["seen"]["extra_size"] == launch["arg"]["extra_size"]
    assert fake_counts(proc.stdout) == LAUNCHES


# ---- sm_share: a capped grid, the launch argument, one slot ring -------------------------------

@pytest.mark.parametrize("params", [{"share": 0.25}, {"share": 0.3}, {"sms": 10}],
                         ids=["share0.25", "share0.3", "sms10"])
@pytest.mark.parametrize("mode", ["library", "module"])
def test_sm_share_launches_the_wrapped_kernel_on_a_capped_grid(run_wrap, mode, params):
    # GIVEN a policy that holds vec_add and scale to a share of the GPU
    # WHEN prog_wrap launches them every way (kernelParams and extra, cuLaunchKernel and
    # cuLaunchKernelEx, 1D and 3D grids, a kernel allowed more shared memory than the default)
    run = run_wrap(wrap_policy("sm_share", params), mode)
    ok(run)
    wrapped = [launch for i, launch in enumerate(launches(run.stdout))
               if launch["kernel"] in WRAPPABLE and i != PADDED]
    assert {(l["arg"]["form"], l["arg"]["via"]) for l in wrapped} == {
        (form, via) for form in ("params", "extra")
        for via in ("cuLaunchKernel", "cuLaunchKernelEx")}
    for launch in wrapped:
        seen, arg = launch["seen"], launch["arg"]
        threads = arg["block"][0] * arg["block"][1] * arg["block"][2]
        # THEN each launch succeeds, and the driver ran a function of clc's cubin, not the
        # program's, on (min(cap, the program's blocks), 1, 1) blocks of the program's shape
        assert launch["rc"] == 0, launch
        assert (seen["original"], seen["code"]) == (0, "cubin"), launch
        assert seen["grid"] == expected_grid(params, arg["grid"], threads, arg["smem"]), launch
        assert (seen["block"], seen["smem"]) == (arg["block"], arg["smem"])
        # AND it got the program's arguments unchanged, and one more: the program's grid, a
        # slot of the context's ring, zeroed before first use, in the ring's first lap, the
        # share's SM count and the batch its blocks claim (about 16 batches per block)
        assert seen["own_args"] == "same", launch
        assert seen["clc_arg"] == 1, launch
        share_sms = -(-round(params["share"] * 1_000_000) * SMS // 1_000_000) \
            if "share" in params else params["sms"]
        total = arg["grid"][0] * arg["grid"][1] * arg["grid"][2]
        batch = min(64, max(1, total // (seen["grid"][0] * 16)))
        assert (seen["vgrid"], seen["seq"], seen["share_sms"], seen["batch"]) == \
            (arg["grid"], 1, share_sms, batch)
        # a slot of the context's ring (its graph slots follow it in the same allocation)
        assert seen["slot_alloc"] == (N_SLOTS + abi.GRAPH_SLOTS) * SLOT_BYTES
        assert seen["slot"] - seen["slot_base"] < N_SLOTS * SLOT_BYTES
        assert (seen["slot"] - seen["slot_base"]) % SLOT_BYTES == 0
        assert seen["slot_zero"] == 1
        if arg["form"] == "extra":
            # in `extra`, after the program's bytes at the layout's size rounded up to 8
            assert seen["extra_size"] == (arg["extra_size"] + 7) // 8 * 8 + SLOT_BYTES
    # AND one ring serves the context: its wrapped launches, whichever the kernel, take its
    # slots in turn
    assert len({l["seen"]["slot_base"] for l in wrapped}) == 1
    slots = [l["seen"]["slot"] for l in wrapped]
    assert [b - a for a, b in zip(slots, slots[1:])] == [SLOT_BYTES] * (len(slots) - 1)
    # AND the kernel that cannot be wrapped runs as it is
    for launch in launches(run.stdout):
        if launch["kernel"] == UNWRAPPABLE:
            assert_unwrapped(launch)


def test_sm_share_replays_the_programs_shared_memory_attribute(run_wrap):
    # GIVEN vec_add allowed 100000 bytes of dynamic shared memory before its first launch
    # WHEN a launch uses them under sm_share
    run = run_wrap(wrap_policy("sm_share", {"share": 0.25}))
    ok(run)
    assert re.search(r"^attr vec_add via cuKernelSetAttribute -> 0$", run.stdout, re.M)
    (launch,) = [l for l in launches(run.stdout) if l["arg"]["smem"] == 100000]
    # THEN the wrapped copy is allowed as much (the driver accepts it), and the wave counts
    # the blocks that fit beside that much shared memory (2 per SM)
    assert launch["rc"] == 0
    assert (launch["seen"]["original"], launch["seen"]["smem"]) == (0, 100000)
    total = launch["arg"]["grid"][0] * launch["arg"]["grid"][1] * launch["arg"]["grid"][2]
    assert launch["seen"]["grid"] == (min(SMS * 2, total), 1, 1)
    assert not messages(run, "the driver refused a wrapped kernel's launch")


@pytest.mark.parametrize("mode,via", [("library", "cuKernelSetAttribute"),
                                      ("module", "cuFuncSetAttribute")])
def test_an_attribute_set_after_wrapping_is_set_on_the_replacement(run_wrap, mode, via):
    # GIVEN vec_add launched wrapped several times, and only then allowed 100000 bytes of
    # dynamic shared memory (cudaFuncSetAttribute with a CUkernel, or a module's function)
    run = run_wrap(wrap_policy("sm_share", {"share": 0.25}), mode=mode, args=["late"])
    ok(run)
    assert re.search(rf"^attr vec_add via {via} -> 0$", run.stdout, re.M)
    assert run.stdout.index("attr vec_add") > run.stdout.index("seen vec_add i=0 ")
    # WHEN a launch uses them
    (launch,) = [l for l in launches(run.stdout) if l["arg"]["smem"] == 100000]
    # THEN the wrapped copy runs it (the driver accepted its attribute), not the original
    assert launch["rc"] == 0
    assert (launch["seen"]["original"], launch["seen"]["smem"]) == (0, 100000)
    assert not messages(run, "the driver refused a wrapped kernel's launch")
    assert not messages(run, "could not be set on its replacement")


@pytest.mark.parametrize("mode", ["library", "module"])
def test_the_wrapped_code_is_the_launched_kernels_own_not_a_namesakes(run_wrap, mode):
    # GIVEN a later module that defines another `scale` (one parameter, not three)
    run = run_wrap(wrap_policy("sm_share", {"share": 0.25}), mode=mode, args=["twin"])
    ok(run)
    # WHEN the first image's scale is launched
    launched = [l for l in launches(run.stdout) if l["kernel"] == "scale"]
    # THEN clc wrapped the code of the load it came from (the driver says which:
    # cuKernelGetLibrary, cuFuncGetModule), not the newest image defining the name
    assert launched and all(l["rc"] == 0 and l["seen"]["original"] == 0 for l in launched)
    assert not [m for m in messages(run) if "scale" in m and "refused" in m]


def test_kernels_loaded_from_a_file_are_wrapped_from_what_the_driver_loaded(run_wrap):
    # GIVEN a program that loads its PTX from a file (cuModuleLoad) and overwrites the file
    # right after
    run = run_wrap(wrap_policy("block_count", on_unwrappable="deny"), mode="file")
    ok(run)
    # THEN every launch of the wrappable kernels ran the wrapped copy, built from the image the
    # driver loaded (clc read the file right after the load), none refused
    launched = [l for l in launches(run.stdout) if l["kernel"] in WRAPPABLE]
    assert launched and all(l["rc"] == 0 and l["seen"]["original"] == 0 for l in launched), \
        run.stdout + run.stderr
    assert not [m for m in messages(run) if "cannot be wrapped" in m]


def test_two_wrapped_kernels_in_one_context_never_share_a_slot(run_wrap):
    # GIVEN vec_add and scale both wrapped in one context
    # WHEN their launches interleave (in flight together on a GPU, e.g. on two streams)
    run = run_wrap(wrap_policy("sm_share", {"share": 0.25}))
    ok(run)
    slots = [(i, l["kernel"], l["seen"]["slot"]) for i, l in enumerate(launches(run.stdout))
             if l["seen"].get("clc_arg") == 1]
    assert {kernel for _, kernel, _ in slots} == set(WRAPPABLE)
    # THEN no two of these few launches got the same slot: a slot holds one launch's block
    # counter, and two launches sharing it would each skip blocks the other claimed
    by_slot = {}
    for i, kernel, slot in slots:
        by_slot.setdefault(slot, []).append(f"{kernel}#{i}")
    assert {s: who for s, who in by_slot.items() if len(who) > 1} == {}


def test_an_extra_buffer_larger_than_the_parameters_is_wrapped_too(run_wrap):
    # GIVEN a program that passes vec_add's 28 bytes of arguments in a 48-byte `extra` buffer
    # (zero padding after them, as a C struct with 16-byte alignment has), which the driver accepts
    run = run_wrap(wrap_policy("sm_share", {"share": 0.25}))
    ok(run)
    launch = launches(run.stdout)[PADDED]
    assert (launch["kernel"], launch["arg"]["extra_size"]) == ("vec_add", 48)
    assert launch["rc"] == 0
    # THEN it is wrapped like the others: the kernel never reads past its parameters, so the
    # buffer can be cut at arg_offset and the launch argument written there
    assert (launch["seen"]["original"], launch["seen"]["clc_arg"]) == (0, 1)
    assert launch["seen"]["grid"] == (min(528, 300), 1, 1)
    assert not messages(run, "a wrapped kernel's launch could not be rewritten")


# ---- block_count: the program's grid, the launch argument ----------------------------------------

@pytest.mark.parametrize("mode", ["library", "module"])
def test_block_count_keeps_the_grid_and_appends_the_launch_argument(run_wrap, mode):
    # GIVEN a policy that counts vec_add's and scale's blocks
    # WHEN prog_wrap launches them
    run = run_wrap(wrap_policy("block_count"), mode)
    ok(run)
    for i, launch in enumerate(launches(run.stdout)):
        seen, arg = launch["seen"], launch["arg"]
        if launch["kernel"] not in WRAPPABLE or i == PADDED:
            continue
        # THEN the wrapped kernel runs on the program's own grid, with the program's arguments
        # and the launch argument naming that grid
        assert launch["rc"] == 0
        assert (seen["original"], seen["code"], seen["clc_arg"]) == (0, "cubin", 1), launch
        assert seen["grid"] == seen["vgrid"] == arg["grid"]
        assert (seen["block"], seen["smem"], seen["own_args"]) == (arg["block"], arg["smem"],
                                                                   "same")
        assert seen["slot_zero"] == 1


# ---- kernels that cannot be wrapped ------------------------------------------------------------

def test_unwrappable_kernel_runs_unwrapped_with_on_unwrappable_allow(run_wrap):
    # GIVEN a policy that wraps bump_counter, whose code adds to a __device__ variable
    # WHEN prog_wrap launches it twice
    run = run_wrap(wrap_policy("block_count", kernels=(UNWRAPPABLE,), on_unwrappable="allow"))
    ok(run)
    # THEN both launches run the program's own kernel, as if no rule had matched
    bumps = [l for l in launches(run.stdout) if l["kernel"] == UNWRAPPABLE]
    assert len(bumps) == 2
    for launch in bumps:
        assert_unwrapped(launch)
    # AND why is said once, naming the variable, in the capture and on stderr
    (why,) = messages(run, f"{UNWRAPPABLE} cannot be wrapped")
    assert "module variable g_counter" in why and "let through unwrapped" in why
    assert f"clc: {why}" in run.stderr
    # AND the kernels the rule does not name are untouched
    for launch in launches(run.stdout):
        if launch["kernel"] != UNWRAPPABLE:
            assert_unwrapped(launch)


def test_unwrappable_kernel_is_denied_with_on_unwrappable_deny(run_wrap):
    # GIVEN the same rule with on_unwrappable: deny
    run = run_wrap(wrap_policy("block_count", kernels=(UNWRAPPABLE,), on_unwrappable="deny"))
    ok(run)
    # WHEN prog_wrap launches bump_counter THEN each launch returns CUDA_ERROR_NOT_PERMITTED and
    # the driver runs none of them
    bumps = [l for l in launches(run.stdout) if l["kernel"] == UNWRAPPABLE]
    assert [l["rc"] for l in bumps] == [CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]] * 2
    assert [l["seen"]["form"] for l in bumps] == ["none", "none"]
    assert re.search(rf"^fake: {UNWRAPPABLE} launches=0 ", run.stdout, re.M)
    # AND the capture counts them as denied, and says why once
    cap = run.capture()
    (kid,) = [k for k, kern in cap.kernels.items() if kern.mangled == UNWRAPPABLE]
    assert (cap.stats[kid].launches, cap.stats[kid].denied) == (2, 2)
    (why,) = messages(run, f"{UNWRAPPABLE} cannot be wrapped")
    assert "denied (on_unwrappable: deny)" in why
    # AND the other kernels run
    assert all(l["rc"] == 0 for l in launches(run.stdout) if l["kernel"] != UNWRAPPABLE)


# ---- the disk cache, the exit counts, graphs ----------------------------------------------------

def test_second_run_takes_the_wrapped_kernels_from_the_disk_cache(run_wrap, tmp_path):
    cache = tmp_path / "cache"
    policy = wrap_policy("sm_share", {"share": 0.25})
    # GIVEN an empty cache directory
    # WHEN prog_wrap runs twice under the same policy
    first = run_wrap(policy, cache=cache, output=tmp_path / "first.clc")
    second = run_wrap(policy, cache=cache, output=tmp_path / "second.clc")
    ok(first)
    ok(second)
    # THEN the first run builds each wrapped kernel and stores it, the second loads it from disk
    def builds(run):
        return sorted(re.match(r"wrap build: (\S+) with sm_share: (built|disk cache) in [\d.]+ ms$",
                               text).groups() for text in messages(run, "wrap build: "))
    assert builds(first) == [("scale", "built"), ("vec_add", "built")]
    assert builds(second) == [("scale", "disk cache"), ("vec_add", "disk cache")]
    assert [p for p in cache.rglob("*") if p.is_file()]
    # AND the cubin from disk launches exactly as the built one did
    assert [l["seen"]["grid"] for l in launches(second.stdout)] == \
        [l["seen"]["grid"] for l in launches(first.stdout)]


def test_exit_says_each_wrapped_kernels_counts(run_wrap):
    # WHEN a program with wrapped kernels exits
    run = run_wrap(wrap_policy("sm_share", {"share": 0.25}))
    ok(run)
    # THEN the capture has one WRAP_STATS record per wrapped kernel (all counts zero: the fake
    # driver runs no code, and its clc_stats stays as loaded)
    stats = run.capture().wrap_stats
    assert sorted(s.kernel for s in stats) == sorted(WRAPPABLE)
    for s in stats:
        assert s.wrapper == "sm_share share=0.25"
        assert (s.blocks, s.threads, s.skipped, s.max_resident, s.share_sms) == (0, 0, 0, 0, 0)
    assert not messages(run, "wrap stats")
    (libs,) = messages(run, "wrap libraries: ")
    assert libs == "wrap libraries: 2 cuLibraryLoadData calls, 1 context, 2 unloaded at exit"


def test_the_wrapped_kernels_counts_keep_their_room_under_the_size_cap(clc_run, native,
                                                                        shared_cache, tmp_path):
    # GIVEN wrapped kernels whose every launch is recorded, launched 3000 times more than a
    # capture limited to 96 KiB holds
    policy = wrap_policy("sm_share", {"share": 0.25}) + "    record: true\n"
    run = clc_run(policy, [native["prog_wrap"], "library"], options=["--capture-limit", "96K"],
                  env={"CLC_CACHE_DIR": str(shared_cache), "WRAP_REPEAT": "3000"})
    ok(run)
    assert "repeat launches=3000 failed=0" in run.stdout
    # THEN the launch records stopped at the limit
    cap = run.capture()
    assert cap.capped_bytes and cap.partial and run.output.stat().st_size <= 96 * 1024
    # AND each wrapped kernel's counts, written at exit, had their room kept: the capture lost
    # nothing it must keep
    assert sorted(s.kernel for s in cap.wrap_stats) == sorted(WRAPPABLE)
    assert cap.complete and not cap.truncated
    (vec,) = [s for k, s in cap.stats.items() if cap.kernels[k].mangled == "vec_add"]
    assert vec.launches == LAUNCHES["vec_add"] + 3000


def node_seen(stdout):
    return [_fields(m[2]) for m in re.finditer(r"^node-seen (\S+) (.*)$", stdout, re.M)]


@pytest.mark.parametrize("wrapper,params", [("sm_share", {"share": 0.25}), ("block_count", {})])
def test_graph_kernel_nodes_of_a_wrapped_kernel_get_the_wrapped_kernel(run_wrap, wrapper, params):
    # GIVEN vec_add wrapped
    # WHEN the program puts it in a graph twice (cuGraphAddKernelNode_v2) and launches the graph
    run = run_wrap(wrap_policy(wrapper, params))
    ok(run)
    assert run.stdout.count("graph-add vec_add via cuGraphAddKernelNode_v2 -> 0") == 2
    assert "graph-launch nodes=2 via cuGraphLaunch -> 0" in run.stdout
    assert re.search(r"^fake: vec_add launches=8 graph=2$", run.stdout, re.M)
    # THEN each node was given the wrapped kernel with the program's arguments and the launch
    # argument (64 blocks of 128 threads; sm_share launches min(one wave, 64) of them)
    nodes = node_seen(run.stdout)
    assert len(nodes) == 2
    for seen in nodes:
        assert (seen["code"], seen["original"], seen["clc_arg"]) == ("cubin", 0, 1), seen
        assert seen["own_args"] == "same" and seen["vgrid"] == (64, 1, 1), seen
        assert seen["grid"] == expected_grid(params, (64, 1, 1), 128, 0), seen
    if wrapper == "sm_share":
        # AND, as its wrapper uses its slot, each node has a graph slot of its own, in the
        # graph lap (the kernel's last block zeroes it for the next replay)
        offsets = [s["slot"] - s["slot_base"] for s in nodes]
        assert offsets == [RING, RING + SLOT_BYTES], offsets
        assert [s["seq"] for s in nodes] == [abi.GRAPH_SEQ] * 2
    else:
        assert all(s["slot"] - s["slot_base"] < RING for s in nodes)
    assert not messages(run, "a wrapped kernel was put in a CUDA graph")


@pytest.mark.parametrize("wrapper,params", [("sm_share", {"share": 0.25}), ("deadline", {"ms": 5})])
def test_launches_captured_into_a_graph_get_slots_of_their_own(run_wrap, wrapper, params):
    # GIVEN vec_add wrapped with a wrapper that keeps state in its launch's slot
    # WHEN the program captures a stream into a CUDA graph (global mode), and vec_add is first
    # seen there: launched twice while capturing, then once more after the capture ended
    run = run_wrap(wrap_policy(wrapper, params), args=["capture"])
    ok(run)
    first, second, after = launches(run.stdout)
    # THEN clc built and loaded the wrapped kernel without breaking the program's capture
    assert "capture-begin -> 0" in run.stdout
    assert "capture-end -> 0" in run.stdout, run.stdout
    assert "capture-unsafe-calls 0" in run.stdout
    for launch in (first, second, after):
        assert launch["rc"] == 0 and launch["seen"]["original"] == 0
        assert launch["seen"]["code"] == "cubin" and launch["seen"]["clc_arg"] == 1
    # AND each captured launch has a slot of its own past the ring (a replay keeps its slot),
    # the graph lap, zeroed in the stream before it (the program had set the second one's to
    # 0xff)
    slots = {}
    for name, launch in (("first", first), ("second", second), ("after", after)):
        seen = launch["seen"]
        assert seen["slot_alloc"] == RING + abi.GRAPH_SLOTS * SLOT_BYTES, seen
        slots[name] = seen["slot"] - seen["slot_base"]
    assert slots["first"] == RING and slots["second"] == RING + SLOT_BYTES
    assert first["seen"]["seq"] == second["seen"]["seq"] == abi.GRAPH_SEQ
    assert first["seen"]["slot_zero"] == second["seen"]["slot_zero"] == 1
    # AND the launch after the capture takes the ring's next slot, as any other
    assert slots["after"] < RING


def test_a_captured_block_count_launch_keeps_the_ring(run_wrap):
    # GIVEN vec_add under block_count, which never reads its slot
    run = run_wrap(wrap_policy("block_count"), args=["capture"])
    ok(run)
    assert "capture-end -> 0" in run.stdout and "capture-unsafe-calls 0" in run.stdout
    # THEN its captured launches take ring slots (no graph slot, no memset in the graph)
    for launch in launches(run.stdout):
        seen = launch["seen"]
        assert seen["code"] == "cubin" and seen["slot"] - seen["slot_base"] < RING, seen


def test_a_reset_context_gets_its_wrapped_kernels_set_up_again(run_wrap):
    # GIVEN vec_add wrapped (sm_share: it uses its slot ring)
    # WHEN it runs twice, the primary context is reset (cudaDeviceReset) and retained again (the
    # driver hands back the same CUcontext), and it runs twice more
    run = run_wrap(wrap_policy("sm_share", {"share": 0.25}), args=["reset"])
    ok(run)
    assert "reset -> 0" in run.stdout and "same-context 1" in run.stdout
    before1, before2, after1, after2 = launches(run.stdout)
    # THEN every launch ran the wrapped kernel
    for launch in (before1, before2, after1, after2):
        seen = launch["seen"]
        assert launch["rc"] == 0 and (seen["code"], seen["clc_arg"]) == ("cubin", 1), launch
    # AND the new context has a slot ring of its own (the old one died with its context),
    # the wrapped library was loaded once for both (it is context-independent)
    assert before1["seen"]["slot_base"] == before2["seen"]["slot_base"]
    assert after1["seen"]["slot_base"] == after2["seen"]["slot_base"]
    assert after1["seen"]["slot_base"] != before1["seen"]["slot_base"]
    (libs,) = messages(run, "wrap libraries: ")
    assert libs.startswith("wrap libraries: 1 cuLibraryLoadData call, 2 contexts"), libs
    assert not messages(run, "the driver refused a wrapped kernel")


# ---- a Python hook that answers clc.wrap() ---------------------------------------------------

def test_a_hook_answering_clc_wrap_wraps_the_kernel(clc_run, native, shared_cache, tmp_path):
    # GIVEN a hook file that wraps scale (sm_share, 10 SMs) and has no opinion on the rest
    hooks = tmp_path / "wrap_hooks.py"
    hooks.write_text("import clc\n\n"
                     "@clc.on_launch(kernel=\"scale\")\n"
                     "def wrap_scale(launch):\n"
                     "    return clc.wrap(\"sm_share\", sms=10, mechanism=\"splice\")\n")
    # WHEN prog_wrap runs with it and no policy
    run = clc_run(None, [native["prog_wrap"], "library"], options=["--hooks", str(hooks)],
                  env={"CLC_CACHE_DIR": str(shared_cache)})
    ok(run)
    # THEN scale's launches ran wrapped with the capped grid, and vec_add's ran unwrapped
    for launch in launches(run.stdout):
        seen, arg = launch["seen"], launch["arg"]
        if launch["kernel"] == "scale":
            assert (seen["original"], seen["code"], seen["clc_arg"]) == (0, "cubin", 1), launch
            assert seen["grid"] == expected_grid({"sms": 10}, arg["grid"], arg["block"][0]
                                                 * arg["block"][1] * arg["block"][2],
                                                 arg["smem"])
        elif launch["kernel"] == "vec_add":
            assert seen["original"] == 1, launch


def test_a_wrap_rule_that_wraps_nothing_says_nothing_of_wrap_libraries(native, clc_run):
    # GIVEN a wrap rule that no kernel of the program matches
    policy = """\
version: 1
rules:
  - name: count-nothing
    match: {kernel: "*nomatch*"}
    action: wrap
    wrapper: block_count
"""
    run = clc_run(policy, [native["prog_params"], "3"])
    assert run.proc.returncode == 0, run.stderr
    # THEN nothing was wrapped, and the capture says nothing of wrapped libraries
    assert messages(run, "wrap libraries") == []
    assert "wrap libraries" not in run.stderr
