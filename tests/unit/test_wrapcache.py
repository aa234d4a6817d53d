# SPDX-License-Identifier: Apache-2.0
"""The caches of wrapped kernels: DiskCache (files, many processes), LibraryCache (threads),
and `clc cache`."""

import errno
import hashlib
import hmac
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

import clc.wrapping.disk_cache.store
from clc.cli.main import main
from clc.errors import ClcError
from clc.wrapping.cache import HEADER_SIZE, MAGIC, DiskCache, LibraryCache, cache_key

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_shared_cache(monkeypatch):
    monkeypatch.delenv("CLC_CACHE_SHARED_DIR", raising=False)


def key(n):
    return cache_key("test", str(n))


def age(cache, k, seconds_ago):
    t = time.time() - seconds_ago
    os.utime(cache.path(k), (t, t))


# --- cache_key -------------------------------------------------------------------------------

def test_key_is_sha256_hex_and_deterministic():
    k = cache_key(b"ptx", "wrapper", "sm_90")
    assert len(k) == 64 and all(c in "0123456789abcdef" for c in k)
    assert k == cache_key(b"ptx", "wrapper", "sm_90")


def test_key_parts_are_length_prefixed():
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key("abc") != cache_key("ab", "c")
    assert cache_key("a", "") != cache_key("a")
    assert cache_key("é") == cache_key("é".encode())


def test_key_rejects_other_types():
    with pytest.raises(TypeError):
        cache_key(90)


# --- DiskCache -------------------------------------------------------------------------------

def test_put_get_roundtrip_with_metadata(tmp_path):
    cache = DiskCache(tmp_path)
    k = key(1)
    meta = {"kernel": "_Z4axpyPfS_f", "wrapper": "persistent", "arch": "sm_90"}
    # WHEN an entry is stored
    assert cache.put(k, b"\x7fELF cubin", meta)
    # THEN it is a file named by its key, read back with its metadata
    assert pathlib.Path(cache.path(k)) == tmp_path / k[:2] / f"{k}.cubin"
    assert cache.path(k).endswith(".cubin")
    assert cache.get(k) == b"\x7fELF cubin"
    assert cache.get_entry(k) == (b"\x7fELF cubin", meta)
    assert cache.get(key(2)) is None
    assert cache.put(key(3), b"")
    assert cache.get_entry(key(3)) == (b"", {})
    stats = cache.stats()
    assert (stats["entries"], stats["hits"], stats["misses"], stats["stores"]) == (2, 3, 1, 2)


