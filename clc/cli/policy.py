# SPDX-License-Identifier: Apache-2.0
"""`clc policy check [--strict] FILE...` and `clc policy explain FILE --kernel NAME [...]`"""

import dataclasses
import grp
import os
import pwd
import sys

from clc import words
from clc.demangle import demangle
from clc.errors import EXIT_USAGE, ClcError
from clc.runtime.hooks import hook_ref_errors, hook_rule_errors
from clc.policy import KernelInfo, PolicyError, identity_of, load_policy, process_identity

__all__ = ["PolicyCommand", "parse_dim3", "explained_identity"]


def parse_dim3(text):
    """"256" or "256,1,1" -> (256, 1, 1)"""
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 1 for p in parts):
        raise ClcError(f"expected X[,Y[,Z]] of positive integers, got {text!r}", EXIT_USAGE)
    return tuple(parts + [1] * (3 - len(parts)))


def _id_of(text, lookup, kind):
    """The numeric id of a user or group given by name or number."""
    if text.isdigit():
        return int(text)
    try:
        return lookup(text)
    except KeyError:
        raise ClcError(f"no {kind} named {text!r} on this machine", EXIT_USAGE) from None


def explained_identity(args):
    """Your Identity, with what --user, --group and --cgroup say in its place."""
    own = process_identity()
    users = own.users if args.user is None else identity_of(
        [_id_of(args.user, lambda name: pwd.getpwnam(name).pw_uid, "user")], []).users
    groups = own.groups if args.group is None else identity_of(
        [], [_id_of(g, lambda name: grp.getgrnam(name).gr_gid, "group") for g in args.group]
    ).groups
    cgroup = own.cgroup if args.cgroup is None else args.cgroup
    return dataclasses.replace(own, users=users, groups=groups, cgroup=cgroup)


class PolicyCommand:
    name = "policy"
    help = "check policy files, or explain which rule decides a launch"

    @staticmethod
    def add_arguments(parser):
        sub = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
        check = sub.add_parser(
            "check", help="validate policy files",
            description="Check policy files as clc-run would load them. Every error of a file "
                        "is printed (FILE:LINE:COLUMN: what was expected), then its warnings: "
                        "rules that earlier rules leave unreachable, deny rules that ask to "
                        "record or time, on_error: allow in a policy that denies. The status "
                        "is 2 when a file has errors.")
        check.add_argument("--strict", action="store_true",
                           help="fail (status 2) on warnings too")
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
        explain.add_argument("--user", metavar="NAME|UID",
                             help="the program's user (default: yours)")
        explain.add_argument("--group", metavar="NAME|GID", action="append",
                             help="a group of the program, repeated for each (default: yours)")
        explain.add_argument("--cgroup", metavar="PATH",
                             help="the program's cgroup v2 path (default: yours)")
        explain.add_argument("--hooks", metavar="FILE", action="append",
                             help="hook files given to clc-run, asked before the rules")

    def run(self, args):
        if args.policy_command == "check":
            return self.check(args.files, args.strict)
        return self.explain(args)

    @staticmethod
    def check(files, strict=False):
        failed = False
        for path in files:
            # Every error of the file at once: the hook rules' files are imported and their
            # functions looked up even when the rest of the file has errors.
            try:
                policy = load_policy(path)
                errors = hook_rule_errors(policy)
            except PolicyError as e:
                errors = list(e.errors) + hook_ref_errors(e.path, e.hooks)
            if errors:
                print(PolicyError.collect(errors), file=sys.stderr)
                print(f"{path}: {words.count(len(errors), 'error')}",
                      file=sys.stderr)
                failed = True
                continue
            for warning in policy.warnings:
                print(warning, file=sys.stderr)
            count = len(policy.warnings)
            warned = words.count(count, "warning")
            if strict and count:
                print(f"{path}: {warned}, which --strict makes errors", file=sys.stderr)
                failed = True
                continue
            classes = ""
            if policy.priority is not None:
                n = len(policy.priority.classes)
                classes = f", {words.count(n, 'priority class', 'priority classes')}"
            print(f"{path}: ok ({words.count(len(policy.rules), 'rule')}{classes}, default "
                  f"{policy.default}, on_error {policy.on_error}"
                  + (f", {warned})" if count else ")"))
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
                          tenant=args.tenant, identity=explained_identity(args))
        explanation = policy.explain(info, grid=parse_dim3(args.grid),
                                     block=parse_dim3(args.block), shared_mem=args.shared_mem)
        print(explanation.format())
        if policy.priority is not None:
            print("\n".join(policy.priority.explain(info)))
        return 0
