# SPDX-License-Identifier: Apache-2.0
"""The program's engine decides a process that changed its user or groups as who it is now."""

import os

from clc import abi
from clc.policy import parse_policy
from clc.runtime.engine import Engine

POLICY = parse_policy("""\
version: 1
default: allow
rules:
  - name: not-for-12345
    match: {kernel: "*", user: "12345"}
    action: deny
""").to_json()


def test_a_kernel_decided_after_setuid_is_decided_for_the_new_user(monkeypatch):
    # GIVEN an engine in a process of this user, and a kernel it decided
    engine = Engine({"CLC_POLICY": POLICY})
    before = engine.kernel(0x100, 0x200, "k", 0)
    assert "12345" not in before.info.identity.users
    # WHEN the process becomes user 12345 (the shim then forgets its decisions)
    for name in ("getuid", "geteuid"):
        monkeypatch.setattr(os, name, lambda: 12345)
    monkeypatch.setattr(os, "getresuid", lambda: (12345, 12345, 12345))
    engine.kernels.clear()
    after = engine.kernel(0x100, 0x200, "k", 0)
    # THEN the kernel is decided as user 12345's: the rule for that user denies it
    assert "12345" in after.info.identity.users
    assert engine.policy.decide(after.info).fallback.action == abi.ACTION_DENY
    assert engine.program_decision(0) is not None
