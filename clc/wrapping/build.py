# SPDX-License-Identifier: Apache-2.0
"""The wrap pipeline: a kernel's PTX spliced (clc.wrapping.splice), the wrapper's device code
compiled by NVRTC, both linked by nvJitLink into a cubin. Needs no GPU.

    wrapper = wrapper_spec("sm_share", {"share": 0.25})   # or the path of a .cu policy
    built = build(ptx_text, "_Z6vecAddPKfS0_Pfi", wrapper, arch=90)
    built.cubin, built.looped, built.build_ms

Built-in wrappers (their device code is clc/wrapping/device/runtime.cu, configured by -D):
- sm_share (`share: 0<x<=1` or `sms: N`): the body loops over virtual blocks claimed from
  the launch's counter, by the blocks on ceil(share x SMs) of the SMs (or N): the shim
  launches one wave (SMs x blocks-per-SM), and blocks the hardware placed on other SMs leave
  (see clc/wrapping/device/runtime.cu). A kernel whose body may not loop cannot be wrapped.
- block_count: counts the virtual blocks and threads that ran (clc_stats, read at exit).
- deadline (`ms: N`): virtual blocks that would start more than N ms after the launch's first
  block are skipped and counted.
- a user policy, `wrapper: path/to/policy.cu`: either the nvJitLink CLC demo interface
  (extern "C" Policy_init(void *state), Policy_should_try_steal(void *state, int block)) or
  clc's own (extern "C" clc_policy_init(void *state), clc_policy_begin(void *state,
  unsigned long long vblock), clc_policy_end(...); any of the three). Its `params` are given to
  it as -D CLC_PARAM_<NAME>=<value>. The launch keeps its grid; a block claims more virtual
  blocks only when the body may loop and the policy says so.
A compile or link error raises WrapBuildError with the NVRTC/nvJitLink log.
"""

import dataclasses
import pathlib
import re
import struct
import threading
import time

from clc import abi
from clc.wrapping.fatbin import _Elf, cubin_kernels
from clc.wrapping.spec import BUILTIN_WRAPPERS, INSPECTED_WRAPPERS, Wrapper, wrapper_spec
from clc.wrapping.splice import Unwrappable, check, parsed, ptx_text, single_entry, splice_checked

__all__ = ["WrapBuildError", "Wrapper", "Built", "BUILTIN_WRAPPERS", "INSPECTED_WRAPPERS",
           "wrapper_spec", "check_wrap", "build", "toolchain_versions", "cubin_resources",
           "RUNTIME_SOURCE"]

RUNTIME_SOURCE = pathlib.Path(__file__).resolve().parent / "device" / "runtime.cu"
_DEMO_FUNCTIONS = ("Policy_init", "Policy_should_try_steal")
_HOOK_FUNCTIONS = ("clc_policy_init", "clc_policy_begin", "clc_policy_end")


class WrapBuildError(Exception):
    """A wrapper that does not compile or a kernel that does not link, with the tool's log."""


def check_wrap(module, kernel, wrapper):
    """Whether `wrapper` (a Wrapper) can wrap entry `kernel` of a parsed PTX module
    (clc.wrapping.splice.parsed): a clc.wrapping.splice.Checked saying whether its body would
    loop, or Unwrappable with the reason. Every refusal that build() makes is made here
    (build() asks this before it splices), and `clc inspect` asks this for each built-in
    wrapper, so that what inspect says, what `clc wrap` does and what clc-run does agree.
    Changes nothing."""
    checked = check(module, kernel, loop=wrapper.loop != "never")
    if wrapper.loop == "required" and not checked.looped:
        raise Unwrappable(f"{wrapper.name} runs the body in a loop, and this kernel's may not "
                          f"loop: {checked.verdict.reason}")
    return checked


@dataclasses.dataclass
class Built:
    cubin: bytes
    kernel: str
    looped: bool
    reason: str
    params: int          # the kernel's own parameter count
    arch: int
    key: str
    build_ms: float
    wrapper: Wrapper


_lock = threading.Lock()
_compiled = {}           # (source, options) -> PTX bytes


_load_lock = threading.Lock()
_loaded = []  # [(nvrtc, nvjitlink)] once both libraries are loaded


