# SPDX-License-Identifier: Apache-2.0
"""The engine: runs inside the traced program and answers the shim's two questions.

"First sight of kernel K in context C": match the policy (given by clc-run as JSON in
CLC_POLICY) and return the decision that the C side caches for every later launch. "A module
or library was loaded": remember where its image is (the wrap pipeline will need it).

Only the standard library may be imported here: the program's Python may lack clc's
dependencies. Nothing here may raise into the shim: a failure is reported once and the shim
falls back to the policy's on_error.
"""

import os
import sys
import threading
import traceback

from clc import abi
from clc.demangle import demangle
from clc.policy import KernelInfo, Policy

__all__ = ["Engine", "bridge_decide", "bridge_module", "process_names"]


def process_names(argv=None, exe=None):
    """The names a policy's `process` glob is tried against: the program as it was started,
    the executable, and for a Python program the script or module it runs."""
    if argv is None:
        try:
            with open("/proc/self/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            argv = list(sys.argv)
    if exe is None:
        try:
            exe = os.readlink("/proc/self/exe")
        except OSError:
            exe = ""
    names = []
    if argv:
        names.append(os.path.basename(argv[0]))
    if exe:
        names.append(os.path.basename(exe))
    if names and names[0].startswith("python"):
        args = iter(argv[1:])
        for arg in args:
            if arg == "-m":
                names.append(next(args, ""))
                break
            if arg == "-c":
                break
            if not arg.startswith("-"):
                names.append(os.path.basename(arg))
                break
    return tuple(dict.fromkeys(n for n in names if n))


class Engine:
    def __init__(self, environ=os.environ):
        if "CLC_POLICY" not in environ:
            raise RuntimeError("CLC_POLICY is not set (run the program under clc-run)")
        self.policy = Policy.from_json(environ["CLC_POLICY"])
        self.tenant = environ.get("CLC_TENANT", "")
        self.process_names = process_names()
        self.modules = {}
        self.verbose = environ.get("CLC_VERBOSE", "0") not in ("", "0")
        self._announced = set()

    def decide(self, mangled, device):
        info = KernelInfo(mangled=mangled, demangled=demangle(mangled), device=device,
                          process_names=self.process_names, tenant=self.tenant)
        decision = self.policy.decide(info)
        self._announce_denies(info, decision)
        if self.verbose:
            sys.stderr.write(f"clc: first sight of {info.demangled} on device {device}: "
                             f"{self._describe(decision)}\n")
        return decision

    def _rule_name(self, rule):
        return self.policy.rules[rule].name if rule >= 0 else (
            "default" if rule == abi.RULE_DEFAULT else "on_error")

    def _describe(self, decision):
        def one(outcome):
            flags = [name for bit, name in ((abi.FLAG_RECORD, "record"), (abi.FLAG_TIME, "time"))
                     if outcome.flags & bit]
            return (f"{abi.ACTION_NAMES[outcome.action]}"
                    + (f" ({', '.join(flags)})" if flags else "")
                    + f" by {self._rule_name(outcome.rule)}")
        shaped = [f"{one(c.outcome)} when grid_blocks in {list(c.grid_blocks)}, block_threads "
                  f"in {list(c.block_threads)}, shared_mem in {list(c.shared_mem)}"
                  for c in decision.clauses]
        return "; ".join(shaped + [("else " if shaped else "") + one(decision.fallback)])

    def _announce_denies(self, info, decision):
        """Say once per kernel, on the program's stderr, which rule refuses its launches."""
        outcomes = [c.outcome for c in decision.clauses] + [decision.fallback]
        for outcome in outcomes:
            if outcome.action != abi.ACTION_DENY or (info.mangled, outcome.rule) in self._announced:
                continue
            self._announced.add((info.mangled, outcome.rule))
            if outcome.rule >= 0:
                rule = self.policy.rules[outcome.rule]
                why = f"rule '{rule.name}'" + (f": {rule.message}" if rule.message else "")
            else:
                why = f"the policy's {self._rule_name(outcome.rule)}"
            sys.stderr.write(f"clc: launches of {info.demangled} are denied by {why}\n")

    def module_event(self, api, handle, image_kind, image_ptr, image_size, preserved, path):
        if abi.LOAD_NAMES.get(api, "").endswith("Unload"):
            self.modules.pop(handle, None)
            return
        self.modules[handle] = {"api": api, "image": image_kind, "ptr": image_ptr,
                                "size": image_size, "preserved": bool(preserved), "path": path}


_engine = None
_engine_lock = threading.Lock()
_reported = set()


def _get():
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                _engine = Engine()
    return _engine


def _report_once(what):
    key = what.strip().splitlines()[-1] if what.strip() else ""
    if key in _reported:
        return
    _reported.add(key)
    sys.stderr.write(f"clc: engine error, launches get on_error: {what}\n")


def _fill_outcome(dst, outcome):
    dst.action = outcome.action
    dst.flags = outcome.flags
    dst.error = outcome.error
    dst.rule = outcome.rule
    dst.replacement = 0


def bridge_decide(ffi, query, out):
    """clc_bridge_decide: 0 with `out` filled, or -1 for "no opinion" (the shim's on_error)."""
    try:
        name = ffi.string(query.name).decode("utf-8", "replace")
        decision = _get().decide(name, query.device)
        if len(decision.clauses) > abi.MAX_CLAUSES:
            raise RuntimeError(f"{len(decision.clauses)} shape clauses for {name}, "
                               f"at most {abi.MAX_CLAUSES} fit")
        out.n_clauses = len(decision.clauses)
        for i, clause in enumerate(decision.clauses):
            dst = out.clauses[i]
            dst.grid_blocks.lo, dst.grid_blocks.hi = clause.grid_blocks
            dst.block_threads.lo, dst.block_threads.hi = clause.block_threads
            dst.shared_mem.lo, dst.shared_mem.hi = clause.shared_mem
            _fill_outcome(dst.outcome, clause.outcome)
        _fill_outcome(out.fallback, decision.fallback)
        return 0
    except Exception:
        _report_once(traceback.format_exc(limit=4))
        return -1


def bridge_module(ffi, event):
    try:
        path = ffi.string(event.path).decode("utf-8", "replace") if event.path else None
        _get().module_event(event.api, event.handle, event.image_kind, event.image_ptr,
                            event.image_size, event.preserved, path)
        return 0
    except Exception:
        _report_once(traceback.format_exc(limit=4))
        return -1
