# SPDX-License-Identifier: Apache-2.0
"""sm_share on programs that build their work in ways the plain launch path does not see, over
the fake driver: conditional graph nodes (whose bodies must keep the conditional node's
context), cooperative grids (which must fit the partition), and contexts the program makes
(cuCtxCreate), per kernel and with scope: program. The program's own result is kept in every
case: what cannot be confined runs as it would without clc, or is refused where the rule says
deny, and the report says which and why, once.

The fake driver refuses what the real one refuses here (measured on an H200, driver 580): a
body holding a kernel of another context fails to instantiate (CUDA_ERROR_INVALID_VALUE), a
cooperative grid larger than its stream's SMs hold is CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
and a function of a plain created context does not launch on a green stream
(CUDA_ERROR_INVALID_HANDLE)."""

import re

import pytest

BODY_NOT_CONFINED = ("clc: sm_share: a confined kernel's graph node or captured launch in a "
                     "conditional node's body is not confined")


def share_policy(on_unwrappable="allow", params="{share: 0.25}"):
    match = "" if "program" in params else "    match: {kernel: vecAdd}\n"
    return ("version: 1\ndefault: allow\nrules:\n  - name: quarter\n"
            f"{match}    action: wrap\n    wrapper: sm_share\n"
            f"    params: {params}\n    on_unwrappable: {on_unwrappable}\n")


def conds(stdout):
    """{label: (add rc, instantiate rc)} from prog_conditional's lines."""
    return {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(
        r"^cond (\S+) add=(-?\d+) instantiate=(-?\d+)$", stdout, re.M)}


def greens(stdout):
    """{label: (rc, SMs, ordered)} from the `green` lines."""
    return {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in re.finditer(
        r"^green (\S+) rc=(-?\d+) first=\d+ sms=(\d+) ordered=(\d)$", stdout, re.M)}


CASES = ("plain-generic", "while-api", "if-generic", "switch-capture", "nested-api",
         "child-in-body")


def test_conditional_bodies_keep_the_program_context(clc_run, run_native, native):
    # GIVEN a program whose confined kernel is put in conditional nodes' bodies (by the kernel
    # node API, the generic node API, capture into the body, a nested body) and in a plain
    # graph by the generic node API
    alone = run_native([native["prog_conditional"]])
    assert alone.returncode == 0, alone.stderr
    assert conds(alone.stdout) == {c: (0, 0) for c in CASES}
    # WHEN its kernel is confined to a quarter of the device
    run = clc_run(share_policy(), [native["prog_conditional"]])
    assert run.proc.returncode == 0, run.stderr
    # THEN every graph instantiates as it does without clc: the body nodes kept the program's
    # context (on_unwrappable: allow)
    assert conds(run.stdout) == {c: (0, 0) for c in CASES}, run.stdout + run.stderr
    # AND the plain graph's node, made by the generic node API, ran on the partition
    assert greens(run.stdout)["plain-generic"] == (0, 32, 0)
    # AND that the body nodes were not confined is said once, with why; the child graph's
    # confined node was put back in the program's context, said once too
    assert run.stderr.count(BODY_NOT_CONFINED) == 1, run.stderr
    assert run.stderr.count("clc: sm_share: a child graph put in a conditional node's body had 1 "
                            "confined kernel nodes: they run in the program's context") == 1, \
        run.stderr


def test_conditional_bodies_refuse_what_deny_refuses(clc_run, native):
    # GIVEN the same program, its kernel confined with on_unwrappable: deny
    run = clc_run(share_policy("deny"), [native["prog_conditional"]])
    assert run.proc.returncode == 0, run.stderr
    got = conds(run.stdout)
    # THEN the body nodes are refused (the kernel never runs outside its share) and the graphs,
    # without them, still instantiate; the plain graph's node is confined
    assert got["while-api"] == (800, 0) and got["if-generic"] == (800, 0)
    assert got["nested-api"] == (800, 0) and got["switch-capture"] == (800, 0)
    # AND a child graph made apart, whose node was confined there, cannot go in a body with it
    # and cannot have it moved off its share: the graph does not instantiate, said once
    assert got["child-in-body"] == (0, 1)
    assert "stay confined, as their rule's on_unwrappable (deny) says" in run.stderr
    assert greens(run.stdout)["plain-generic"] == (0, 32, 0)
    assert run.stderr.count(BODY_NOT_CONFINED) == 1


def test_conditional_bodies_under_scope_program(clc_run, native):
    # GIVEN the whole program confined (scope: program): its context is the partition's, and so
    # is every conditional node's and every body's kernel
    run = clc_run(share_policy(params="{share: 0.25, scope: program}"),
                  [native["prog_conditional"]])
    assert run.proc.returncode == 0, run.stderr
    # THEN everything instantiates and runs on the partition, with nothing to say
    assert conds(run.stdout) == {c: (0, 0) for c in CASES}
    assert greens(run.stdout)["plain-generic"] == (0, 32, 0)
    assert BODY_NOT_CONFINED not in run.stderr
    assert "child graph put in a conditional node's body" not in run.stderr