def _toolchain():
    """cuda.bindings' NVRTC and nvJitLink modules, their libraries loaded by one thread at a
    time: the bindings load them at first use, and two threads doing that at once (the
    warm-up and a first build) were seen to crash inside nvJitLink."""
    if _loaded:
        return _loaded[0]
    with _load_lock:
        if not _loaded:
            try:
                from cuda.bindings import nvrtc
            except ImportError as e:
                raise WrapBuildError("wrapping needs cuda-python's NVRTC (pip install "
                                     "'clc-launch-control[wrap]': cuda-bindings and "
                                     f"nvidia-cuda-nvrtc): {e}") from None
            try:
                from cuda.bindings import nvjitlink
            except ImportError as e:
                raise WrapBuildError("wrapping needs cuda-python's nvJitLink (pip install "
                                     "'clc-launch-control[wrap]': cuda-bindings and "
                                     f"nvidia-nvjitlink): {e}") from None
            nvrtc.nvrtcVersion()
            try:
                nvjitlink.version()
            except AttributeError:  # older bindings: the first create() loads it
                pass
            _loaded.append((nvrtc, nvjitlink))
    return _loaded[0]


def _nvrtc():
    return _toolchain()[0]


def _nvjitlink():
    return _toolchain()[1]


def toolchain_versions():
    """(NVRTC version, nvJitLink version) as strings, for cache keys and reports."""
    nvrtc = _nvrtc()
    _, major, minor = nvrtc.nvrtcVersion()
    try:
        link = _nvjitlink().version()
        link = f"{link[0]}.{link[1]}" if isinstance(link, tuple) else str(link)
    except Exception:  # older bindings have no version(): the NVRTC one stands for both
        link = f"{major}.{minor}"
    return f"{major}.{minor}", link


def compile_cuda(source, name, arch, options=(), cache=None):
    """PTX (bytes) of CUDA C `source`, relocatable (-rdc), for compute_`arch`: kept in memory
    for the process and, with `cache` (a wrapcache.DiskCache), on disk for later processes, so
    that NVRTC (whose first call in a process costs a quarter of a second) runs once per
    source, options and NVRTC version."""
    opts = (f"--gpu-architecture=compute_{arch}", "-rdc=true", "-std=c++17") + tuple(options)
    key = (source, name, opts)
    with _lock:
        hit = _compiled.get(key)
    if hit is not None:
        return hit
    nvrtc = _nvrtc()
    data = source.encode() if isinstance(source, str) else source
    disk_key = None
    if cache is not None:
        from clc.wrapping.cache import cache_key
        disk_key = cache_key("nvrtc-ptx", data, name, "\0".join(opts), toolchain_versions()[0])
        ptx = cache.get(disk_key)
        if ptx is not None:
            with _lock:
                _compiled[key] = ptx
            return ptx
    err, prog = nvrtc.nvrtcCreateProgram(data, name.encode(), 0, [], [])
    _nvrtc_check(nvrtc, err, "nvrtcCreateProgram", name)
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise WrapBuildError(f"NVRTC could not compile {name}:\n"
                                 f"{log.rstrip(bytes(1)).decode(errors='replace').strip()}")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _nvrtc_check(nvrtc, err, "nvrtcGetPTXSize", name)
        ptx = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, ptx)
        _nvrtc_check(nvrtc, err, "nvrtcGetPTX", name)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    ptx = ptx.rstrip(b"\0")
    with _lock:
        _compiled[key] = ptx
    if disk_key is not None:
        cache.put(disk_key, ptx, {"kind": "ptx", "source": name, "arch": f"compute_{arch}"})
    return ptx


_WARM_PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n"
             b".visible .entry clc_warm()\n{\n\tret;\n}\n")


def warm_up():
    """Load and start NVRTC and nvJitLink (a trivial compile and link): their first call in a
    process costs a few hundred milliseconds, which a thread started early hides behind the
    program's own start. Never raises."""
    try:
        nvrtc = _nvrtc()
        err, prog = nvrtc.nvrtcCreateProgram(b"__global__ void clc_warm() {}", b"warm.cu", 0,
                                             [], [])
        if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_90"])
            nvrtc.nvrtcDestroyProgram(prog)
        link([("warm.ptx", _WARM_PTX)], 90, "the warm-up kernel")
    except Exception:  # the real build reports whatever is wrong
        pass


