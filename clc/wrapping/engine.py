# SPDX-License-Identifier: Apache-2.0
"""Wrapping inside the traced program: from a `wrap` decision to the clc_replacement the shim
launches.

At the first sight of a kernel in a context whose decision wraps it, `WrapEngine.replacement`:
1. finds the kernel's PTX in the image of the load it came from (the driver says which:
   cuKernelGetLibrary, cuFuncGetModule; a kernel whose load it cannot name is not wrapped:
   another load's kernel of the same name may be other code) among the
   images the shim reported loading (fatbin wrapper, fatbin, cubin, PTX; images the program
   may free are copied at load time when the policy wraps), the best PTX entry for the
   device's arch (highest arch <= the device's);
2. gets the linked cubin from the in-memory table, else from the disk cache (the one clc-run
   fixed in the program's sealed settings; $CLC_CACHE_DIR outside clc-run),
   else builds it (clc.wrapping.build.build: splice, NVRTC, nvJitLink) and stores it there;
3. loads it once per process with cuLibraryLoadData (context-independent: every context uses
   the same CUlibrary), takes the CUkernel and this context's CUfunction;
4. gives the context its slot ring (device memory, zeroed on a private stream) once;
5. packs a clc_replacement (clc/abi.py) into memory it keeps for the life of the process and
   returns its address for clc_outcome.replacement.
Unwrappable (no PTX, a kernel the splice refuses) and build or driver failures raise; the
engine turns them into on_unwrappable / on_error and says why once.
At exit, each wrapped library's clc_stats (a __managed__ variable) is read back.
"""

import contextlib
import ctypes
import threading
import time

from clc import abi
from clc.wrapping.fatbin import FatbinError, parse_image
from clc.wrapping.splice import Unwrappable
from clc.wrapping.build import WrapBuildError, build, build_key, warm_up, wrapper_spec
from clc.wrapping.cache import DiskCache, LibraryCache

__all__ = ["WrapEngine", "DriverError", "N_SLOTS"]

N_SLOTS = 16384
_LIBRARY_CACHE_BYTES = 256 << 20

_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
_CU_STREAM_NON_BLOCKING = 1
_CU_STREAM_CAPTURE_MODE_RELAXED = 2
_CU_FUNC_ATTRIBUTE_NUM_REGS = 4
# Function attributes a program sets (cudaFuncSetAttribute) that its launches depend on:
# copied from the original onto the replacement when it is made.
_REPLAYED_ATTRIBUTES = {8: "MAX_DYNAMIC_SHARED_SIZE_BYTES", 9: "PREFERRED_SHARED_MEMORY_CARVEOUT"}


class DriverError(RuntimeError):
    """A driver call of the wrap path failed."""


class _Driver:
    """The few driver functions wrapping needs, through ctypes. Called while the shim's
    recursion guard is up (from a first sight), so its hooks pass them straight through."""

    _SIGNATURES = {
        "cuLibraryLoadData": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_uint],
        "cuLibraryUnload": [ctypes.c_void_p],
        "cuLibraryGetKernel": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                               ctypes.c_char_p],
        "cuLibraryGetManaged": [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                ctypes.c_void_p, ctypes.c_char_p],
        "cuKernelGetFunction": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p],
        "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
        "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
        "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
        "cuMemsetD8Async": [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p],
        "cuStreamCreate": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint],
        "cuStreamSynchronize": [ctypes.c_void_p],
        "cuStreamDestroy_v2": [ctypes.c_void_p],
        "cuCtxSynchronize": [],
        "cuFuncGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p],
        "cuFuncSetAttribute": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
        "cuKernelGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p,
                                 ctypes.c_int],
        # Which load a launched handle came from; a driver without them leaves them None.
        "cuKernelGetLibrary": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p],
        "cuFuncGetModule": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p],
        "cuThreadExchangeStreamCaptureMode": [ctypes.POINTER(ctypes.c_int)],
        "cuLibraryGetModule": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p],
    }
    _OPTIONAL = ("cuKernelGetLibrary", "cuFuncGetModule", "cuThreadExchangeStreamCaptureMode",
                 "cuLibraryGetModule")

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        for name, argtypes in self._SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is None and name in self._OPTIONAL:
                setattr(self, name, None)
                continue
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            setattr(self, name, fn)

    def call(self, name, *args):
        r = getattr(self, name)(*args)
        if r != 0:
            raise DriverError(f"{name} returned CUresult {r}")


