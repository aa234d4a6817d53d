# SPDX-License-Identifier: Apache-2.0
"""`clc inspect PATH [--json]`: a CUDA file's kernels, their code, and whether clc can wrap them.

Offline: nothing is loaded or run. Wrapping rebuilds a kernel from its PTX (SASS alone cannot
be rebuilt), judged on its best PTX: the entry of the highest arch, which the newest GPUs JIT.
Each built-in wrapper's verdict is clc.wrapping.build.check_wrap's, the check that `clc wrap` and
clc-run build through, so the three agree: a kernel is "wrappable" when some wrapper can wrap
it, and the wrappers are listed one by one when they disagree (sm_share needs a body that may
loop, block_count and deadline run it once per block). A kernel with PTX is also loopable or
not (clc.wrapping.ptx.loop_verdict: may its body run in a persistent loop).
"""

import errno
import json
import os
import re
import stat
import sys

from clc.capture.reader import file_kind
from clc.demangle import demangle
from clc.errors import EXIT_USAGE, ClcError
from clc.wrapping.fatbin import FatbinError, parse_image
from clc.wrapping.ptx import PtxError, loop_verdict, parse
from clc.wrapping.splice import Unwrappable

__all__ = ["InspectCommand", "inspect_image", "format_text", "read_file", "MAX_INSPECT_BYTES",
           "MAX_PTX_DIGITS", "MAX_PTX_NESTING"]

# The largest file read (it is held in memory whole): room for the largest CUDA libraries, and
# a refusal for what cannot be one (a sparse file of terabytes, a disk image).
MAX_INSPECT_BYTES = 4 << 30
# PTX that clc's PTX reader is not given, said as the kernel's verdict: no PTX number has more
# than 20 digits (a longer run costs the reader time quadratic in its length, and Python's
# int() refuses 4300), and nvcc nests { } blocks a few deep (the reader recurses per level).
MAX_PTX_DIGITS = 100
MAX_PTX_NESTING = 64
_LONG_DIGITS = re.compile(r"[0-9]{%d}" % (MAX_PTX_DIGITS + 1))
_BRACES = re.compile(r"[{}]")


class InspectCommand:
    name = "inspect"
    help = ("list the kernels of an executable, shared library, fatbin, cubin or PTX file: "
            "their SASS architectures, their PTX versions and targets, whether clc can "
            "wrap them (it needs their PTX; each built-in wrapper is listed when they "
            "disagree), and whether a wrapper may loop their body (or why not)")

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("path", metavar="PATH",
                            help="executable, shared library, object, fatbin, cubin or PTX file")
        parser.add_argument("--json", action="store_true",
                            help="print the entries and kernels as JSON")

    def run(self, args):
        data = read_file(args.path)
        try:
            report = inspect_image(parse_image(data), args.path)
        except FatbinError as e:
            raise ClcError(f"{args.path}: {e}", EXIT_USAGE) from None
        if args.json:
            sys.stdout.write(json.dumps(report, indent=2) + "\n")
        else:
            sys.stdout.write(format_text(report))
        return 0


def read_file(path):
    """The bytes of the file at path, or ClcError: only a regular file is read (a FIFO or a
    device could block or never end), and one of at most MAX_INSPECT_BYTES."""
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a socket, or a device with nothing behind it
            raise ClcError(f"{path}: is not a regular file", EXIT_USAGE) from None
        raise ClcError(f"{path}: cannot read it: {e.strerror or e}", EXIT_USAGE) from None
    except ValueError as e:  # a NUL in the path
        raise ClcError(f"{path!r}: cannot read it: {e}", EXIT_USAGE) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ClcError(f"{path}: is {file_kind(st.st_mode)}, not a file clc can inspect",
                           EXIT_USAGE)
        if st.st_size > MAX_INSPECT_BYTES:
            raise ClcError(f"{path}: is {st.st_size} bytes; clc inspects files of at most "
                           f"{MAX_INSPECT_BYTES >> 30} GiB", EXIT_USAGE)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        try:
            # Read to its end: read(n) would first set n bytes aside, whatever the file holds.
            return f.read()
        except OSError as e:
            raise ClcError(f"{path}: cannot read it: {e.strerror or e}", EXIT_USAGE) from None
        except MemoryError:
            raise ClcError(f"{path}: not enough memory to read its {st.st_size} bytes",
                           EXIT_USAGE) from None


JSON_VERSION = 1  # of --json (clc/schemas/inspect-1.schema.json)


