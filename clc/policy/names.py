# SPDX-License-Identifier: Apache-2.0
"""Kernel names (a base name from the demangled one) and the process's identity, as the
rules match them: KernelInfo is what a policy may look at when a kernel is first seen.
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass


# ---- kernels -------------------------------------------------------------------------------

_OPERATOR_RE = re.compile(r"\boperator\b")
_OPERATOR_AT_END_RE = re.compile(r"\boperator$")
# Longest first, so that `operator<<=` is not read as `operator<` followed by `<=`.
_OPERATOR_SYMBOLS = ("<=>", "<<=", ">>=", "->*", "()", "[]", "->", "<<", ">>", "<=", ">=", "<", ">")
_TRAILING_QUALIFIERS = (" const", " volatile", " &&", " &")


def _open_paren_of_last_group(text: str) -> int:
    """Index of the '(' matching the ')' that ends text, or -1."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _strip_parameters(name: str) -> str:
    core = name
    stripping = True
    # Lambdas' operator() carries cv and ref qualifiers after its parameter list.
    while stripping:
        stripping = False
        for qualifier in _TRAILING_QUALIFIERS:
            if core.endswith(qualifier):
                core = core[: -len(qualifier)].rstrip()
                stripping = True
    if not core.endswith(")"):
        return name
    start = _open_paren_of_last_group(core)
    before = core[:start].rstrip()
    # A group that starts the name, or the "()" of `operator()`, is not a parameter list.
    if start <= 0 or _OPERATOR_AT_END_RE.search(before):
        return name
    return before


def _strip_return_type(name: str) -> str:
    operators = {m.start(): m.end() for m in _OPERATOR_RE.finditer(name)}
    depth = 0
    split = -1
    i = 0
    while i < len(name):
        if i in operators:
            # Spaces after a top-level `operator` belong to its name (`operator new`).
            if depth == 0:
                break
            i = operators[i]
            for symbol in _OPERATOR_SYMBOLS:
                if name.startswith(symbol, i):
                    i += len(symbol)
                    break
            continue
        c = name[i]
        if c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth = max(0, depth - 1)
        elif c == " " and depth == 0:
            split = i
        i += 1
    return name[split + 1:]


def base_name(demangled: str) -> str:
    """The demangled name without its parameter list and without a leading return type.

    `void ns::k<4, F<float> >(int, F<float>)` gives `ns::k<4, F<float> >`,
    `vecAdd(float const*, int)` gives `vecAdd`, and a C name is returned unchanged.
    """
    return _strip_return_type(_strip_parameters(demangled.strip()))


@dataclass(frozen=True)
class Identity:
    """Who runs the program, as the kernel knows it: what `user`, `group` and `cgroup` match.

    users and groups hold, for each id, its name (when the user or group database has one)
    and the id in decimal; cgroup is the cgroup v2 path, None where there is none. An empty
    Identity matches no user, group or cgroup condition.
    """

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    cgroup: str | None = None

    def format(self) -> str:
        return (f"user {_quoted(self.users) or '(unknown)'}; groups "
                f"{_quoted(self.groups) or '(unknown)'}; cgroup "
                + (f"'{self.cgroup}'" if self.cgroup is not None else "(none)"))


def _id_names(ids: Iterable[int], lookup) -> tuple[str, ...]:
    forms = []
    for number in dict.fromkeys(ids):
        try:
            forms.append(lookup(number))
        except (KeyError, OverflowError):  # an id with no entry in the database
            pass
        forms.append(str(number))
    return tuple(dict.fromkeys(forms))


def identity_of(uids: Iterable[int], gids: Iterable[int], cgroup: str | None = None) -> Identity:
    """The Identity of these user ids, group ids and cgroup path, with the names the user and
    group databases give them."""
    return Identity(_id_names(uids, lambda uid: pwd.getpwuid(uid).pw_name),
                    _id_names(gids, lambda gid: grp.getgrgid(gid).gr_name), cgroup)


_PROC_CGROUP = "/proc/self/cgroup"


def _cgroup_v2_path(text: str) -> str | None:
    """The path of the unified hierarchy's line, `0::PATH`, of /proc/PID/cgroup."""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path.startswith("/"):
            return path
    return None


def process_identity() -> Identity:
    """This process's Identity: its real and effective user ids, its real, effective and
    supplementary group ids, and its cgroup v2 path.

    All of it comes from the kernel (system calls and /proc/self/cgroup) and the user and group
    databases, none from environment variables, which the program's user sets at will.
    """
    try:
        with open(_PROC_CGROUP, encoding="utf-8", errors="replace") as f:
            cgroup = _cgroup_v2_path(f.read())
    except OSError:
        cgroup = None
    return identity_of((os.getuid(), os.geteuid()),
                       (os.getgid(), os.getegid(), *os.getgroups()), cgroup)


def identity_of_process(pid: int, uid: int | None = None, gid: int | None = None) -> Identity:
    """Process `pid`'s Identity, as process_identity() gives a process its own, read from
    /proc/PID (its status's real and effective ids and supplementary groups, its cgroup).
    `uid` and `gid`, when given, are what the kernel said of the process earlier (SO_PEERCRED):
    a /proc/PID whose effective ids differ is another process's (ValueError)."""
    ids = {}
    with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups"):
                ids[key] = [int(v) for v in value.split()]
    for key, want in (("Uid", uid), ("Gid", gid)):
        if want is not None and want not in ids.get(key, [])[1:2]:
            raise ValueError(f"process {pid} changed: its {key.lower()} is not {want}")
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            cgroup = _cgroup_v2_path(f.read())
    except OSError:
        cgroup = None
    return identity_of(ids.get("Uid", [])[:2], ids.get("Gid", [])[:2] + ids.get("Groups", []),
                       cgroup)


@dataclass(frozen=True)
class KernelInfo:
    """What the policy may look at when a kernel is first seen."""

    mangled: str
    demangled: str
    device: int
    process_names: tuple[str, ...] = ()
    tenant: str = ""
    identity: Identity = Identity()

    # Computed once per kernel: every rule's kernel match reads them.
    @functools.cached_property
    def base(self) -> str:
        return base_name(self.demangled) if self.demangled else ""

    @functools.cached_property
    def name_forms(self) -> tuple[str, ...]:
        """The names a kernel glob or regex is tried on, most readable first."""
        forms = []
        for form in (self.base, self.demangled, self.mangled):
            if form and form not in forms:
                forms.append(form)
        return tuple(forms)

    @property
    def display_name(self) -> str:
        return self.base or self.mangled


def _quoted(items) -> str:
    return ", ".join(f"'{item}'" for item in items)


# ---- the program's names ------------------------------------------------------------------

# Options of the python command whose value is the next argument.
_PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


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
            if arg == "-m" or arg.startswith("-m") and not arg.startswith("--"):
                names.append(arg[2:] or next(args, ""))
                break
            if arg == "-c" or arg == "-" or arg.startswith("-c") and not arg.startswith("--"):
                break
            if arg in _PYTHON_OPTIONS_WITH_VALUE:
                next(args, None)  # -W ignore: "ignore" is the option's, not a script
                continue
            if arg == "--":
                names.append(os.path.basename(next(args, "")))
                break
            if not arg.startswith("-"):
                names.append(os.path.basename(arg))
                break
    return tuple(dict.fromkeys(n for n in names if n))
