# SPDX-License-Identifier: Apache-2.0
"""An export that takes more than a second shows its progress on a terminal (tqdm), and
nothing where standard error is not one."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from capture_writer import big_capture


def run_on_a_terminal(argv):
    """argv with its standard error on a pseudo-terminal: (status, what it wrote there)."""
    main, sub = pty.openpty()
    # a terminal of 100 columns (a new pseudo-terminal has none, and a bar fits in none)
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sub, stdin=subprocess.DEVNULL)
    os.close(sub)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    return p.wait(), out.decode(errors="replace")


def test_a_long_export_shows_its_progress_on_a_terminal(tmp_path):
    cap = big_capture(tmp_path / "big.clc", 150_000)  # several seconds of JSON
    status, err = run_on_a_terminal([sys.executable, "-m", "clc", "report", str(cap),
                                     "--format", "json", "-o", str(tmp_path / "big.json")])
    assert status == 0, err
    assert "clc report: JSON" in err and "launches" in err and "%" in err
    assert f"written to {tmp_path / 'big.json'}" in err


def test_no_progress_where_standard_error_is_not_a_terminal(tmp_path):
    cap = big_capture(tmp_path / "big.clc", 150_000)
    p = subprocess.run([sys.executable, "-m", "clc", "report", str(cap), "--format", "chrome",
                        "-o", str(tmp_path / "t.json")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0
    assert p.stderr == f"clc: chrome report of 1 capture written to {tmp_path / 't.json'}\n"
