# SPDX-License-Identifier: Apache-2.0
"""Which libcupti clc-run names to the shim (clc/runtime/cupti.py)."""

from clc.runtime import cupti


def test_cuda_home_comes_first(tmp_path, monkeypatch):
    # GIVEN a toolkit at CUDA_HOME with its libcupti where the toolkit keeps it
    lib = tmp_path / "extras" / "CUPTI" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libcupti.so.13").write_bytes(b"")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    # THEN that one is named, by its real path
    assert cupti.find_cupti() == str((lib / "libcupti.so.13").resolve())


def test_newer_toolkits_are_looked_at_first():
    dirs = ["/usr/local/cuda-9.2", "/usr/local/cuda-13.0", "/usr/local/cuda-12.8"]
    assert sorted(dirs, key=cupti._version, reverse=True) == [
        "/usr/local/cuda-13.0", "/usr/local/cuda-12.8", "/usr/local/cuda-9.2"]


def test_events_name_no_library():
    assert cupti.timing_settings("events", "/x/libcupti.so") == {"CLC_TIMING": "events"}
    assert cupti.timing_settings("cupti", "/x/libcupti.so") == {
        "CLC_TIMING": "cupti", "CLC_CUPTI": "/x/libcupti.so"}