def _nvrtc_check(nvrtc, err, what, name):
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise WrapBuildError(f"{what} failed for {name}: {err}")


def link(ptx_inputs, arch, what="the wrapped kernel", max_registers=None):
    """A cubin for sm_`arch` linked by nvJitLink from [(name, PTX bytes), ...]."""
    nvjitlink = _nvjitlink()
    options = [f"-arch=sm_{arch}"]
    if max_registers:
        options.append(f"-maxrregcount={max_registers}")
    handle = nvjitlink.create(len(options), options)
    try:
        try:
            for name, ptx in ptx_inputs:
                data = ptx if isinstance(ptx, bytes) else ptx.encode()
                nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), name)
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as e:
            size = nvjitlink.get_error_log_size(handle)
            log = bytearray(size)
            nvjitlink.get_error_log(handle, log)
            raise WrapBuildError(f"nvJitLink could not link {what} for sm_{arch} ({e}):\n"
                                 f"{bytes(log).rstrip(bytes(1)).decode(errors='replace')}"
                                 ) from None
        size = nvjitlink.get_linked_cubin_size(handle)
        cubin = bytearray(size)
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        nvjitlink.destroy(handle)


def _policy_interface(ptx):
    text = ptx.decode(errors="replace")
    defined = set(re.findall(r"^\s*\.visible\s+\.func\s+(?:\([^)]*\)\s*)?(\w+)", text, re.M))
    demo = [f for f in _DEMO_FUNCTIONS if f in defined]
    hooks = [f for f in _HOOK_FUNCTIONS if f in defined]
    return demo, hooks


def runtime_inputs(wrapper, arch, looped=False, cache=None):
    """[(name, PTX)] of the wrapper's device code (runtime.cu, and a user policy's file), for a
    kernel spliced with the claim loop (looped) or 1:1; NVRTC's output kept in `cache` (a
    DiskCache) when given."""
    runtime = RUNTIME_SOURCE.read_text()
    mode = abi.DEVICE_DEFINES + (("-DCLC_LOOPED",) if looped else
                                 ("-DCLC_ENTER",) if wrapper.enter else ())
    if wrapper.source is None:
        return [("clc_runtime.ptx", compile_cuda(runtime, "clc_runtime.cu", arch,
                                                 wrapper.defines + mode, cache))]
    policy = compile_cuda(wrapper.source, pathlib.Path(wrapper.name).name, arch, wrapper.defines,
                          cache)
    demo, hooks = _policy_interface(policy)
    if demo and hooks:
        raise WrapBuildError(f"{wrapper.name} defines both the demo interface ({', '.join(demo)}) "
                             f"and clc's ({', '.join(hooks)}): use one")
    if demo and len(demo) != len(_DEMO_FUNCTIONS):
        raise WrapBuildError(f"{wrapper.name} defines {demo[0]} but not "
                             f"{(set(_DEMO_FUNCTIONS) - set(demo)).pop()}: the demo interface is "
                             'extern "C" __device__ void Policy_init(void *state) and bool '
                             "Policy_should_try_steal(void *state, int current_block)")
    if not demo and not hooks:
        raise WrapBuildError(
            f'{wrapper.name} defines no policy function: expected extern "C" __device__ '
            "Policy_init and Policy_should_try_steal (the nvJitLink CLC demo interface), or any "
            "of clc_policy_init, clc_policy_begin, clc_policy_end (clc's)")
    defines = list(wrapper.defines + mode)
    if demo:
        defines.append("-DCLC_POLICY_DEMO")
    else:
        defines.append("-DCLC_POLICY_HOOKS")
        # The hooks the policy leaves out do nothing.
        for f in _HOOK_FUNCTIONS:
            if f not in hooks:
                extra = "" if f == "clc_policy_init" else ", unsigned long long"
                runtime += f'extern "C" __device__ void {f}(void *s{extra}) {{}}\n'
    return [("clc_runtime.ptx", compile_cuda(runtime, "clc_runtime.cu", arch, tuple(defines),
                                             cache)),
            (pathlib.Path(wrapper.name).name + ".ptx", policy)]


_sources = []


