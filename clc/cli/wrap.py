# SPDX-License-Identifier: Apache-2.0
"""`clc wrap PATH --kernel NAME --wrapper W [--param K=V ...] [--arch sm_90] -o OUT.cubin`:
build one wrapped kernel offline, with the pipeline clc-run uses (clc.wrapping.build: splice,
NVRTC, nvJitLink; no GPU needed), and report its registers and shared memory next to the
original's (the original's PTX linked alone for the same arch)."""

import pathlib
import re
import sys

from clc.demangle import demangle
from clc.errors import EXIT_USAGE, ClcError
from clc.wrapping.fatbin import FatbinError, parse_image
from clc.policy import base_name
from clc.outputs import open_output, remove_output
from clc.wrapping.splice import Unwrappable

__all__ = ["WrapCommand"]


def _param(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ClcError(f"--param {text!r}: expected NAME=NUMBER (share=0.25, ms=5)", EXIT_USAGE)
    try:
        number = int(value)
    except ValueError:
        try:
            number = float(value)
        except ValueError:
            raise ClcError(f"--param {text!r}: {value!r} is not a number", EXIT_USAGE) from None
    return key, number


def _arch(text):
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)", text)
    if not m:
        raise ClcError(f"--arch {text!r}: expected sm_NN (sm_90)", EXIT_USAGE)
    return int(m.group(1))


def _find(image, kernel, arch):
    """(mangled name, PTX text, entry label) of `kernel` (mangled, demangled or base name)."""
    names = image.kernels()
    matches = [n for n in names if kernel in (n, demangle(n), base_name(demangle(n)))]
    if not matches:
        listed = ", ".join(sorted({base_name(demangle(n)) for n in names})[:20]) or "none"
        raise ClcError(f"no kernel {kernel!r} in this file (kernels: {listed})", EXIT_USAGE)
    if len(set(matches)) > 1:
        raise ClcError(f"{kernel!r} names {len(set(matches))} kernels: "
                       f"{', '.join(sorted(set(matches)))}; give the mangled name", EXIT_USAGE)
    mangled = matches[0]
    ptx = [e for e in image.entries if e.kind == "ptx" and mangled in e.kernels()
           and e.arch <= arch and e.runs_on(arch)]
    if not ptx:
        have = ", ".join(sorted({e.arch_name for e in image.entries if mangled in e.kernels()}))
        raise Unwrappable(f"no PTX for sm_{arch} defines it (the file has {have}); wrapping "
                          "rebuilds a kernel from its PTX")
    best = max(ptx, key=lambda e: e.arch)
    return mangled, best.text(), best.arch_name


class WrapCommand:
    name = "wrap"
    help = ("build a wrapped kernel offline (splice, NVRTC, nvJitLink) from an executable, "
            "shared library, fatbin or PTX file, and compare its registers and shared memory "
            "with the original's")

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("path", metavar="PATH")
        parser.add_argument("--kernel", required=True,
                            help="the kernel: mangled, demangled or base name")
        parser.add_argument("--wrapper", required=True,
                            help="sm_share, block_count, deadline, or a .cu device policy")
        parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                            help="a wrapper parameter (repeatable): share=0.25, sms=8, ms=5")
        parser.add_argument("--arch", default="sm_90", help="target GPU (default sm_90)")
        parser.add_argument("-o", "--output", required=True, metavar="OUT.cubin",
                            help="where the wrapped kernel's cubin goes (never through a link "
                                 "another user controls)")
        parser.add_argument("--force", action="store_true", help="overwrite OUT.cubin")

    def run(self, args):
        cubin = open_output(args.output, args.force, mode=0o644)
        with cubin:
            try:
                self._build(args, cubin)
            except BaseException:
                remove_output(args.output, cubin)
                raise
        return 0

    @staticmethod
    def _build(args, cubin):
        from clc.wrapping.build import WrapBuildError, build, cubin_resources, link, wrapper_spec
        params = dict(_param(p) for p in args.param)
        arch = _arch(args.arch)
        try:
            spec = wrapper_spec(args.wrapper, params, pathlib.Path.cwd())
        except ValueError as e:
            raise ClcError(str(e), EXIT_USAGE) from None
        try:
            data = pathlib.Path(args.path).read_bytes()
        except OSError as e:
            raise ClcError(f"{args.path}: cannot read it: {e.strerror or e}", EXIT_USAGE) from None
        try:
            image = parse_image(data)
            mangled, ptx, where = _find(image, args.kernel, arch)
            built = build(ptx, mangled, spec, arch)
            original = cubin_resources(link([("original.ptx", ptx)], arch, mangled))[mangled]
        except FatbinError as e:
            raise ClcError(f"{args.path}: {e}", EXIT_USAGE) from None
        except Unwrappable as e:
            raise ClcError(f"{demangle(args.kernel)} cannot be wrapped with {args.wrapper}: {e}")
        except WrapBuildError as e:
            raise ClcError(str(e)) from None
        wrapped = cubin_resources(built.cubin)[mangled]
        try:
            cubin.write(built.cubin)
            cubin.flush()
        except OSError as e:
            raise ClcError(f"{args.output}: cannot write it: {e.strerror or e}") from None
        out = sys.stdout
        shown = demangle(mangled)
        out.write(f"kernel:  {shown}" + (f" [{mangled}]" if shown != mangled else "") + "\n")
        out.write(f"from:    {where} PTX of {args.path}\n")
        out.write(f"wrapper: {spec.name}" + "".join(f" {k}={v}" for k, v in spec.params) + "\n")
        body = "looped (claims virtual blocks)" if built.looped else "runs once per block (1:1)"
        out.write(f"body:    {body}: {built.reason}\n")
        out.write(f"{'':14}{'original':>10}{'wrapped':>10}\n")
        for field, label in (("registers", "registers"), ("shared", "shared (B)"),
                             ("stack", "stack (B)")):
            out.write(f"{label:14}{original[field]!s:>10}{wrapped[field]!s:>10}\n")
        out.write(f"built in {built.build_ms:.1f} ms: {args.output} ({len(built.cubin)} bytes, "
                  f"sm_{arch})\n")
