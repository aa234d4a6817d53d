# SPDX-License-Identifier: Apache-2.0
"""The program's priority class (docs/priority.md), decided by clc-run once for the command it
starts, as the sealed settings CLC_PRIORITY and the rest; the processes it starts keep it."""

import os
import shutil
import stat
import sys

from clc import abi
from clc.errors import EXIT_USAGE, ClcError
from clc.policy import KernelInfo, process_identity
from clc.policy.model import LATENCY_CRITICAL

__all__ = ["priority_settings", "board_problem"]

# The users whose slots a best-effort process reads besides its own and root's.
_MAX_TRUSTED_USERS = abi.PRIORITY_MAX_TRUSTED - 2


def _latency_critical_users(priority):
    """The uids whose board slots a best-effort process believes besides its own and root's:
    the users the latency-critical classes name (`user`: by name or number, globs matched
    against the user database), and the members of the groups they name (listed members, and
    the users whose primary group it is). A class that names neither adds none."""
    import fnmatch
    import grp
    import pwd
    users = list(pwd.getpwall())
    uids = set()
    for c in priority.classes:
        if c.kind != LATENCY_CRITICAL:
            continue
        for g in c.user or ():
            if g.isdigit():
                uids.add(int(g))
                continue
            try:
                uids.add(pwd.getpwnam(g).pw_uid)  # a literal name, from any source
            except KeyError:
                pass
            uids.update(e.pw_uid for e in users if fnmatch.fnmatchcase(e.pw_name, g))
        for g in c.group or ():
            groups = []
            try:
                groups.append(grp.getgrgid(int(g)) if g.isdigit() else grp.getgrnam(g))
            except (KeyError, ValueError):
                pass
            groups += [e for e in grp.getgrall() if fnmatch.fnmatchcase(e.gr_name, g)]
            for group in groups:
                for member in group.gr_mem:
                    try:
                        uids.add(pwd.getpwnam(member).pw_uid)
                    except KeyError:
                        pass
                uids.update(e.pw_uid for e in users if e.pw_gid == group.gr_gid)
    return uids


def board_problem(path):
    """Why the shim will refuse the board directory at `path`, or None (also when it is
    missing: the shim makes it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, neither root nor this user"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "others may write it, and it is not sticky"
    return None


def priority_settings(policy, argv, tenant, verbose=False):
    """The sealed settings of the program's priority class (CLC_PRIORITY and the rest), or {}.

    The class is decided here, once, for the command clc-run starts (its name, the tenant,
    this user, groups and cgroup); the processes it starts keep it. A best-effort process
    reads the board's directories of this user, root, and the users the policy's
    latency-critical classes name, or are members of groups they name (CLC_PRIORITY_TRUST)."""
    priority = policy.priority
    if priority is None or not priority.classes:
        return {}
    from clc.policy.names import process_names
    exe = shutil.which(argv[0]) or argv[0]
    info = KernelInfo(mangled="", demangled="", device=0,
                      process_names=process_names(argv, os.path.realpath(exe)), tenant=tenant,
                      identity=process_identity())
    found = priority.class_of(info)
    if found is None:
        if verbose:
            print("clc-run: no priority class holds for this program", file=sys.stderr)
        return {}
    if verbose:
        print(f"clc-run: priority class {found.describe()}", file=sys.stderr)
    problem = board_problem(priority.board)
    if problem:
        print(f"clc-run: warning: the priority board {priority.board} cannot be used "
              f"({problem}): " + ("this program holds no best-effort work"
                                  if found.kind == LATENCY_CRITICAL else
                                  "this program's launches are held to its floor"),
              file=sys.stderr)
    word = abi.PRIORITY_WORD_LC if found.kind == LATENCY_CRITICAL else abi.PRIORITY_WORD_BE
    out = {"CLC_PRIORITY": word.decode(),
           "CLC_PRIORITY_NAME": found.name, "CLC_PRIORITY_BOARD": priority.board,
           "CLC_PRIORITY_IDLE_MS": repr(priority.idle_after_ms)}
    if found.kind == LATENCY_CRITICAL and found.slo:
        out["CLC_PRIORITY_SLO"] = repr(found.slo)
    if found.kind != LATENCY_CRITICAL:
        users = _latency_critical_users(priority)
        if len(users) > _MAX_TRUSTED_USERS:
            raise ClcError(f"the policy's latency-critical classes name {len(users)} users; a "
                           f"best-effort process reads the board slots of at most "
                           f"{_MAX_TRUSTED_USERS}: name fewer, or a smaller group",
                           EXIT_USAGE)
        out["CLC_PRIORITY_FLOOR"] = repr(found.floor)
        out["CLC_PRIORITY_RUN_AHEAD"] = str(found.run_ahead)
        if found.held_share:
            out["CLC_PRIORITY_HELD_SHARE"] = repr(found.held_share)
        if found.reserve:
            out["CLC_PRIORITY_RESERVE"] = repr(found.reserve)
        out["CLC_PRIORITY_TRUST"] = ",".join(f"u{u}" for u in sorted(users))
    return out