def _pipeline_sources():
    """The wrapper runtime and the code that splices and prints PTX: a clc whose splice
    changed must not take a cubin that an older one built from the disk cache."""
    if not _sources:
        here = pathlib.Path(__file__).resolve().parent
        _sources.append(b"".join(p.read_bytes() for p in (
            RUNTIME_SOURCE, here / "splice.py", here / "ptx.py", here.parent / "abi.py")))
    return _sources[0]


def build_key(ptx, kernel, wrapper, arch, registers=None):
    """The cache key of a build: everything its cubin depends on (`registers`: the original's
    register count when the caller knows it, see build())."""
    from clc.wrapping.cache import cache_key
    return cache_key(ptx, kernel, wrapper.key_text, _pipeline_sources(), str(arch),
                     *toolchain_versions(), str(registers))


def build(ptx, kernel, wrapper, arch, key=None, cache=None, registers=None):
    """Splice `kernel` of `ptx`, link it with `wrapper`'s device code for sm_`arch`: a Built.
    Unwrappable when check_wrap refuses (the splice's refusals, a wrapper that needs a loop the
    body cannot take, PTX that does not parse).
    `key`: its build_key, when the caller has it already; `cache`: a DiskCache for NVRTC's
    output; `registers`: the original's register count as it runs (the driver's
    CU_FUNC_ATTRIBUTE_NUM_REGS), else the original is linked alone to count them."""
    start = time.perf_counter()
    text = ptx_text(ptx)
    spliced = splice_checked(check_wrap(parsed(text), kernel, wrapper), enter=wrapper.enter)
    inputs = [("kernel.ptx", spliced.ptx)] + runtime_inputs(wrapper, arch, spliced.looped, cache)
    limit = None
    if spliced.looped or wrapper.enter:
        # The runtime's claim function needs more registers than a small kernel, and the
        # kernel is allocated what its hungriest function needs: hold the wrapped kernel to
        # the original's register class (32, or the original's rounded up to 8) so that as
        # many of its blocks fit on an SM. ptxas then uses fewer, not spills (checked on the
        # zoo: stack stays 0).
        own = registers or cubin_resources(link([("original.ptx", single_entry(text, kernel))],
                                                arch, kernel)).get(kernel, {}).get("registers")
        limit = max(32, -(-(own or 0) // 8) * 8)
    cubin = link(inputs, arch, f"{kernel} with {wrapper.name}", limit)
    return Built(cubin, kernel, spliced.looped, spliced.reason, spliced.params, arch,
                 key or build_key(text, kernel, wrapper, arch, registers),
                 (time.perf_counter() - start) * 1e3,
                 wrapper)


def cubin_resources(cubin):
    """{kernel: {"registers": n, "shared": static bytes, "stack": bytes}} of a cubin: registers
    and stack from the EIATTR_REGCOUNT / EIATTR_MAX_STACK_SIZE attributes of .nv.info (keyed by
    symbol index), static shared memory from the .nv.shared.<kernel> sections."""
    elf = _Elf(cubin)
    symbols = []
    for symtab in elf.sections:
        if symtab.type == 2 and 0 < symtab.link < len(elf.sections):
            syms = elf.section_data(symtab)
            strtab = elf.section_data(elf.sections[symtab.link])
            for at in range(0, len(syms) - 23, symtab.entsize or 24):
                (name,) = struct.unpack_from("<I", syms, at)
                symbols.append(strtab[name:strtab.index(b"\0", name)].decode(errors="replace"))
    kernels = set(cubin_kernels(cubin))
    out = {k: {"registers": None, "shared": 0, "stack": 0} for k in kernels}
    for section in elf.sections:
        if section.name == ".nv.info" or section.name.startswith(".nv.info."):
            data = elf.section_data(section)
            at = 0
            while at + 4 <= len(data):
                fmt, attr, size = struct.unpack_from("<BBH", data, at)
                if fmt != 0x04:          # EIFMT_NVAL/BVAL/HVAL: 4 bytes in all
                    at += 4
                    continue
                payload = data[at + 4:at + 4 + size]
                at += 4 + size
                field = {0x2F: "registers", 0x23: "stack"}.get(attr)
                if field and len(payload) >= 8:
                    index, value = struct.unpack_from("<II", payload)
                    if index < len(symbols) and symbols[index] in out:
                        out[symbols[index]][field] = value
        elif section.name.startswith(".nv.shared.") and section.name[11:] in out:
            out[section.name[11:]]["shared"] = section.size
    return out