def test_file_format(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put(key(1), b"payload", {"arch": "sm_90"})
    blob = pathlib.Path(cache.path(key(1))).read_bytes()
    assert blob[:8] == MAGIC == b"CLCCUBN2"
    assert HEADER_SIZE == 84
    assert int.from_bytes(blob[72:80], "little") == 7
    meta_size = int.from_bytes(blob[80:84], "little")
    meta = blob[84:84 + meta_size]
    assert json.loads(meta) == {"arch": "sm_90"}
    assert blob[84 + meta_size:] == b"payload"
    # Both digests cover the format, the key, the lengths, the metadata and the payload: the
    # HMAC with the 32-byte key of the cache root, the sha256 without a key.
    signed = MAGIC + key(1).encode() + blob[72:84] + meta + b"payload"
    secret = (tmp_path / "key").read_bytes()
    assert len(secret) == 32
    assert blob[8:40] == hmac.new(secret, signed, hashlib.sha256).digest()
    assert blob[40:72] == hashlib.sha256(signed).digest()


@pytest.mark.parametrize("bad", ["", "ABC", "0" * 63, "g" * 64, "A" * 64, "../" + "0" * 61])
def test_bad_keys_are_refused(tmp_path, bad):
    with pytest.raises(ValueError):
        DiskCache(tmp_path).get(bad)


@pytest.mark.parametrize("damage", ["flip payload byte", "truncate", "bad magic", "extra byte",
                                    "bad metadata", "empty"])
def test_damaged_entry_is_a_miss_and_removed(tmp_path, damage):
    # GIVEN a stored entry, then damaged on disk
    cache = DiskCache(tmp_path)
    k = key(1)
    cache.put(k, bytes(range(256)) * 4, {"kernel": "k"})
    path = pathlib.Path(cache.path(k))
    blob = bytearray(path.read_bytes())
    if damage == "flip payload byte":
        blob[-100] ^= 1
    elif damage == "truncate":
        blob = blob[:-1]
    elif damage == "bad magic":
        blob[0:8] = b"CLCCUBN0"
    elif damage == "extra byte":
        blob += b"\0"
    elif damage == "bad metadata":
        blob[HEADER_SIZE] = ord("[")
    else:
        blob = b""
    path.write_bytes(bytes(blob))
    # WHEN it is read
    # THEN it is a miss, counted as corrupt, and the file is gone
    assert cache.get(k) is None
    assert not path.exists()
    assert cache.stats()["corrupt"] == 1
    assert cache.get(k) is None
    assert cache.stats()["corrupt"] == 1


def test_hit_refreshes_mtime(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put(key(1), b"x")
    age(cache, key(1), 1000)
    before = os.stat(cache.path(key(1))).st_mtime
    cache.get(key(1))
    assert os.stat(cache.path(key(1))).st_mtime > before + 900


def test_lru_eviction_honours_recency(tmp_path):
    # GIVEN a cap of three entries' worth, filled with 1 (oldest), 2, 3
    one = HEADER_SIZE + 1000
    cache = DiskCache(tmp_path, max_bytes=3 * one)
    for n in (1, 2, 3):
        assert cache.put(key(n), bytes([n]) * 1000)
        age(cache, key(n), 100 - n)
    # WHEN 1 is read (now most recent), then a fourth entry is stored
    assert cache.get(key(1)) is not None
    assert cache.put(key(4), b"4" * 1000)
    # THEN the least recently used, 2, is evicted
    assert [cache.get(key(n)) is not None for n in (1, 2, 3, 4)] == [True, False, True, True]
    assert cache.stats()["evictions"] == 1
    # AND a larger entry evicts as many as it needs, oldest first, never itself
    age(cache, key(1), 30)
    age(cache, key(3), 20)
    age(cache, key(4), 10)
    assert cache.put(key(5), b"5" * 1900)
    assert [cache.get(key(n)) is not None for n in (1, 3, 4, 5)] == [False, False, True, True]
    assert cache.stats()["bytes"] <= 3 * one


def test_entry_bigger_than_cap_is_not_stored(tmp_path):
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert cache.put(key(1), b"a" * 500)
    assert not cache.put(key(2), b"b" * 1000)
    assert cache.get(key(2)) is None
    assert cache.get(key(1)) == b"a" * 500
    assert cache.last_error is None


def test_stale_temp_files_are_cleaned_on_store(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put(key(1), b"x")
    directory = tmp_path / key(2)[:2]
    directory.mkdir(exist_ok=True)
    stale = directory / f".{key(2)}.123.abcdef.tmp"
    fresh = directory / f".{key(2)}.124.abcdef.tmp"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    t = time.time() - 7200
    os.utime(stale, (t, t))
    cache.put(key(3), b"y")
    assert not stale.exists() and fresh.exists()
    assert cache.stats()["entries"] == 2


def test_entries_and_clear(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put(key(1), b"abc", {"kernel": "k1"})
    cache.put(key(2), b"de")
    entries = {e.key: e for e in cache.entries()}
    assert set(entries) == {key(1), key(2)}
    assert entries[key(1)].metadata == {"kernel": "k1"} and entries[key(2)].metadata == {}
    assert entries[key(2)].size == HEADER_SIZE + 2
    assert cache.clear() == 2
    assert cache.entries() == [] and cache.clear() == 0
    assert DiskCache(tmp_path / "missing").stats()["entries"] == 0


def test_root_and_cap_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CLC_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("CLC_CACHE_MAX_BYTES", "64M")
    cache = DiskCache()
    assert cache.root == str(tmp_path / "c") and cache.max_bytes == 64 << 20
    monkeypatch.setenv("CLC_CACHE_MAX_BYTES", "12345")
    assert DiskCache().max_bytes == 12345
    monkeypatch.delenv("CLC_CACHE_DIR")
    monkeypatch.delenv("CLC_CACHE_MAX_BYTES")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cache = DiskCache()
    assert cache.root == str(tmp_path / "home" / ".cache" / "clc")
    assert cache.max_bytes == 1 << 30


@pytest.mark.parametrize("value", ["lots", "-5", "1.5G", "12 parsecs"])
def test_bad_cap_in_environment_is_a_clc_error(monkeypatch, value):
    monkeypatch.setenv("CLC_CACHE_MAX_BYTES", value)
    with pytest.raises(ClcError, match=f"CLC_CACHE_MAX_BYTES='{value}'"):
        DiskCache("/nonexistent")


def test_root_under_a_regular_file_never_raises(tmp_path):
    # GIVEN a cache root whose parent is a file, so no directory can be made
    (tmp_path / "file").write_bytes(b"")
    cache = DiskCache(tmp_path / "file" / "cache")
    # THEN put reports False, get a miss, and the reason is kept
    assert cache.put(key(1), b"x") is False
    assert cache.get(key(1)) is None
    assert "cannot" in cache.last_error and "file" in cache.last_error


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores file permissions")
def test_read_only_cache_never_raises(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put(key(1), b"x")
    directory = tmp_path / key(2)[:2]
    directory.mkdir(exist_ok=True)
    os.chmod(cache.path(key(1)), 0)
    directory.chmod(0o500)
    try:
        assert cache.get(key(1)) is None
        assert "Permission denied" in cache.last_error
        assert cache.put(key(2), b"y") is False
    finally:
        directory.chmod(0o700)
        os.chmod(cache.path(key(1)), 0o600)


def test_disk_full_leaves_no_temp_file(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path)

    def full(src, dst, **dir_fds):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(clc.wrapping.disk_cache.store.os, "replace", full)
    assert cache.put(key(1), b"x") is False
    assert "No space left" in cache.last_error
    assert sorted(tmp_path.rglob("*")) == [tmp_path / key(1)[:2], tmp_path / "key"]


WORKER = r"""
import hashlib, json, os, sys, time
from clc.wrapping.cache import DiskCache, cache_key

root, index, count, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
keys = [cache_key("concurrent", str(n)) for n in range(6)]

def payload(n):
    return hashlib.sha256(str(n).encode()).digest() * (40 + 25 * n)

# Start together: each announces itself, then waits for the others.
open(os.path.join(root, f"ready-{index}"), "w").close()
deadline = time.time() + 30
while len([f for f in os.listdir(root) if f.startswith("ready-")]) < count:
    if time.time() > deadline:
        sys.exit("the other workers never started")
    time.sleep(0.001)
cache = DiskCache(os.path.join(root, "cache"), max_bytes=4 * 32 * 140)
wrong = failed = hits = 0
for r in range(rounds):
    for i, k in enumerate(keys):
        n = (i + index) % len(keys)
        k = keys[n]
        failed += not cache.put(k, payload(n), {"kernel": f"k{n}"})
        got = cache.get(k)
        if got is not None:
            hits += 1
            wrong += got != payload(n)
print(json.dumps({"wrong": wrong, "failed": failed, "hits": hits, "corrupt": cache.corrupt,
                  "last_error": cache.last_error}))
"""


def test_many_processes_share_the_cache(tmp_path):
    # GIVEN 8 processes putting and getting the same 6 keys under a cap that holds about 4,
    # so that they also evict each other's entries
    count, rounds = 8, 50
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(i), str(count),
                               str(rounds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env, text=True)
             for i in range(count)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    # THEN every get returned the right bytes or nothing, nothing failed or was torn
    for r in results:
        assert r == {"wrong": 0, "failed": 0, "hits": r["hits"], "corrupt": 0,
                     "last_error": None}
    assert sum(r["hits"] for r in results) > 0
    # AND no temporary file is left, and the cap holds
    cache_dir = tmp_path / "cache"
    assert not [p for p in cache_dir.rglob("*") if p.name.endswith(".tmp")]
    cache = DiskCache(cache_dir, max_bytes=4 * 32 * 140)
    assert cache.stats()["bytes"] <= cache.max_bytes
    for e in cache.entries():
        n = [cache_key("concurrent", str(n)) for n in range(6)].index(e.key)
        assert cache.get(e.key) == hashlib.sha256(str(n).encode()).digest() * (40 + 25 * n)


# --- LibraryCache ----------------------------------------------------------------------------

class FakeDriver:
    """load/unload recorders for LibraryCache; handles are ("lib", key, n)."""

    def __init__(self, delay=0.0, fail=None):
        self.delay = delay
        self.fail = fail
        self.loads = []
        self.unloads = []
        self.lock = threading.Lock()

    def load(self, key, data):
        time.sleep(self.delay)
        with self.lock:
            self.loads.append(key)
            if self.fail:
                raise self.fail
            return ("lib", key, len(self.loads))

    def unload(self, handle):
        with self.lock:
            self.unloads.append(handle[1])


def test_concurrent_acquirers_share_one_load():
    # GIVEN a slow load and 16 threads asking for the same key at once
    driver = FakeDriver(delay=0.05)
    cache = LibraryCache(driver.load, driver.unload, max_bytes=1 << 20)
    data_calls = []
    barrier = threading.Barrier(16)
    handles = []

    def worker():
        barrier.wait()
        handles.append(cache.acquire("k", lambda: data_calls.append(1) or b"cubin"))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # THEN one load, one data_fn call, one handle, sixteen references
    assert driver.loads == ["k"] and data_calls == [1]
    assert len(handles) == 16 and len(set(handles)) == 1
    assert cache.refcount("k") == 16
    assert cache.stats() == {"loads": 1, "hits": 15, "unloads": 0, "bytes": 5, "entries": 1,
                             "max_bytes": 1 << 20}


def test_refcounts_keep_libraries_loaded():
    driver = FakeDriver()
    cache = LibraryCache(driver.load, driver.unload, max_bytes=10)
    h = cache.acquire("a", lambda: b"x" * 8)
    assert cache.acquire("a", lambda: pytest.fail("cached")) == h
    assert cache.refcount("a") == 2
    # WHEN a second library pushes the total over the cap while "a" is referenced
    cache.acquire("b", lambda: b"y" * 8)
    # THEN nothing is unloaded: both are in use
    assert driver.unloads == [] and cache.stats()["bytes"] == 16
    cache.release("a")
    assert driver.unloads == [] and cache.refcount("a") == 1
    # AND the first unreferenced one goes once it is released
    cache.release("a")
    assert driver.unloads == ["a"] and "a" not in cache and cache.refcount("a") is None
    assert cache.stats()["bytes"] == 8
    cache.release("b")
    assert "b" in cache and cache.refcount("b") == 0
    with pytest.raises(ValueError):
        cache.release("b")
    with pytest.raises(ValueError):
        cache.release("never")


def test_unreferenced_libraries_unload_least_recently_used_first():
    driver = FakeDriver()
    cache = LibraryCache(driver.load, driver.unload, max_bytes=30)
    for k in "abc":
        cache.acquire(k, lambda: b"z" * 10)
        cache.release(k)
    # WHEN "a" is used again, then "d" and "e" arrive
    cache.acquire("a", lambda: pytest.fail("cached"))
    cache.release("a")
    cache.acquire("d", lambda: b"z" * 10)
    cache.release("d")
    assert driver.unloads == ["b"]
    cache.acquire("e", lambda: b"z" * 10)
    # THEN the least recently used go first: b, then c
    assert driver.unloads == ["b", "c"]
    assert {k for k in "abcde" if k in cache} == {"a", "d", "e"}
    assert cache.stats()["unloads"] == 2 and cache.stats()["loads"] == 5


def test_failed_load_reaches_every_waiter_and_is_not_cached():
    driver = FakeDriver(delay=0.05, fail=RuntimeError("CUDA_ERROR_INVALID_IMAGE"))
    cache = LibraryCache(driver.load, driver.unload, max_bytes=1 << 20)
    barrier = threading.Barrier(8)
    errors = []

    def worker():
        barrier.wait()
        try:
            cache.acquire("k", lambda: b"bad")
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["CUDA_ERROR_INVALID_IMAGE"] * 8
    assert driver.loads == ["k"] and "k" not in cache
    # AND a later acquire tries again
    driver.fail = None
    assert cache.acquire("k", lambda: b"good")[1] == "k"
    assert driver.loads == ["k", "k"]


def test_failed_data_fn_is_not_cached():
    driver = FakeDriver()
    cache = LibraryCache(driver.load, driver.unload, max_bytes=100)

    def no_data():
        raise OSError("no PTX")

    with pytest.raises(OSError):
        cache.acquire("k", no_data)
    assert driver.loads == [] and "k" not in cache
    assert cache.acquire("k", lambda: b"ptx")


def test_close_unloads_everything():
    driver = FakeDriver()
    cache = LibraryCache(driver.load, driver.unload, max_bytes=100)
    cache.acquire("a", lambda: b"1")
    cache.acquire("b", lambda: b"2")
    cache.release("b")
    cache.close()
    assert sorted(driver.unloads) == ["a", "b"]
    assert cache.stats()["entries"] == 0 and cache.stats()["bytes"] == 0


def test_unload_failure_does_not_raise():
    def unload(handle):
        raise RuntimeError("context destroyed")

    cache = LibraryCache(lambda k, d: k, unload, max_bytes=100)
    cache.acquire("a", lambda: b"1")
    cache.close()
    assert "context destroyed" in cache.last_error


# --- clc cache -------------------------------------------------------------------------------

def test_cli_ls_stats_clear(tmp_path, capsys):
    # GIVEN a cache with two entries, one older
    cache = DiskCache(tmp_path)
    old, new = key(1), key(2)
    cache.put(old, b"a" * 2000, {"kernel": "_Z4axpyPfS_f", "wrapper": "persistent",
                                 "arch": "sm_90", "build_ms": 120})
    cache.put(new, b"b" * 10)
    age(cache, old, 7200)
    # WHEN listed: most recent first, key prefix, size, age, metadata
    assert main(["cache", "ls", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].split() == [new[:12], "94", "B", "0s", "ago"]
    assert lines[1].split() == [old[:12], "2.1", "KiB", "2h", "ago", "kernel=_Z4axpyPfS_f",
                                "wrapper=persistent", "arch=sm_90"]
    # AND as JSON
    assert main(["cache", "ls", "--json", "--dir", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert (listed["version"], listed["root"]) == (1, str(tmp_path))
    listed = listed["entries"]
    assert [e["key"] for e in listed] == [new, old]
    assert listed[1]["metadata"]["build_ms"] == 120 and listed[1]["size"] == 84 + 2000 + len(
        json.dumps({"arch": "sm_90", "build_ms": 120, "kernel": "_Z4axpyPfS_f",
                    "wrapper": "persistent"}, sort_keys=True))
    # WHEN counted
    assert main(["cache", "stats", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"root:      {tmp_path}" in out and "entries:   2" in out
    assert f"bytes:     {sum(e['size'] for e in listed)} " in out
    assert f"max_bytes: {1 << 30} (1.0 GiB)" in out
    assert main(["cache", "stats", "--json", "--dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 2
    # WHEN cleared
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"removed 2 entries from {tmp_path}\n"
    assert main(["cache", "ls", "--dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no entries" in captured.err


def test_cli_uses_environment_and_reports_bad_cap(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLC_CACHE_DIR", str(tmp_path))
    DiskCache().put(key(1), b"x")
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"removed 1 entry from {tmp_path}\n"
    monkeypatch.setenv("CLC_CACHE_MAX_BYTES", "huge")
    assert main(["cache", "stats"]) == 1
    assert "CLC_CACHE_MAX_BYTES='huge'" in capsys.readouterr().err
