# SPDX-License-Identifier: Apache-2.0
"""clc-run's decider: the first sight of each kernel, answered outside the program.

For a policy without Python hooks, the rules are all there is to decide, and nothing about
them needs the program's interpreter. clc-run listens on a Unix socket in a private directory
(its path reaches the shim as the sealed CLC_DECIDER setting) and answers each process's
questions over a connection of its own (shim/deciding/decider.c): the program runs whatever Python
version it likes, or none, its GIL is never waited for, and forked children and the programs
they exec are decided like the program itself.

What a rule may match about the process (its names, user, groups and cgroup) is read here
from the kernel: SO_PEERCRED names the process at the other end, /proc/PID the rest; nothing
comes from what the process says. A wrap rule's kernels are left to the program's own engine,
which builds the wrapped kernel in the program (CLC_DECIDE_ENGINE).

The wire format is clc_decide_request / clc_decide_reply in shim/clc_abi.h (clc.abi).
"""

import dataclasses
import os
import socket
import struct
import sys
import threading
import traceback

from clc import abi
from clc.cuda_errors import CUDA_ERRORS
from clc.demangle import demangle
from clc.runtime.engine import program_scope_decision
from clc.runtime.private_dir import PrivateDir
from clc.policy.names import process_names
from clc.runtime.wording import deny_announcements, describe, rule_name
from clc.policy import Decision, KernelInfo, Outcome, identity_of_process

__all__ = ["Decider", "decides_alone"]

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]


def decides_alone(policy):
    """Whether clc-run can decide every kernel of `policy`: it has no Python hooks (the
    --hooks files are among policy.hooks)."""
    return not policy.hooks and all(rule.hook is None for rule in policy.rules)


class _Peer:
    """One process asking: what the policy may match about it, read once when it connects.
    Its user and group are the ones SO_PEERCRED gave; /proc/PID must agree (else the pid was
    another process's by the time it was read: ValueError)."""

    def __init__(self, pid, uid=None, gid=None):
        self.pid = pid
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            argv = []
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        self.names = process_names(argv, exe)
        self.identity = identity_of_process(pid, uid, gid)
        self.announced = set()


