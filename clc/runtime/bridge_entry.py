# SPDX-License-Identifier: Apache-2.0
"""The bridge's entry points, in the traced program's Python: what shim/bridge/bridge.c
(through Python's C API) and the cffi embedding code of shim/bridge/bridge_build.py call by name.
Each turns the shim's C structs into the engine's calls (clc.runtime.engine) and its answers
back into C, and reports its failures once (the shim then applies the policy's on_error)."""

import threading

from clc import abi
from clc.runtime.engine import Engine, flush_std, outcome_with_bytes, report_engine_error

__all__ = ["bridge_decide", "bridge_launch", "bridge_slow", "bridge_exit", "bridge_module"]

_engine = None
_engine_lock = threading.Lock()


def _get():
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                _engine = Engine()
    return _engine


_QUERY_SIZE = abi.KERNEL_QUERY.size
_query_key = abi.KERNEL_QUERY_FIELDS.picker("handle", "ctx").unpack_from


def _fill_outcome(ffi, out, outcome):
    ffi.memmove(out, outcome_with_bytes(outcome)[1], abi.OUTCOME.size)


def bridge_decide(ffi, query, out):
    """clc_bridge_decide: 0 with `out` filled, or -1 for "no opinion" (the shim's on_error)."""
    try:
        name = ffi.string(query.name).decode("utf-8", "replace")
        blob = ffi.buffer(query, _QUERY_SIZE + query.args_size)[:]  # the arguments follow
        n = query.n_params
        layout = [] if not n or not query.layout else list(abi.PARAM_INFO.iter_unpack(
            ffi.buffer(query.layout, n * abi.PARAM_INFO.size)))
        engine = _get()
        if query.question == abi.ASK_PROGRAM:  # no kernel: is the process confined?
            decision, mode = engine.program_decision(query.device), abi.MODE_CACHED
        else:
            kernel = engine.kernel(query.handle, query.ctx, name, query.device, layout,
                                   query.kernel_id)
            decision, mode = engine.first_sight(kernel, blob)
            decision = engine.resolve_decision(kernel, decision)
        if len(decision.clauses) > abi.MAX_CLAUSES:
            raise RuntimeError(f"{len(decision.clauses)} shape clauses for {name}, "
                               f"at most {abi.MAX_CLAUSES} fit")
        out.n_clauses = len(decision.clauses)
        out.mode = mode
        for i, clause in enumerate(decision.clauses):
            dst = out.clauses[i]
            dst.grid_blocks.lo, dst.grid_blocks.hi = clause.grid_blocks
            dst.block_threads.lo, dst.block_threads.hi = clause.block_threads
            dst.shared_mem.lo, dst.shared_mem.hi = clause.shared_mem
            _fill_outcome(ffi, ffi.addressof(dst.outcome), clause.outcome)
        _fill_outcome(ffi, ffi.addressof(out.fallback), decision.fallback)
        return 0
    except BaseException:
        report_engine_error()
        return -1


def bridge_launch(kernel_id, blob):
    """clc_bridge_launch (shim/bridge/bridge.c, through Python's C API), the first time a
    kernel's launch is asked about per shape or at every launch: (the clc_outcome bytes, the
    kernel's dispatcher, whether the bridge times it), which the bridge keeps under the shim's
    kernel id and calls with the query block of each later launch; None for "no opinion" (the
    shim's on_error)."""
    try:
        engine = _engine
        kernel = engine.kernels[_query_key(blob)]
        dispatch = engine.dispatcher(kernel)
        return dispatch(blob), dispatch, engine.timed_by_bridge(kernel_id, kernel, dispatch)
    except BaseException:
        report_engine_error()
        return None


def bridge_slow(kernel_id, ns):
    """The bridge timed a dispatcher of kernel `kernel_id` over SLOW_HOOK_NS."""
    try:
        _engine.slow_dispatch(kernel_id, ns)
    except Exception:
        report_engine_error()


def bridge_exit():
    """clc_bridge_exit, in a C or C++ program only (a Python program's interpreter runs
    Engine.run_exit from atexit, and flushes its own streams when it finalizes): the exit work,
    then Python's stdout and stderr flushed, since that interpreter is never finalized."""
    try:
        if _engine is not None:
            _engine.run_exit()
        return 0
    except BaseException:
        report_engine_error()
        return -1
    finally:
        flush_std()


def bridge_module(ffi, event):
    try:
        path = ffi.string(event.path).decode("utf-8", "replace") if event.path else None
        _get().module_event(event.api, event.handle, event.image_kind, event.image_ptr,
                            event.image_size, event.preserved, path, event.ctx)
        return 0
    except Exception:
        report_engine_error()
        return -1