@pytest.mark.parametrize("on_unwrappable,rc", [("allow", 0), ("deny", 720)])
def test_a_cooperative_grid_too_large_for_the_partition(clc_run, native, on_unwrappable, rc):
    # GIVEN cooperative launches of a confined kernel: one small, two sized for the whole
    # device (cuLaunchCooperativeKernel, cuLaunchKernelEx with the cooperative attribute)
    run = clc_run(share_policy(on_unwrappable), [native["prog_coop"]])
    # (the context with execution affinity is refused without MPS, as the driver refuses it)
    assert "check cuCtxCreate(affinity) -> 224" in run.stdout
    assert run.proc.returncode == 0, run.stderr
    seen = greens(run.stdout)
    # THEN the small grid runs on the partition, in the program's stream order
    assert seen["small"] == (0, 32, 1)
    # AND the large ones run on the whole device (allow) or get the driver's refusal (deny)
    for label in ("whole", "whole-ex"):
        assert seen[label][0] == rc, label
        if rc == 0:
            assert seen[label][1] == 132, label
    # AND the numbers are said once: the grid, the partition and what it holds
    assert run.stderr.count("clc: sm_share: a cooperative grid of 4224 blocks cannot be "
                            "resident on a partition of 32 SMs (32 blocks per SM at most for "
                            "its block shape: 1024 in all)") == 1, run.stderr


def test_a_context_made_with_affinity_parameters_is_made_as_asked(clc_run, native):
    # GIVEN a program that makes a context with execution-affinity parameters (which a green
    # context cannot carry) and launches the confined kernel of a module loaded there
    run = clc_run(share_policy(), [native["prog_coop"]], env={"FAKE_CUDA_MPS": "1"})
    # THEN the context is made as asked, the launch the driver refuses on the partition runs on
    # the whole device (on_unwrappable: allow), and both are said
    assert greens(run.stdout)["affinity"] == (0, 132, 0)
    assert "a context the program made with execution-affinity or CIG parameters is made as " \
           "asked" in run.stderr
    assert "the driver refused a confined kernel's launch on its green context (CUresult " \
           "400)" in run.stderr


@pytest.mark.parametrize("params,sms,ordered", [("{share: 0.25}", 32, 1),
                                                ("{share: 0.25, scope: program}", 32, 0)])
def test_a_context_the_program_makes_is_confined(clc_run, native, params, sms, ordered):
    # GIVEN a program that makes its own context (cuCtxCreate), loads a module there and
    # launches the confined kernel (prog_green's other-context)
    run = clc_run(share_policy(params=params), [native["prog_green"]])
    assert run.proc.returncode == 0, run.stderr
    # THEN the kernel ran on the partition: per kernel one launch at a time, in stream order;
    # program-wide as the context's own work
    assert greens(run.stdout)["other-context"] == (0, sms, ordered)
    assert "could not be made a green context" not in run.stderr


REFUSED = ("clc: sm_share: the driver refused to instantiate a graph holding confined kernel "
           "nodes (CUresult 1): ")


def test_a_graph_the_driver_will_not_instantiate_confined_is_made_as_the_program_gave_it(
        clc_run, native):
    # GIVEN a driver that will not instantiate a graph holding a kernel node in a green context
    # (whatever its reason: the fake refuses every one)
    env = {"FAKE_CUDA_REFUSE_GREEN_NODES": "1"}
    # WHEN the plain graph's node is confined (on_unwrappable: allow)
    run = clc_run(share_policy(), [native["prog_conditional"]], env=env)
    assert run.proc.returncode == 0, run.stderr
    # THEN the node is put back in the program's context and the graph instantiated again: it
    # runs on the whole device, and that is said once
    assert conds(run.stdout)["plain-generic"] == (0, 0)
    assert greens(run.stdout)["plain-generic"] == (0, 132, 0)
    assert run.stderr.count(REFUSED + "1 of them run in the program's context, not confined, "
                            "and the graph is instantiated again\n") == 1, run.stderr


def test_a_node_whose_rule_denies_stays_confined_and_the_program_gets_the_error(clc_run,
                                                                                native):
    # GIVEN the same driver, the kernel's rule with on_unwrappable: deny
    env = {"FAKE_CUDA_REFUSE_GREEN_NODES": "1"}
    run = clc_run(share_policy("deny"), [native["prog_conditional"]], env=env)
    assert run.proc.returncode == 0, run.stderr
    # THEN the node is not moved off its share: the program gets the driver's error
    assert conds(run.stdout)["plain-generic"] == (0, 1)
    assert run.stderr.count(REFUSED + "1 of them stay confined, as their rule's on_unwrappable "
                            "(deny) says, and the program gets the driver's error") == 1, \
        run.stderr


def test_bodies_of_destroyed_graphs_are_forgotten(clc_run, native):
    # GIVEN a program that makes and destroys 5000 graphs with a while node each (more bodies
    # than clc keeps at once) before its own cases
    run = clc_run(share_policy(), [native["prog_conditional"], "churn", "5000"], timeout=300)
    assert run.proc.returncode == 0, run.stderr
    # THEN the bodies went with their graphs: the plain graph's node is still confined, and
    # the table never filled
    assert greens(run.stdout)["plain-generic"] == (0, 32, 0)
    assert "conditional bodies alive" not in run.stderr
    assert conds(run.stdout) == {c: (0, 0) for c in CASES}