def inspect_image(image, path):
    """The JSON-ready report of a parsed image: its entries, and its kernels by name."""
    entries = []
    kernels = {}
    for index, entry in enumerate(image.entries):
        # LTO-IR is NVVM bitcode (and stored with a dictionary clc lacks): its kernels are
        # unknown rather than none, hence None.
        names = entry.kernels() if entry.kind in ("ptx", "cubin") else None
        entries.append({
            "index": index, "kind": entry.kind, "arch": entry.arch, "variant": entry.variant,
            "name": entry.arch_name, "compression": entry.compression, "offset": entry.offset,
            "size": entry.size, "uncompressed_size": entry.uncompressed_size,
            "section": entry.section,
            "code_version": ".".join(map(str, entry.code_version)) if entry.code_version
            else None,
            "ptx_version": entry.ptx_version, "ptx_target": entry.ptx_target,
            "options": entry.options.strip() if entry.options else entry.options,
            "identifier": entry.identifier, "kernels": names,
        })
        for name in names or ():
            k = kernels.setdefault(name, {"name": name, "demangled": demangle(name), "sass": [],
                                          "ptx": [], "sections": [], "_ptx_entries": []})
            if entry.kind == "cubin" and entry.arch_name not in k["sass"]:
                k["sass"].append(entry.arch_name)
            if entry.kind == "ptx":
                ptx = {"version": entry.ptx_version, "target": entry.ptx_target,
                       "name": entry.arch_name}
                if ptx not in k["ptx"]:
                    k["ptx"].append(ptx)
                k["_ptx_entries"].append(entry)
            if entry.section and entry.section not in k["sections"]:
                k["sections"].append(entry.section)
    out = []
    sections = {e.section for e in image.entries}
    modules = {}
    for k in sorted(kernels.values(), key=lambda k: (k["demangled"], k["name"])):
        k["sass"].sort(key=_arch_key)
        k["ptx"].sort(key=lambda p: _arch_key(p["name"]))
        ptx_entries = k.pop("_ptx_entries")
        k["wrappable"], k["summary"] = _wrappability(ptx_entries, k["sass"])
        k["loopable"], k["loop_reason"] = _loopability(k["name"], ptx_entries, modules)
        k["wrappers"] = _wrapper_verdicts(k["name"], ptx_entries, modules, k["summary"])
        if k["wrappable"] and not any(w["wrappable"] for w in k["wrappers"].values()):
            k["wrappable"] = False
            reasons = {w["reason"] for w in k["wrappers"].values()}
            k["summary"] = reasons.pop() if len(reasons) == 1 else "no built-in wrapper can wrap it"
        # With -rdc the device link keeps only the kernels it needs in .nv_fatbin; one found
        # only in the objects' __nv_relfatbin is not in the program's loaded code.
        k["linked"] = not (".nv_fatbin" in sections and ".nv_fatbin" not in k["sections"])
        out.append(k)
    return {"version": JSON_VERSION, "path": str(path), "kind": image.kind,
            "description": image.description, "entries": entries, "kernels": out}


def _arch_key(name):
    """sm_90a -> (90, "a"), for sorting arch names numerically."""
    digits = "".join(c for c in name.split("_", 1)[-1] if c.isdigit())
    return int(digits or 0), name


def _wrappability(ptx_entries, sass):
    """(wrappable, why): from the PTX entries that define a kernel."""
    if not ptx_entries:
        return False, f"no PTX (SASS for {', '.join(sass)} only)" if sass else "no PTX, no SASS"
    names = sorted({e.arch_name for e in ptx_entries}, key=_arch_key)
    generic = [e.arch for e in ptx_entries if not e.variant]
    if generic:
        # The driver JIT-compiles generic PTX for its own arch and every later one.
        where = f"sm_{min(generic)} and newer"
    else:
        where = ", ".join(sorted({f"sm_{e.arch} only" if e.variant == "a"
                                  else f"sm_{e.arch} family" for e in ptx_entries}))
    why = f"PTX for {', '.join(names)} ({where})"
    if any("--compile-only" in (e.options or "") for e in ptx_entries):
        why += ", relocatable (-rdc)"
    return True, why


def _best_module(ptx_entries, modules):
    """(the best PTX entry defining a kernel, its parsed Module or PtxError).

    `modules` caches each entry's parse (or its PtxError): every kernel of an entry shares it.
    """
    # Generic PTX before arch-specific at the same arch: it is what most GPUs would JIT.
    best = max(ptx_entries, key=lambda e: (e.arch, not e.variant))
    if id(best) not in modules:
        text = best.text()
        try:
            modules[id(best)] = _ptx_problem(text) or parse(text)
        except PtxError as e:
            modules[id(best)] = e
    return best, modules[id(best)]


def _ptx_problem(text):
    """A PtxError for PTX that the PTX reader is not given (see MAX_PTX_DIGITS), or None."""
    digits = _LONG_DIGITS.search(text)
    if digits:
        line = text.count("\n", 0, digits.start()) + 1
        return PtxError(f"a number of more than {MAX_PTX_DIGITS} digits (PTX numbers have at "
                        "most 20)", line, digits.start() - text.rfind("\n", 0, digits.start()))
    depth = 0
    for brace in _BRACES.finditer(text):
        depth += 1 if brace.group() == "{" else -1
        if depth > MAX_PTX_NESTING:
            at = brace.start()
            return PtxError(f"{{ }} blocks nested more than {MAX_PTX_NESTING} deep",
                            text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at))
    return None