class WrapEngine:
    """cache_settings: the disk cache's CLC_CACHE_* settings that clc-run sealed into the
    program (DiskCache.from_settings); None outside clc-run, where the environment says."""

    def __init__(self, say, warm=False, cache_settings=None):
        self._say = say                 # say(level, text)
        self._cache_settings = cache_settings
        self._lock = threading.RLock()
        self._driver = None
        self.images = {}                # handle -> (kind, bytes) of a load
        self._parsed = {}               # handle -> clc.wrapping.fatbin.Image, or the FatbinError
        self._disk = None
        self._disk_failed = False
        self.libraries = LibraryCache(self._load, self._unload, _LIBRARY_CACHE_BYTES)
        self._built = {}                # build key -> (cubin, looped, params) or Unwrappable
        self._slots = {}                # ctx -> device address of its slot ring
        self._rings_made = 0
        self._arch = {}                 # device ordinal -> (arch, SM count)
        self._keep = []                 # clc_replacement buffers: the shim reads them
        self.wrapped = []               # (kernel name, wrapper label, key, library handle)
        self.timings = []               # (kernel name, wrapper label, source, ms)
        self._warm = None
        if warm:
            # Made at the program's first load: the toolchain loads while the program goes
            # on to its first launch. Joined at exit (finish_warm_up): a thread still inside
            # NVRTC or nvJitLink while the process exits crashes it.
            self._warm = threading.Thread(target=warm_up, name="clc-warm-up")
            self._warm.start()

    def finish_warm_up(self):
        """Wait for the warm-up thread, if one runs (before a build, and at exit)."""
        if self._warm is not None:
            self._warm.join()

    # ---- loads ------------------------------------------------------------------------------

    def note_load(self, handle, image_kind, image_ptr, image_size, preserved, path=None):
        """Keep what is needed to read a loaded image's code later: the bytes themselves when
        the program may free them (a copy), else nothing (they are read when needed). A load
        from a file (cuModuleLoad, cuLibraryLoadFromFile) is read now, as the driver just read
        it: the file may change or go before a kernel of it is wrapped."""
        if image_kind == 5 and path:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                self._say(abi.MSG_WARNING, f"cannot read {path}, which the program loaded "
                          f"kernels from: its kernels cannot be wrapped ({e.strerror})")
                return
            with self._lock:
                self.images[handle] = ("file", 0, len(data), data)
                self._parsed.pop(handle, None)
            return
        if not image_ptr or not image_size:
            return
        if image_kind == 1:      # fatbin wrapper: {magic, version, data, filename}
            data = ctypes.c_uint64.from_address(image_ptr + 8).value
            kind, ptr = "fatbin", data
        elif image_kind in (2, 3, 4):
            kind, ptr = {2: "fatbin", 3: "cubin", 4: "ptx"}[image_kind], image_ptr
        else:
            return
        with self._lock:
            if preserved:
                self.images[handle] = (kind, ptr, image_size, None)
            else:
                self.images[handle] = (kind, ptr, image_size,
                                       ctypes.string_at(ptr, image_size))
            self._parsed.pop(handle, None)

    def forget(self, handle):
        with self._lock:
            self.images.pop(handle, None)
            self._parsed.pop(handle, None)

    def _image(self, handle):
        hit = self._parsed.get(handle)
        if hit is None:
            kind, ptr, size, data = self.images[handle]
            if data is None:
                data = ctypes.string_at(ptr, size)
            try:
                hit = parse_image(data)
            except FatbinError as e:
                hit = e
            self._parsed[handle] = hit
        return hit

    def owner(self, original):
        """The load (module or library handle) that the launched handle `original` came from,
        as the driver says (cuKernelGetLibrary for a CUkernel, cuFuncGetModule for a module's
        CUfunction); None when it cannot say."""
        if not original:
            return None
        d = self.driver()
        out = ctypes.c_void_p()
        for fn in (d.cuKernelGetLibrary, d.cuFuncGetModule):
            if fn is not None and fn(ctypes.byref(out), original) == 0 and out.value:
                return self._library_of_module(out.value)
        return None

    def _library_of_module(self, handle):
        """`handle`, or the recorded library whose module it is (a library kernel's function in
        a context names the library's module, cuLibraryGetModule)."""
        d = self.driver()
        with self._lock:
            if handle in self.images or d.cuLibraryGetModule is None:
                return handle
            loads = list(self.images)
        module = ctypes.c_void_p()
        for lib in loads:
            if d.cuLibraryGetModule(ctypes.byref(module), lib) == 0 and module.value == handle:
                return lib
        return handle

    def find_ptx(self, mangled, arch, original=0):
        """(PTX text, where) of `mangled` for sm_`arch`, from the image of the load the launched
        handle `original` came from, and from no other (another image's kernel of the same
        name may be other code); Unwrappable says why there is none."""
        owner = self.owner(original)
        if owner is None:
            raise Unwrappable("the driver cannot say which load its code came from, and the PTX "
                              "of another load's kernel of the same name may be other code")
        with self._lock:
            handles = [owner] if owner in self.images else []
        sass_only = None
        for handle in handles:
            image = self._image(handle)
            try:
                if isinstance(image, FatbinError):
                    # An image refused whole (damaged, or claiming more than clc decompresses
                    # from one image) says why, rather than "not in the image".
                    raise image
                defines = [e for e in image.entries if mangled in e.kernels()]
                ptx = [e for e in defines
                       if e.kind == "ptx" and e.arch <= arch and e.runs_on(arch)]
                if ptx:
                    best = max(ptx, key=lambda e: e.arch)
                    return best.text(), f"{image.kind} {best.arch_name}"
            except FatbinError as e:
                raise Unwrappable(f"the image it was loaded from cannot be read: {e}") from None
            if not defines:
                continue
            sass_only = ", ".join(sorted({e.arch_name for e in defines}))
        if sass_only:
            raise Unwrappable(f"no PTX for sm_{arch}: its image has only {sass_only}, and "
                              "wrapping rebuilds a kernel from its PTX")
        raise Unwrappable("its code is not in the image of the load it came from, or clc did not "
                          "see that load (loads made before "
                          "clc started, or from a file it could not read)")

    # ---- building ---------------------------------------------------------------------------

    def _cache(self):
        if self._disk is None and not self._disk_failed:
            def warn(text):
                self._say(abi.MSG_WARNING, text)

            try:
                if self._cache_settings is None:
                    self._disk = DiskCache(warn=warn)
                else:
                    self._disk = DiskCache.from_settings(self._cache_settings, warn=warn)
            except Exception as e:
                self._disk_failed = True
                self._say(abi.MSG_WARNING, f"the wrapped-kernel disk cache is off: {e}")
        return self._disk

    def cubin(self, ptx, mangled, spec, arch, name="", registers=None):
        """(cubin, looped, params, key): from memory, the disk cache, or built now;
        `registers`: the original's, when the driver gave them."""
        self.finish_warm_up()  # the toolchain is the warm-up thread's until it is done
        key = build_key(ptx, mangled, spec, arch, registers)
        with self._lock:
            hit = self._built.get(key)
        if isinstance(hit, Unwrappable):
            raise hit
        if hit is not None:
            return hit + (key,)
        start = time.perf_counter()
        disk = self._cache()
        entry = disk.get_entry(key) if disk is not None else None
        if entry is not None:
            cubin, meta = entry
            hit = (cubin, bool(meta.get("looped")), int(meta.get("params", 0)))
            source = "disk cache"
        else:
            try:
                built = build(ptx, mangled, spec, arch, key, disk, registers)
            except Unwrappable as e:
                with self._lock:
                    self._built[key] = e
                raise
            hit = (built.cubin, built.looped, built.params)
            source = "built"
            if disk is not None:
                disk.put(key, built.cubin, {"kernel": mangled, "wrapper": spec.name,
                                            "arch": f"sm_{arch}", "looped": built.looped,
                                            "params": built.params,
                                            "build_ms": round(built.build_ms, 1)})
        with self._lock:
            self._built[key] = hit
            self.timings.append((name or mangled, spec.name, source,
                                 (time.perf_counter() - start) * 1e3))
        return hit + (key,)

    # ---- the driver side ----------------------------------------------------------------------

    def driver(self):
        if self._driver is None:
            self._driver = _Driver()
        return self._driver

    def _load(self, key, data):
        lib = ctypes.c_void_p()
        self.driver().call("cuLibraryLoadData", ctypes.byref(lib), data, None, None, 0, None,
                           None, 0)
        return lib.value

    def _unload(self, handle):
        self.driver().call("cuLibraryUnload", handle)

    def device_arch(self, ordinal):
        hit = self._arch.get(ordinal)
        if hit is None:
            d = self.driver()
            dev, major, minor, sms = (ctypes.c_int() for _ in range(4))
            d.call("cuDeviceGet", ctypes.byref(dev), ordinal)
            d.call("cuDeviceGetAttribute", ctypes.byref(major),
                   _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            d.call("cuDeviceGetAttribute", ctypes.byref(minor),
                   _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
            d.call("cuDeviceGetAttribute", ctypes.byref(sms),
                   _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
            hit = self._arch[ordinal] = (major.value * 10 + minor.value, sms.value)
        return hit

    def slots(self, ctx):
        """The context's slot ring, followed by its graph slots (abi.GRAPH_SLOTS), and their
        two cursors (one pair for all the context's wrapped kernels, so that no two launches
        take the same slot in one lap), made (and zeroed, waited for) at its first wrapped
        kernel. Called with the context current."""
        with self._lock:
            ring = self._slots.get(ctx)
            if ring is None:
                d = self.driver()
                ptr, stream = ctypes.c_uint64(), ctypes.c_void_p()
                size = (N_SLOTS + abi.GRAPH_SLOTS) * abi.SLOT_BYTES
                d.call("cuMemAlloc_v2", ctypes.byref(ptr), size)
                d.call("cuStreamCreate", ctypes.byref(stream), _CU_STREAM_NON_BLOCKING)
                try:
                    d.call("cuMemsetD8Async", ptr.value, 0, size, stream)
                    d.call("cuStreamSynchronize", stream)
                finally:
                    d.cuStreamDestroy_v2(stream)
                cursor = (ctypes.c_uint64 * 2)()   # the ring's and the graph slots' (the
                # shim's, written atomically)
                ring = self._slots[ctx] = (ptr.value, cursor)
                self._rings_made += 1
        return ring

    def _attribute(self, original, attribute, dev):
        """An attribute of the program's kernel (a CUkernel or a CUfunction) on CUdevice
        `dev`, or None."""
        d = self.driver()
        value = ctypes.c_int()
        if d.cuKernelGetAttribute(ctypes.byref(value), attribute, original, dev) == 0 or \
                d.cuFuncGetAttribute(ctypes.byref(value), attribute, original) == 0:
            return value.value
        return None

    def replay_attributes(self, original, function, dev):
        """Copy the attributes in _REPLAYED_ATTRIBUTES from the program's kernel (a CUkernel or
        a CUfunction) onto the wrapped CUfunction; [(name, value)] of those that differ from
        the replacement's own."""
        d = self.driver()
        replayed = []
        for attribute, label in _REPLAYED_ATTRIBUTES.items():
            value, mine = self._attribute(original, attribute, dev), ctypes.c_int()
            if value is None:
                continue
            if d.cuFuncGetAttribute(ctypes.byref(mine), attribute, function) == 0 and \
                    mine.value == value:
                continue
            d.call("cuFuncSetAttribute", function, attribute, value)
            replayed.append((label, value))
        return replayed

    @contextlib.contextmanager
    def relaxed_capture(self):
        """This thread in the relaxed stream-capture mode meanwhile: a kernel first seen while
        the program captures a stream into a CUDA graph (global mode) is wrapped with calls
        (cuMemAlloc, cuLibraryLoadData, a stream synchronize) that would otherwise fail and
        invalidate the program's capture."""
        exchange = self.driver().cuThreadExchangeStreamCaptureMode
        mode = ctypes.c_int(_CU_STREAM_CAPTURE_MODE_RELAXED)
        swapped = exchange is not None and exchange(ctypes.byref(mode)) == 0
        try:
            yield
        finally:
            if swapped:
                exchange(ctypes.byref(mode))

    def replacement(self, **request):
        """The address of a clc_replacement (see _replacement), made in the relaxed
        stream-capture mode."""
        with self.relaxed_capture():
            return self._replacement(**request)

    def _replacement(self, *, mangled, name, ctx, device, spec, layout, original=0):
        """The address of a clc_replacement launching `mangled` wrapped with `spec` in `ctx`
        (current), for a kernel whose parameter layout is `layout` [(offset, size), ...]."""
        arch, sm_count = self.device_arch(device)
        ptx, _ = self.find_ptx(mangled, arch, original)
        # The registers the original runs with (its SASS, or the driver's JIT of its PTX):
        # the wrapped kernel is held to the same register class (wrapbuild.build).
        dev, registers = ctypes.c_int(), None
        if original:
            self.driver().call("cuDeviceGet", ctypes.byref(dev), device)
            registers = self._attribute(original, _CU_FUNC_ATTRIBUTE_NUM_REGS, dev)
        cubin, looped, n_params, key = self.cubin(ptx, mangled, spec, arch, name, registers)
        if layout and len(layout) != n_params:
            raise Unwrappable(f"the driver gives {len(layout)} parameters and the PTX "
                              f"{n_params}: refused rather than guess")
        library = self.libraries.acquire(key, lambda: cubin)
        d = self.driver()
        kernel, function = ctypes.c_void_p(), ctypes.c_void_p()
        d.call("cuLibraryGetKernel", ctypes.byref(kernel), library, mangled.encode())
        d.call("cuKernelGetFunction", ctypes.byref(function), kernel)
        if original:
            self.replay_attributes(original, function.value, dev)
        ring, cursor = self.slots(ctx)
        end = max((o + s for o, s in layout), default=0)
        arg_offset = (end + 7) // 8 * 8 if (layout or not n_params) else 0
        cap_kind, cap_value = abi.CAP_NONE, 0
        if spec.cap is not None:
            kind, value = spec.cap
            cap_kind = abi.CAP_SHARE if kind == "share" else abi.CAP_SMS
            cap_value = round(value * 1_000_000) if kind == "share" else int(value)
        packed = abi.REPLACEMENT.pack(function.value, ring, ctypes.addressof(cursor), arg_offset,
                                      N_SLOTS, n_params,
                                      cap_kind, cap_value, sm_count,
                                      (abi.REPLACE_LOOPED if looped else 0)
                                      | (abi.REPLACE_SLOT if looped or spec.enter else 0),
                                      0, 0, 0, 0)
        buf = ctypes.create_string_buffer(packed, len(packed))
        with self._lock:
            self._keep.append(buf)
            if all(w[2] != key for w in self.wrapped):
                self.wrapped.append((name or mangled, spec, key, library))
        return ctypes.addressof(buf)

    def contexts(self):
        """How many contexts got a slot ring (destroyed ones included)."""
        with self._lock:
            return self._rings_made

    def forget_context(self, ctx):
        """`ctx` was destroyed, and its slot ring with it: a new context at its address gets a
        ring of its own."""
        with self._lock:
            ring = self._slots.pop(ctx, None)
            if ring is not None:
                # its cursors stay allocated: a launch that read a replacement just before the
                # context went may still add to them
                self._keep.append(ring)

    # ---- exit ---------------------------------------------------------------------------------

    def exit_stats(self):
        """[(kernel, wrapper label, {blocks, threads, skipped, max_resident})] read from each
        wrapped library's clc_stats."""
        out = []
        if not self.wrapped:
            return out
        d = self.driver()
        d.cuCtxSynchronize()
        for name, spec, key, library in self.wrapped:
            ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
            if d.cuLibraryGetManaged(ctypes.byref(ptr), ctypes.byref(size), library,
                                     b"clc_stats") != 0 or size.value < abi.STATS.size:
                continue
            fields = abi.STATS.unpack(ctypes.string_at(ptr.value, abi.STATS.size))
            blocks = sum(fields[0:2 * abi.STATS_STRIPES:2])
            threads = sum(fields[1:2 * abi.STATS_STRIPES:2])
            skipped, resident, share_sms = fields[2 * abi.STATS_STRIPES:]
            counts = {"blocks": blocks, "threads": threads, "skipped": skipped,
                      "max_resident": resident}
            if spec.cap is not None:
                counts["share_sms"] = share_sms
            out.append((name, spec, counts))
        return out


def spec_for(request, base_dir=None):
    """The checked Wrapper for a policy's WrapRequest: a .cu policy's from the text read when
    the policy was loaded (request.source), not from its file again."""
    return wrapper_spec(request.wrapper, dict(request.params), base_dir,
                        source=getattr(request, "source", None))


__all__ += ["spec_for", "WrapBuildError"]
