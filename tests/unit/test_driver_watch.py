# SPDX-License-Identifier: Apache-2.0
"""clc-run's watch for processes of the run that load the CUDA driver without the shim
(clc/runtime/driver_watch.py): what it watches, whom it counts as of the run, what it names."""

import os
import subprocess
import sys
import time

from clc.runtime.driver_watch import DriverWatch, driver_files
from clc.runtime.status import RunStatus

# Maps the files named on its command line, says so with its pid, and waits for its stdin to
# close.
MAPPER = """\
import mmap, os, sys
maps = []
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
print("mapped", os.getpid(), flush=True)
sys.stdin.read()
"""
# The watch looks 5 and 100 ms after the driver was opened.
SETTLE_S = 0.5


def fake_files(tmp_path):
    driver = tmp_path / "lib" / "libcuda.so.1"
    driver.parent.mkdir()
    driver.write_bytes(b"\x7fELF" + bytes(4092))
    (driver.parent / "libcuda.so").symlink_to(driver.name)
    shim = tmp_path / "libclc_preload.so"
    shim.write_bytes(bytes(4096))
    return driver, shim


class Mapper:
    """A process that maps `paths`: a child of this one, or (orphan) one whose parent left."""

    def __init__(self, *paths, env=None, orphan=False):
        argv = [sys.executable, "-c", MAPPER, *map(str, paths)]
        if orphan:  # sh starts it in the background, on sh's stdin (not /dev/null), and leaves
            argv = ["sh", "-c", 'exec 3<&0; "$0" "$@" <&3 3<&- &', *argv]
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        word, pid = self.proc.stdout.readline().split()
        assert word == "mapped"
        self.pid = int(pid)
        if orphan:
            self.proc.wait(timeout=30)
            assert os.getpid() not in parents(self.pid)

    def end(self):
        self.proc.stdin.close()
        if self.proc.returncode is None:
            self.proc.wait(timeout=30)
        while os.path.exists(f"/proc/{self.pid}"):  # an orphan: gone once its stdin closed
            time.sleep(0.01)


def parents(pid):
    out = []
    while pid > 1:
        with open(f"/proc/{pid}/stat", "rb") as f:
            pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        out.append(pid)
    return out


def watched(driver, shim, fallback, *make):
    """run.unseen of a watch over `driver` while the processes `make` builds map files."""
    watch = DriverWatch({"LD_LIBRARY_PATH": str(driver.parent)}, fallback, shim)
    assert watch.problem is None and watch.files == [str(driver.resolve())]
    watch.start()
    procs = []
    try:
        procs = [m() for m in make]
        time.sleep(SETTLE_S)
        run = RunStatus()
        watch.finish(run)
    finally:
        watch.close()
        for p in procs:
            p.end()
    return {u.pid: u for u in run.unseen}, procs


def test_the_driver_is_found_where_the_program_loads_it(tmp_path):
    # GIVEN a driver library in a folder of the program's LD_LIBRARY_PATH, under two names
    driver, _ = fake_files(tmp_path)
    # THEN it is watched once, by its real path, and only where the program would load it
    files = driver_files({"LD_LIBRARY_PATH": f"/nonexistent:{driver.parent}"})
    assert files.count(str(driver.resolve())) == 1
    assert not any(f.startswith(str(tmp_path)) for f in driver_files({}))


def test_a_process_of_the_run_that_maps_the_driver_without_the_shim_is_named(tmp_path):
    # GIVEN processes of the run that load the driver: one without the shim, one with it
    driver, shim = fake_files(tmp_path)
    named, (bare, shimmed) = watched(driver, shim, f"deny {tmp_path}/status",
                                     lambda: Mapper(driver), lambda: Mapper(shim, driver))
    # THEN the one without the shim is named, as a process that loaded the driver
    assert bare.pid in named and shimmed.pid not in named, named
    assert named[bare.pid].how == "driver"
    assert named[bare.pid].path == os.path.realpath(sys.executable)


def test_a_process_that_left_the_tree_is_of_the_run_by_its_fallback(tmp_path):
    # GIVEN two processes out of clc-run's tree (their parent gone) that load the driver
    # without the shim: one carries this run's CLC_FALLBACK, the other another run's
    driver, shim = fake_files(tmp_path)
    fallback = f"deny {tmp_path}/status"
    named, (ours, other) = watched(
        driver, shim, fallback,
        lambda: Mapper(driver, env=dict(os.environ, CLC_FALLBACK=fallback), orphan=True),
        lambda: Mapper(driver, env=dict(os.environ, CLC_FALLBACK="deny /elsewhere/status"),
                       orphan=True))
    # THEN only this run's is named
    assert list(named) == [ours.pid], (named, ours.pid, other.pid)
