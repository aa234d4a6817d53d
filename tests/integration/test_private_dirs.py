# SPDX-License-Identifier: Apache-2.0
"""clc-run's private directories (its status socket's and its decider's) do not outlast it: a
run ends by removing them, and a run killed outright (SIGKILL) has its removed by the next
run, while a live run's are left alone, whatever else lies under their names."""

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from clc.runtime.private_dir import PrivateDir, sweep

from harness import AUDIT, clc_command, env_for

KINDS = ("clc-run-", "clc-decider-")


def leftovers(tmp):
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(KINDS))


def start_run(native, tmp_path, tmp, argv, name="run"):
    policy = tmp_path / "policy.yaml"
    policy.write_text(AUDIT)
    cmd = clc_command() + ["--policy", str(policy), "-o", str(tmp_path / f"{name}.clc"),
                           "--force", "--", *argv]
    return subprocess.Popen(cmd, env=env_for(native, {"TMPDIR": str(tmp)}), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_dirs(tmp, count=2, timeout=30):
    deadline = time.monotonic() + timeout
    while len(leftovers(tmp)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return leftovers(tmp)


@pytest.fixture
def tmp():
    """A temporary directory of its own, short enough to hold a socket's path."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="clc-test-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_run_killed_outright_is_cleaned_up_by_the_next(native, tmp_path, tmp):
    # GIVEN a run killed with SIGKILL while its program runs: nothing of its own can clean up
    proc = start_run(native, tmp_path, tmp, ["sleep", "30"])
    try:
        assert len(wait_for_dirs(tmp)) == 2, leftovers(tmp)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert len(leftovers(tmp)) == 2
    # WHEN the next run starts and ends
    nxt = start_run(native, tmp_path, tmp, ["true"], name="next")
    out, err = nxt.communicate(timeout=120)
    # THEN nothing of either run is left
    assert nxt.returncode == 0, err
    assert leftovers(tmp) == []


def test_a_live_runs_directories_are_left_alone(native, tmp_path, tmp):
    # GIVEN a run whose program is still running
    first = start_run(native, tmp_path, tmp, ["sh", "-c", "sleep 3; echo done"])
    try:
        dirs = wait_for_dirs(tmp)
        assert len(dirs) == 2
        # WHEN another run starts and ends meanwhile
        nxt = start_run(native, tmp_path, tmp, ["true"], name="next")
        nxt.communicate(timeout=120)
        # THEN the first run's directories are still there, and it ends as it should
        assert set(dirs) <= set(leftovers(tmp))
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0 and "done" in out, err
    assert leftovers(tmp) == []


def test_a_sweep_removes_only_this_users_abandoned_directories(tmp):
    # GIVEN under the private directories' names: a live one, an abandoned one (its lock let
    # go, as a killed run's), a link to a directory, a directory open to others, and, as root,
    # another user's
    live = PrivateDir("clc-run", parent=str(tmp))
    abandoned = PrivateDir("clc-run", parent=str(tmp))
    os.close(abandoned._lock)
    others = []
    target = tmp / "precious"
    target.mkdir()
    (target / "lock").write_text("")
    (tmp / "clc-run-symlink1").symlink_to(target)
    others.append("clc-run-symlink1")
    open_dir = tmp / "clc-run-opendir1"
    open_dir.mkdir()
    (open_dir / "lock").write_text("")
    open_dir.chmod(0o755)
    others.append(open_dir.name)
    if os.geteuid() == 0:
        foreign = tmp / "clc-run-foreign1"
        foreign.mkdir(mode=0o700)
        (foreign / "lock").write_text("")
        os.chown(foreign, 65534, 65534)
        others.append(foreign.name)
    # WHEN a sweep runs there
    sweep(str(tmp), "clc-run")
    # THEN only the abandoned one is gone, and nothing was followed through the link
    left = {p.name for p in tmp.iterdir()}
    assert os.path.basename(abandoned.path) not in left
    assert left == {os.path.basename(live.path), "precious", *others}
    assert (target / "lock").exists()
    live.close()
    assert not os.path.exists(live.path)