def _wrapper_verdicts(name, ptx_entries, modules, no_ptx):
    """{wrapper: {"wrappable", "looped", "reason"}} for each built-in wrapper: the verdict of
    clc.wrapping.build.check_wrap, the check `clc wrap` and clc-run build through, on the best PTX
    entry (`no_ptx`: the reason when there is none)."""
    from clc.wrapping.build import INSPECTED_WRAPPERS, check_wrap
    out = {}
    if not ptx_entries:
        return {w.name: {"wrappable": False, "looped": None, "reason": no_ptx}
                for w in INSPECTED_WRAPPERS}
    best, module = _best_module(ptx_entries, modules)
    for wrapper in INSPECTED_WRAPPERS:
        if isinstance(module, PtxError):
            out[wrapper.name] = {"wrappable": False, "looped": None,
                                 "reason": f"its {best.arch_name} PTX does not parse: {module}"}
            continue
        try:
            checked = check_wrap(module, name, wrapper)
        except Unwrappable as e:
            out[wrapper.name] = {"wrappable": False, "looped": None, "reason": str(e)}
        except PtxError as e:  # parsed, but a statement the checks need does not read
            out[wrapper.name] = {"wrappable": False, "looped": None,
                                 "reason": f"its {best.arch_name} PTX does not read: {e}"}
        else:
            out[wrapper.name] = {"wrappable": True, "looped": checked.looped, "reason": None}
    return out


def _loopability(name, ptx_entries, modules):
    """(loopable, why) from the best PTX entry defining the kernel; (None, None) without PTX.

    `modules` caches each entry's parse (or its PtxError): every kernel of an entry shares it.
    """
    if not ptx_entries:
        return None, None
    best, module = _best_module(ptx_entries, modules)
    if isinstance(module, PtxError):
        return False, f"its {best.arch_name} PTX does not parse: {module}"
    entry = module.entries.get(name)
    if entry is None:
        return False, f"no .entry {name} in its {best.arch_name} PTX"
    try:
        verdict = loop_verdict(entry)
    except PtxError as e:  # parsed, but a statement the verdict needs does not read
        return False, f"its {best.arch_name} PTX does not read: {e}"
    return verdict.loopable, verdict.reason


def format_text(report):
    """One header, an entry summary, then one line per kernel."""
    lines = [f"{report['path']}: {report['description']}"]
    counts = {}
    for e in report["entries"]:
        label = {"cubin": "SASS", "ptx": "PTX", "ltoir": "LTO-IR"}.get(e["kind"], e["kind"])
        name = e["name"] + (f" {e['compression']}" if e["compression"] != "none" else "")
        counts.setdefault(label, []).append(name)
    parts = []
    for label, names in counts.items():
        uniq = sorted(set(names), key=_arch_key)
        shown = ", ".join(n if names.count(n) == 1 else f"{n} x{names.count(n)}" for n in uniq)
        parts.append(f"{len(names)} {label} ({shown})")
    lines.append(f"entries: {', '.join(parts) if parts else 'none'}")
    kernels = report["kernels"]
    lines.append(f"kernels: {len(kernels)}")
    for k in kernels:
        name = k["demangled"] if k["demangled"] == k["name"] else f"{k['demangled']} [{k['name']}]"
        sass = ", ".join(k["sass"]) or "none"
        ptx = ", ".join(f"{p['version']} for {p['target']}" for p in k["ptx"]) or "none"
        if k["wrappable"]:
            verdict = "wrappable: " + k["summary"]
            verdict += ", loopable" if k["loopable"] else f", not loopable: {k['loop_reason']}"
        elif k["loopable"] is False and k["loop_reason"] == k["summary"]:
            verdict = "not wrappable, not loopable: " + k["summary"]
        else:
            verdict = "not wrappable: " + k["summary"]
        note = "" if k["linked"] else " (only in __nv_relfatbin: the device link dropped it)"
        lines.append(f"{name}: SASS {sass}; PTX {ptx}; {verdict}{note}")
        wrappers = k["wrappers"].items()
        if len({(w["wrappable"], w["reason"]) for _, w in wrappers}) > 1:
            # The wrappers disagree: each one's verdict, as `clc wrap` would give it.
            for wrapper, w in wrappers:
                if not w["wrappable"]:
                    lines.append(f"  {wrapper}: not wrappable: {w['reason']}")
                else:
                    lines.append(f"  {wrapper}: wrappable, " + (
                        "its body looped over virtual blocks" if w["looped"]
                        else "its body run once per block (1:1)"))
    unread = [e["name"] for e in report["entries"] if e["kernels"] is None]
    if unread:
        lines.append(f"not read for kernels: {', '.join(unread)} (LTO-IR or unknown entries)")
    return "\n".join(lines) + "\n"