class Decider:
    """Answers first sights for one clc-run: start() before the program runs, close() after."""

    def __init__(self, policy, tenant="", verbose=False):
        self.policy = policy
        self.tenant = tenant
        self.verbose = verbose
        # Only kernels the splice wraps need the program's engine (and its loads): a kernel
        # confined by a green context is the shim's alone.
        self.wraps = policy.splices
        # Mode 0700: this user's alone.
        self._dir = PrivateDir("clc-decider")
        self.path = self._dir.join("socket")
        self._listener = self._dir.bind("socket", socket.SOCK_SEQPACKET, lambda s: s.listen(64))
        self._reported = set()
        self._lock = threading.Lock()
        self._closed = False

    def settings(self):
        """What the shim needs to ask, and to know that the answer is clc-run's."""
        return {"CLC_DECIDER": self.path, "CLC_DECIDER_PID": str(os.getpid()),
                "CLC_DECIDER_UID": str(os.geteuid()),
                "CLC_POLICY_WRAPS": "1" if self.wraps else "0"}

    def start(self):
        """Serve in a daemon thread (made with the caller's signal mask: clc-run's main
        thread waits for its signals with sigwaitinfo, and no other thread may take them)."""
        threading.Thread(target=self._serve, name="clc-decider", daemon=True).start()

    def close(self):
        self._closed = True
        self._dir.close()

    def _serve(self):
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            try:
                threading.Thread(target=self._client, args=(conn,), name="clc-decider-client",
                                 daemon=True).start()
            except RuntimeError as e:  # no thread to be had: that process asks its own engine
                self._report(("thread",), f"cannot serve another process's questions: {e}")
                conn.close()

    def _client(self, conn):
        with conn:
            try:
                pid, uid, gid = _PEERCRED.unpack(conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
                peer = _Peer(pid, uid, gid)
            except (OSError, ValueError) as e:
                self._report(("peer", type(e)), f"cannot tell which process asked: {e}")
                peer = None
            while True:
                try:
                    data = conn.recv(abi.DECIDE_REQUEST.size + abi.DECIDE_MAX_NAME)
                except OSError:
                    return
                if not data:
                    return
                try:
                    conn.send(self.answer(data, peer))
                except OSError:
                    return

    def answer(self, data, peer):
        """The reply (bytes) to one request (bytes) from `peer` (None: unknown; the shim then
        asks the program's own engine)."""
        status, decision, text, seq = abi.DECIDE_FAILED, None, "", 0
        try:
            magic, device, size, seq, question = abi.DECIDE_REQUEST.unpack_from(data)
            if magic != abi.DECIDE_MAGIC or len(data) != abi.DECIDE_REQUEST.size + size or \
                    question not in (abi.ASK_KERNEL, abi.ASK_PROGRAM):
                raise ValueError(f"a malformed question ({len(data)} bytes)")
            if peer is not None:
                mangled = data[abi.DECIDE_REQUEST.size:].decode("utf-8", "replace")
                status, decision, text = self._decide(mangled, device, peer, question)
        except Exception:
            kind, value, _ = sys.exc_info()
            self._report(("raised", kind, str(value)), "clc-run could not decide a kernel (the "
                         "program's own engine decides it): " + traceback.format_exc(limit=4))
        if decision is None:  # the shim reads the decision of DECIDE_OK and DECIDE_ENGINE only
            decision = Decision([], self.policy.on_error_outcome())
        body = abi.pack_decision([(c.grid_blocks, c.block_threads, c.shared_mem, c.outcome)
                                  for c in decision.clauses], decision.fallback)
        raw = text.encode("utf-8", "replace")[:abi.DECIDE_MAX_TEXT]
        return abi.DECIDE_REPLY.pack(abi.DECIDE_MAGIC, status, len(raw), seq) + body + raw

    def _decide(self, mangled, device, peer, question):
        info = KernelInfo(mangled=mangled, demangled=demangle(mangled), device=device,
                          process_names=peer.names, tenant=self.tenant, identity=peer.identity)
        if question == abi.ASK_PROGRAM:  # whether the process is confined program-wide
            return abi.DECIDE_OK, program_scope_decision(self.policy, info), ""
        decision = self.policy.decide(info)
        outcomes = [c.outcome for c in decision.clauses] + [decision.fallback]
        if any(o.action == abi.ACTION_REPLACE for o in outcomes):
            # The program's engine builds the wrapped kernel; should it not run there (another
            # Python, a forked child), the wrap rules' kernels get their on_unwrappable.
            return abi.DECIDE_ENGINE, Decision(
                [dataclasses.replace(c, outcome=_unwrapped(c.outcome)) for c in decision.clauses],
                _unwrapped(decision.fallback)), ""
        if len(decision.clauses) > abi.MAX_CLAUSES:
            raise RuntimeError(f"{len(decision.clauses)} shape clauses for {info.demangled}, "
                               f"at most {abi.MAX_CLAUSES} fit")
        name_of = self._name_of
        lines = deny_announcements(self.policy, info, decision, peer.announced, name_of)
        if self.verbose:
            lines.append(f"clc: first sight of {info.demangled} on device {device}: "
                         f"{describe(decision, abi.MODE_CACHED, name_of)}\n")
        return abi.DECIDE_OK, decision, "".join(lines)

    def _name_of(self, rule):
        return rule_name(self.policy, rule)

    def _report(self, key, text):
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        sys.stderr.write(f"clc: {text}\n")


def _unwrapped(outcome):
    """A wrap outcome as its rule's on_unwrappable says, for when it cannot be built."""
    if outcome.action != abi.ACTION_REPLACE:
        return outcome
    deny = outcome.wrap is not None and outcome.wrap.on_unwrappable == "deny"
    return Outcome(abi.ACTION_DENY if deny else abi.ACTION_ALLOW, outcome.flags,
                   _NOT_PERMITTED if deny else 0, outcome.rule)

