# SPDX-License-Identifier: Apache-2.0
"""`clc policy check FILE...` and `clc policy explain FILE --kernel NAME [...]`"""

import os
import sys

from clc.demangle import demangle
from clc.errors import EXIT_USAGE, ClcError
from clc.policy import KernelInfo, PolicyError, load_policy

__all__ = ["PolicyCommand", "parse_dim3"]


def parse_dim3(text):
    """"256" or "256,1,1" -> (256, 1, 1)"""
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 1 for p in parts):
        raise ClcError(f"expected X[,Y[,Z]] of positive integers, got {text!r}", EXIT_USAGE)
    return tuple(parts + [1] * (3 - len(parts)))


class PolicyCommand:
    name = "policy"
    help = "check policy files, or explain which rule decides a launch"

    @staticmethod
    def add_arguments(parser):
        sub = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
        check = sub.add_parser("check", help="validate policy files")
        check.add_argument("files", nargs="+", metavar="FILE")
        explain = sub.add_parser("explain", help="show which rule decides a launch, and why")
        explain.add_argument("file", metavar="FILE")
        explain.add_argument("--kernel", required=True, help="kernel name, mangled or demangled")
        explain.add_argument("--grid", default="1", help="X[,Y[,Z]] blocks")
        explain.add_argument("--block", default="1", help="X[,Y[,Z]] threads")
        explain.add_argument("--shared-mem", type=int, default=0, help="dynamic shared memory")
        explain.add_argument("--device", type=int, default=0)
        explain.add_argument("--process", default="", help="program name")
        explain.add_argument("--tenant", default=os.environ.get("CLC_TENANT", ""))
        explain.add_argument("--hooks", metavar="FILE", action="append",
                             help="hook files given to clc-run, asked before the rules")

    def run(self, args):
        if args.policy_command == "check":
            return self.check(args.files)
        return self.explain(args)

    @staticmethod
    def check(files):
        failed = False
        for path in files:
            try:
                policy = load_policy(path)
            except PolicyError as e:
                print(e, file=sys.stderr)
                failed = True
                continue
            print(f"{path}: ok ({len(policy.rules)} rules, default {policy.default}, "
                  f"on_error {policy.on_error})")
        return EXIT_USAGE if failed else 0

    @staticmethod
    def explain(args):
        try:
            policy = load_policy(args.file).with_cli_hooks(args.hooks or [])
        except PolicyError as e:
            raise ClcError(str(e), EXIT_USAGE) from None
        info = KernelInfo(mangled=args.kernel, demangled=demangle(args.kernel),
                          device=args.device,
                          process_names=(args.process,) if args.process else (),
                          tenant=args.tenant)
        explanation = policy.explain(info, grid=parse_dim3(args.grid),
                                     block=parse_dim3(args.block), shared_mem=args.shared_mem)
        print(explanation.format())
        return 0
