# SPDX-License-Identifier: Apache-2.0
"""Priority classes on the GPU: a latency-critical PyTorch service and a best-effort PyTorch
training job, run at once under one priority policy, give the results each gives alone, bit
for bit; the training's launches were held while the service was busy, and the board is left
empty."""

import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.gpu

SERVE = textwrap.dedent("""\
    import os, sys, time, torch
    torch.manual_seed(0)
    layers = [torch.randn(1024, 1024, device="cuda") / 32 for _ in range(8)]
    x = torch.randn(256, 1024, device="cuda")

    def request():
        y = x
        for w in layers:
            y = torch.relu(y @ w)
        out = y.double().sum()
        torch.cuda.synchronize()  # the answer is back: the GPU is idle until the next request
        return out.item().hex()

    first = request()
    print("ready", flush=True)
    served, stop = 1, sys.argv[1]
    deadline = time.monotonic() + 120
    while not os.path.exists(stop) and time.monotonic() < deadline:
        assert request() == first  # every request gives the same answer
        served += 1
        time.sleep(0.004)
    print("serve", first, served, flush=True)
""")

TRAIN = textwrap.dedent("""\
    import sys, torch
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(1)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU())
                                  for _ in range(6)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 512, device="cuda")
    print("ready", flush=True)
    for step in range(int(sys.argv[1])):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("train", loss.item().hex(), flush=True)
""")

POLICY = """\
version: 1
default: allow
priority:
  board: {board}
  classes:
    - name: serving
      class: latency-critical
      match: {{tenant: serving}}
    - name: training
      class: best-effort
      match: {{tenant: batch}}
      floor: 0.1
"""


def result(out, word):
    lines = [ln for ln in out.splitlines() if ln.startswith(word + " ")]
    assert lines, out
    return lines[-1].split()[1]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("prio")
    (d / "serve.py").write_text(SERVE)
    (d / "train.py").write_text(TRAIN)
    return d


def slots(board):
    """The slot files of this user's latency-critical processes on the board."""
    mine = board / f"u{os.geteuid()}"
    return sorted(mine.iterdir()) if mine.exists() else []


def slot_counts(board):
    """(name, used, launched, settled) of the first GPU row of each slot on the board."""
    out = []
    for slot in slots(board):
        data = slot.read_bytes()
        uuid, used, waiting, launched, settled = struct.unpack_from("<16sIIQQ", data, 64)
        out.append((slot.name, used, launched, settled))
    return out


def test_a_service_and_a_training_job_keep_their_results_under_a_priority_policy(
        scripts, tmp_path, clc_scripts, tools):
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONUNBUFFERED": "1"}
    stop = tmp_path / "stop"
    serve = [sys.executable, scripts / "serve.py", stop]
    train = [sys.executable, scripts / "train.py", "1500"]
    alone = {}
    stop.touch()  # alone, the service answers one request and stops
    for name, argv in (("serve", serve), ("train", train)):
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                              timeout=600)
        assert proc.returncode == 0, tools.describe(proc)
        alone[name] = result(proc.stdout, name)
    stop.unlink()

    board = tmp_path / "board"
    policy = tmp_path / "priority.yaml"
    policy.write_text(POLICY.format(board=board))

    def under_clc(tenant, argv):
        cmd = [clc_scripts.run, "--policy", policy, "--tenant", tenant, "-v", "-o",
               tmp_path / f"{tenant}.clc", "--force", "--", *argv]
        return subprocess.Popen([str(a) for a in cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

    # GIVEN the service running, answering a request every few milliseconds
    server = under_clc("serving", serve)
    assert server.stdout.readline().strip() == "ready"
    # WHEN a training job runs beside it
    trainer = under_clc("batch", train)
    t_out, t_err = trainer.communicate(timeout=600)
    on_board = slot_counts(board)
    stop.touch()
    s_out, s_err = server.communicate(timeout=600)
    assert server.returncode == 0, s_err[-4000:]
    assert trainer.returncode == 0, t_err[-4000:]
    # THEN each gives the result it gives alone, bit for bit
    assert result(s_out, "serve") == alone["serve"]
    assert result(t_out, "train") == alone["train"]
    # AND the service counted its launches and settled them; the training was held while the
    # service was busy, which its capture and report say; the service left the board
    assert "priority class 'training' (best-effort" in t_err
    assert "priority class 'serving' (latency-critical)" in s_err
    ((_, used, launched, settled),) = on_board
    assert used == 1 and launched > 100 and settled > 0, on_board
    priority_lines = [ln for ln in (s_err + t_err).splitlines() if "priority" in ln]
    assert "Held (best-effort, while latency-critical work was busy on its GPU):" in t_err, \
        (on_board, priority_lines)
    from clc.capture.reader import read_captures
    from clc.cli.run import capture_files
    holds = [h for c in read_captures(capture_files(tmp_path / "batch.clc")) for h in c.holds]
    assert len(holds) >= 10
    assert all(not h.no_board for h in holds)
    lags = sorted(h.lag_ns for h in holds if h.lag_ns)
    assert lags and lags[len(lags) // 2] < 5e6, lags  # held within 5 ms of the service going busy
    time.sleep(0.1)
    assert slots(board) == []
