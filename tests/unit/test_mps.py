# SPDX-License-Identifier: Apache-2.0
"""priority.mps on a machine without a daemon to ask (clc/runtime/mps.py): where clc-run looks,
the directories it refuses, what it says when no daemon can be joined. The daemon itself is
started and joined for real in tests/gpu/test_mps_gpu.py."""

import os
import pathlib
import subprocess

import pytest

from clc.runtime import mps


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(mps, "_ROOT", str(tmp_path))
    return tmp_path


def control_program(tmp_path, script):
    """An nvidia-cuda-mps-control of its own (the shell `script`) in tmp_path/bin: that
    directory before this PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-cuda-mps-control"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


@pytest.fixture
def control_on_path(tmp_path, monkeypatch):
    """An nvidia-cuda-mps-control on PATH that never answers (no daemon here)."""
    monkeypatch.setenv("PATH", control_program(
        tmp_path, "echo 'Cannot find MPS control daemon process' >&2\nexit 1\n"))
    return str(tmp_path / "bin" / "nvidia-cuda-mps-control")


def test_the_pipe_directory_is_per_user_and_per_visible_devices(root):
    uid = os.geteuid()
    assert mps.clc_pipe_dir({}) == f"{root}/clc-mps-{uid}/all/pipe"
    assert mps.clc_pipe_dir({"CUDA_VISIBLE_DEVICES": "0,1"}) == f"{root}/clc-mps-{uid}/dev-0,1/pipe"
    uuid = mps.clc_pipe_dir({"CUDA_VISIBLE_DEVICES": "GPU-1234abcd-aaaa"})
    assert uuid.startswith(f"{root}/clc-mps-{uid}/dev-") and len(os.path.basename(
        os.path.dirname(uuid))) == len("dev-") + 16
    assert uuid != mps.clc_pipe_dir({"CUDA_VISIBLE_DEVICES": "GPU-1234abcd-aaab"})


def test_the_users_directory_is_made_private_and_a_link_or_an_open_one_refused(root):
    pipe = mps.clc_pipe_dir({})
    mps._private_dir(pipe)
    for d in (os.path.dirname(os.path.dirname(pipe)), os.path.dirname(pipe), pipe):
        assert os.stat(d).st_mode & 0o777 == 0o700
    # a link where the user's directory goes (made by someone else first) is refused
    top = os.path.dirname(os.path.dirname(pipe))
    os.rename(top, f"{top}.away")
    os.symlink(f"{top}.away", top)
    with pytest.raises(mps.MpsProblem, match="is not a directory"):
        mps._private_dir(pipe)
    os.unlink(top)
    os.rename(f"{top}.away", top)
    os.chmod(os.path.dirname(pipe), 0o755)
    with pytest.raises(mps.MpsProblem, match=r"is open to others \(mode 0755\)"):
        mps._private_dir(pipe)


def test_a_daemon_directory_others_may_write_is_not_joined(tmp_path, control_on_path):
    pipe = tmp_path / "shared-pipe"
    pipe.mkdir()
    (pipe / "control").write_text("")
    pipe.chmod(0o777)
    with pytest.raises(mps.MpsProblem, match="others may write it"):
        mps.find_daemon(control_on_path, str(pipe))
    pipe.chmod(0o755)
    # a directory of this user with a control that does not answer: no daemon
    assert mps.find_daemon(control_on_path, str(pipe)) is None


def none_dir(root):
    """The empty pipe directory a program without MPS gets: private, with nothing in it."""
    none = root / f"clc-mps-{os.geteuid()}" / "none"
    assert none.stat().st_mode & 0o777 == 0o700 and not any(none.iterdir())
    return {"CUDA_MPS_PIPE_DIRECTORY": str(none)}


def test_without_the_control_program_the_run_goes_on_without_mps(root, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    env = {"PATH": str(tmp_path)}
    extra, lines = mps.mps_environment("start", env)
    # nothing refused: the driver keeps its own default
    assert extra == {}
    assert lines == [(True, "warning: priority.mps: start: no nvidia-cuda-mps-control on PATH: "
                            "the program runs without MPS (processes' contexts time-slice the "
                            "GPU), unless a daemon answers the driver itself there")]


def test_join_with_no_daemon_says_where_it_looked(root, control_on_path, monkeypatch):
    monkeypatch.setattr(mps, "DEFAULT_PIPE", str(root / "nvidia-mps"))
    extra, lines = mps.mps_environment("join", dict(os.environ))
    assert extra == {}
    (loud, line), = lines
    assert loud and line.startswith(f"warning: priority.mps: join: no MPS daemon answers at "
                                     f"{mps.clc_pipe_dir({})} or {root}/nvidia-mps: the program "
                                     f"runs without MPS"), line


def test_clcs_own_daemon_is_joined_under_a_shared_sticky_directory(tmp_path, monkeypatch):
    # GIVEN a /tmp-like directory (root's, 1777), clc's directory for this user in it, and a
    # control program that answers there (as a daemon would: an empty server list)
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(mps, "_ROOT", str(shared))
    monkeypatch.setattr(mps, "DEFAULT_PIPE", str(shared / "nvidia-mps"))
    pipe = mps.clc_pipe_dir({})
    mps._private_dir(pipe)
    (pathlib.Path(pipe) / "control").write_text("")
    extra, lines = mps.mps_environment("join", {"PATH": control_program(tmp_path, "exit 0\n")})
    # THEN it is joined
    assert extra == {"CUDA_MPS_PIPE_DIRECTORY": pipe}, lines
    assert lines == [(False, f"MPS: joined the daemon at {pipe}")]


@pytest.mark.parametrize("visible, seen", [("1", "0"), ("2,GPU-5c1e,3", "0,GPU-5c1e,2"),
                                           ("0,1", None), ("GPU-5c1e", None), (None, None)])
def test_a_program_joining_clcs_daemon_numbers_the_devices_as_the_mps_server_does(
        root, tmp_path, visible, seen):
    # GIVEN clc's daemon for the program's visible devices, answering (an empty server list);
    # an MPS server numbers the devices its daemon was given from 0, and reads a client's
    # CUDA_VISIBLE_DEVICES in that numbering
    env = {"PATH": control_program(tmp_path, "exit 0\n")}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    pipe = mps.clc_pipe_dir(env)
    mps._private_dir(pipe)
    (pathlib.Path(pipe) / "control").write_text("")
    # WHEN the program joins it
    extra, lines = mps.mps_environment("join", env)
    # THEN each index becomes its place in the daemon's list (the same GPU to the server), a
    # UUID stays, and with -v the change is said
    assert extra.pop("CUDA_MPS_PIPE_DIRECTORY") == pipe
    assert extra.get("CUDA_VISIBLE_DEVICES") == seen, lines
    assert (f"MPS: CUDA_VISIBLE_DEVICES={visible} is {seen} under that daemon (an MPS server "
            f"numbers its devices from 0)" in [line for _, line in lines]) == (seen is not None)


def test_start_never_starts_a_daemon_in_a_directory_the_user_named(root, control_on_path,
                                                                   tmp_path):
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "mine"))
    extra, lines = mps.mps_environment("start", env)
    assert extra == {}
    assert "clc-run starts a daemon only in its own directory" in lines[0][1]
    assert not (tmp_path / "mine").exists()


def test_a_refused_default_daemon_is_kept_from_the_program(root, control_on_path, monkeypatch):
    # GIVEN MPS's default pipe directory made by someone else, open to all (so refused)
    shared = root / "nvidia-mps"
    shared.mkdir()
    (shared / "control").write_text("")
    shared.chmod(0o777)
    monkeypatch.setattr(mps, "DEFAULT_PIPE", str(shared))
    extra, lines = mps.mps_environment("join", dict(os.environ))
    # THEN the refusal is said, and the program gets an empty pipe directory of its user's
    # instead of the driver's default
    assert "others may write it" in lines[0][1]
    assert extra == none_dir(root)


def test_a_users_directory_made_by_another_is_not_looked_under(root, control_on_path):
    # GIVEN clc's directory for this user made open to others (as if another made it)
    top = root / f"clc-mps-{os.geteuid()}"
    pipe = top / "all" / "pipe"
    pipe.mkdir(parents=True)
    (pipe / "control").write_text("")
    top.chmod(0o777)
    # THEN nothing under it is joined, and the refusal is said
    extra, lines = mps.mps_environment("join", {"PATH": os.environ["PATH"]})
    assert "is open to others" in lines[0][1]


def test_off_changes_nothing(capsys):
    env = {"PATH": "/nonexistent"}
    mps.join_mps("off", env)
    assert env == {"PATH": "/nonexistent"} and capsys.readouterr().err == ""


def daemon_answering(root, tmp_path, monkeypatch, servers):
    """MPS's default pipe directory of this user, with a control program on PATH that answers
    get_server_list with the pids `servers` (as a daemon serving them would)."""
    shared = root / "nvidia-mps"
    shared.mkdir(mode=0o755)
    (shared / "control").write_text("")
    monkeypatch.setattr(mps, "DEFAULT_PIPE", str(shared))
    return shared, {"PATH": control_program(tmp_path, f"echo '{' '.join(map(str, servers))}'\n")}


def test_a_daemon_whose_server_this_namespace_cannot_see_is_joined(root, tmp_path, monkeypatch):
    # GIVEN a daemon serving a pid not visible here (a host's daemon, seen from a container)
    unseen = next(p for p in range(4_000_000, 4_100_000) if not os.path.exists(f"/proc/{p}"))
    shared, env = daemon_answering(root, tmp_path, monkeypatch, [unseen])
    # WHEN a program joins under priority.mps: join
    extra, lines = mps.mps_environment("join", env)
    # THEN it joins it, as the driver would by itself, and -v says whose server is not known
    assert extra == {"CUDA_MPS_PIPE_DIRECTORY": str(shared)}, lines
    assert (False, f"MPS: its server pid {unseen} is not visible here (another PID namespace): "
                   f"whose it is is not known") in lines


@pytest.mark.skipif(os.geteuid() != 0, reason="a process of another user needs root")
def test_a_daemon_serving_another_user_is_not_joined(root, tmp_path, monkeypatch):
    # GIVEN the default daemon serving a process of another user
    other = subprocess.Popen(["sleep", "60"], user=65534)
    try:
        shared, env = daemon_answering(root, tmp_path, monkeypatch, [other.pid])
        extra, lines = mps.mps_environment("join", env)
    finally:
        other.kill()
        other.wait()
    # THEN it is refused, said, and the program is kept off it (the driver would go there)
    assert f"serves another user now (server pid {other.pid})" in lines[0][1], lines
    assert extra == none_dir(root)


def test_start_gives_the_daemon_the_devices_but_not_the_programs_settings(root, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(mps, "DEFAULT_PIPE", str(root / "nvidia-mps"))
    # GIVEN a control program that, started with -d, writes down its environment and makes the
    # control socket (as the daemon does), and answers get_server_list after that
    record = tmp_path / "daemon-env"
    path = control_program(tmp_path, f"if [ \"$1\" = -d ]; then env > {record}; "
                                     ": > \"$CUDA_MPS_PIPE_DIRECTORY/control\"; exit 0; fi\n"
                                     "[ -e \"$CUDA_MPS_PIPE_DIRECTORY/control\" ]\n")
    # AND a best-effort program run with MPS's share setting, on the second GPU, under clc
    env = {"PATH": path, "CUDA_VISIBLE_DEVICES": "1",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "LD_PRELOAD": "/x/libclc.so",
           "CLC_POLICY": "/x/p.json", "HOME": "/home/u"}
    # WHEN it starts the daemon
    extra, lines = mps.mps_environment("start", env)
    pipe = mps.clc_pipe_dir(env)
    assert lines[0] == (True, f"MPS: started a control daemon for this user at {pipe}; it keeps "
                              f"running for this user's next programs (stop it: echo quit | "
                              f"CUDA_MPS_PIPE_DIRECTORY={pipe} nvidia-cuda-mps-control)")
    # THEN the daemon got the GPU and its directories, not the program's MPS share (the default
    # of every client it would serve), shim or settings
    daemon = dict(line.split("=", 1) for line in record.read_text().splitlines() if "=" in line)
    assert daemon["CUDA_VISIBLE_DEVICES"] == "1" and daemon["HOME"] == "/home/u"
    assert daemon["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert daemon["CUDA_MPS_LOG_DIRECTORY"] == os.path.join(os.path.dirname(pipe), "log")
    assert not {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "LD_PRELOAD", "CLC_POLICY"} & set(daemon)
    # AND the program joins it, on the GPU as the server numbers it
    assert extra == {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_VISIBLE_DEVICES": "0"}
