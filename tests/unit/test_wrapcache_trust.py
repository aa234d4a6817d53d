# SPDX-License-Identifier: Apache-2.0
"""The disk cache on a machine shared with others: what it refuses to read, follow or trust,
the key that authenticates its entries, and the read-only shared cache that an admin fills."""

import hashlib
import json
import os
import pathlib
import shutil
import stat
import struct

import pytest

import alarms
import clc.wrapping.disk_cache.secret
import clc.wrapping.disk_cache.shared
import clc.wrapping.disk_cache.store
from clc.cli.main import main
from clc.wrapping.cache import HEADER_SIZE, MAGIC, DiskCache, cache_key

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_UID = 54321


def key(n):
    return cache_key("trust", str(n))


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(autouse=True)
def no_shared_cache(monkeypatch):
    monkeypatch.delenv("CLC_CACHE_SHARED_DIR", raising=False)


@pytest.fixture
def user(tmp_path):
    """A cache of this user's, with a list of what it said."""
    said = []
    cache = DiskCache(tmp_path / "cache", warn=said.append)
    cache.said = said
    return cache


def deadline(seconds):
    """Fail the test, rather than hang it, when the body blocks."""
    return alarms.deadline(seconds, AssertionError(f"blocked for more than {seconds} s"))


def forge(path, k, payload, metadata=b""):
    """Rewrite an entry as a neighbour would: same format, the sha256 recomputed over the new
    bytes, and the HMAC field kept from the genuine file (the neighbour has no key)."""
    blob = path.read_bytes()
    sizes = struct.pack("<QI", len(payload), len(metadata))
    signed = MAGIC + k.encode() + sizes + metadata + payload
    path.write_bytes(MAGIC + blob[8:40] + hashlib.sha256(signed).digest() + sizes + metadata +
                     payload)


# --- the files clc makes ---------------------------------------------------------------------

def test_root_subdirectories_key_and_entries_are_private(user):
    # WHEN the first entry is stored in a new cache
    assert user.put(key(1), b"cubin")
    root = pathlib.Path(user.root)
    # THEN the directories are 0700, the key and the entry 0600, all of them this user's
    assert mode(root) == 0o700 and mode(root / key(1)[:2]) == 0o700
    assert mode(root / "key") == 0o600 and len((root / "key").read_bytes()) == 32
    assert mode(user.path(key(1))) == 0o600
    assert {os.lstat(p).st_uid for p in [root, *root.rglob("*")]} == {os.geteuid()}
    assert user.said == []


def test_each_cache_root_has_its_own_key(tmp_path):
    a, b = DiskCache(tmp_path / "a"), DiskCache(tmp_path / "b", warn=lambda text: None)
    a.put(key(1), b"from a")
    b.put(key(1), b"from b")
    assert (tmp_path / "a" / "key").read_bytes() != (tmp_path / "b" / "key").read_bytes()
    # AND an entry copied from one cache to another does not authenticate there
    shutil.copyfile(a.path(key(1)), b.path(key(1)))
    assert b.get(key(1)) is None
    assert a.get(key(1)) == b"from a"


# --- authentication --------------------------------------------------------------------------

def test_rewritten_entry_is_rebuilt_and_reported_once(user):
    # GIVEN an entry rewritten by someone else, its sha256 recomputed over the new payload
    k = key(1)
    user.put(k, b"genuine cubin", {"kernel": "k"})
    forge(pathlib.Path(user.path(k)), k, b"evil cubin")
    # WHEN it is read
    # THEN it is a miss, removed, and said once
    assert user.get_entry(k) is None
    assert not os.path.lexists(user.path(k))
    assert user.said == [f"wrapped-kernel cache entry {user.path(k)} failed authentication: "
                         f"rebuilt"]
    # AND the rebuild takes its place and is served
    assert user.put(k, b"genuine cubin", {"kernel": "k"})
    assert user.get_entry(k) == (b"genuine cubin", {"kernel": "k"})
    # AND a second rewrite of the same entry is a miss again, without a second message
    forge(pathlib.Path(user.path(k)), k, b"evil again")
    assert user.get(k) is None
    assert len(user.said) == 1
    assert user.stats()["corrupt"] == 2


def test_entry_moved_to_another_key_fails_authentication(user):
    # GIVEN a genuine entry of one key copied over the entry of another
    user.put(key(1), b"one")
    user.put(key(2), b"two")
    shutil.copyfile(user.path(key(1)), user.path(key(2)))
    # THEN it does not authenticate under the other key
    assert user.get(key(2)) is None
    assert "failed authentication" in user.said[0]
    assert user.get(key(1)) == b"one"


def test_old_format_entries_are_replaced_without_a_message(user):
    k = key(1)
    user.put(key(2), b"x")   # makes the root and its key
    old = pathlib.Path(user.path(k))
    old.parent.mkdir(mode=0o700, exist_ok=True)
    old.write_bytes(b"CLCCUBN1" + bytes(44) + b"old")
    assert user.get(k) is None and not old.exists()
    assert user.said == []


# --- entries that are not regular files of this user ----------------------------------------

def test_fifo_at_a_key_does_not_block(user):
    # GIVEN a FIFO planted where an entry would be, with no writer
    k = key(1)
    user.put(key(2), b"x")
    fifo = pathlib.Path(user.path(k))
    fifo.parent.mkdir(mode=0o700, exist_ok=True)
    os.mkfifo(fifo)
    # WHEN it is read THEN the read returns at once, a miss, said once with the reason
    with deadline(10):
        assert user.get(k) is None
        assert user.get(k) is None
        entries = {e.key: e for e in user.entries()}
    assert user.said == [f"wrapped-kernel disk cache: ignored {fifo}, a FIFO, not a regular "
                         f"file: taken as missing (said once for entries like it)"]
    assert entries[k].problem == "a FIFO, not a regular file"
    # AND the rebuild replaces it
    assert user.put(k, b"cubin") and user.get(k) == b"cubin"


def test_symlink_at_a_key_is_not_followed(user, tmp_path):
    # GIVEN a genuine entry moved elsewhere and a symbolic link to it at its key (followed,
    # it would authenticate)
    k = key(1)
    user.put(k, b"cubin")
    elsewhere = tmp_path / "elsewhere.cubin"
    os.replace(user.path(k), elsewhere)
    os.symlink(elsewhere, user.path(k))
    # THEN it is a miss, and the file it points to is left alone
    assert user.get(k) is None
    assert "a symbolic link (not followed)" in user.said[0]
    assert elsewhere.read_bytes()[:8] == MAGIC
    assert os.path.islink(user.path(k))


@pytest.mark.parametrize("where", ["root", "subdirectory"])
def test_symlink_at_a_directory_turns_the_cache_off(tmp_path, where):
    # GIVEN the root, or one of its subdirectories, replaced by a link to a directory that
    # holds a genuine entry
    real = DiskCache(tmp_path / "real")
    k = key(1)
    real.put(k, b"cubin")
    said = []
    if where == "root":
        os.symlink(tmp_path / "real", tmp_path / "cache")
        shown = tmp_path / "cache"
    else:
        shutil.copytree(tmp_path / "real", tmp_path / "cache", symlinks=True)
        shutil.rmtree(tmp_path / "cache" / k[:2])
        os.symlink(tmp_path / "real" / k[:2], tmp_path / "cache" / k[:2])
        shown = tmp_path / "cache" / k[:2]
    before = sorted(p.name for p in (tmp_path / "real").rglob("*"))
    cache = DiskCache(tmp_path / "cache", warn=said.append)
    # WHEN it is read and written
    assert cache.get(k) is None
    assert cache.put(key(2), b"other") is False
    assert cache.put(k, b"cubin") is False
    # THEN nothing is read or written through the link, and the cache is off, said once
    assert sorted(p.name for p in (tmp_path / "real").rglob("*")) == before
    assert len(said) == 1
    assert said[0].startswith(f"the wrapped-kernel disk cache is off: {shown} is a symbolic "
                              f"link (not followed); kernels are built and not kept")
    assert cache.disabled == said[0]


def test_root_writable_by_others_turns_the_cache_off(tmp_path):
    # GIVEN a cache root that everyone may write into, as a shared /tmp-like directory
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o1777)
    said = []
    cache = DiskCache(root, warn=said.append)
    # WHEN kernels are stored and read
    for n in range(3):
        assert cache.put(key(n), b"cubin") is False
        assert cache.get(key(n)) is None
    # THEN nothing is written there, and the reason is said once
    assert list(root.iterdir()) == []
    assert said == [f"the wrapped-kernel disk cache is off: {root} is writable by group and "
                    f"others (mode 1777); kernels are built and not kept (chmod go-w {root}, "
                    f"or set CLC_CACHE_DIR to a directory that only you can write)"]


def test_subdirectory_writable_by_others_turns_the_cache_off(user):
    user.put(key(1), b"cubin")
    sub = pathlib.Path(user.path(key(1))).parent
    sub.chmod(0o777)
    assert user.get(key(1)) is None
    assert user.said and f"{sub} is writable by group and others (mode 0777)" in user.said[0]


def test_root_owned_by_another_user_turns_the_cache_off(user, monkeypatch):
    # GIVEN a cache made by one user WHEN another (a different effective uid) uses it
    user.put(key(1), b"cubin")
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    other = DiskCache(user.root, warn=user.said.append)
    # THEN it is refused, never read
    assert other.get(key(1)) is None and other.put(key(2), b"x") is False
    assert user.said == [f"the wrapped-kernel disk cache is off: {user.root} is owned by uid "
                         f"{me}, not by you (uid {me + 1}); kernels are built and not kept "
                         f"(set CLC_CACHE_DIR to a directory that only you can write)"]


def test_entry_writable_by_others_is_ignored_said_once(user):
    for n in (1, 2):
        user.put(key(n), b"cubin")
        os.chmod(user.path(key(n)), 0o666)
    assert user.get(key(1)) is None and user.get(key(2)) is None
    assert user.said == [f"wrapped-kernel disk cache: ignored {user.path(key(1))}, writable by "
                         f"group and others (mode 0666): taken as missing (said once for "
                         f"entries like it)"]
    assert user.stats()["refused"] == 2
    # AND the entries are left, as other files in a directory of this user's would be
    assert os.path.exists(user.path(key(1)))


@pytest.mark.skipif(not ROOT, reason="making a file of another user needs root")
def test_entry_owned_by_another_user_is_ignored(user):
    user.put(key(1), b"cubin")
    os.chown(user.path(key(1)), OTHER_UID, -1)
    assert user.get(key(1)) is None
    assert f"owned by uid {OTHER_UID}, not by you (uid {os.geteuid()})" in user.said[0]


# --- the key ---------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["readable by others", "symbolic link", "short"])
def test_a_key_that_others_could_know_or_change_turns_the_cache_off(user, tmp_path, damage):
    user.put(key(1), b"cubin")
    key_file = pathlib.Path(user.root) / "key"
    if damage == "readable by others":
        key_file.chmod(0o644)
        why = "open to others (mode 0644), and the key must be yours alone"
    elif damage == "symbolic link":
        os.replace(key_file, tmp_path / "key")
        os.symlink(tmp_path / "key", key_file)
        why = "a symbolic link (not followed)"
    else:
        key_file.write_bytes(b"short")
        why = "5 bytes long, not 32"
    cache = DiskCache(user.root, warn=user.said.append)
    assert cache.get(key(1)) is None and cache.put(key(2), b"x") is False
    assert user.said == [f"the wrapped-kernel disk cache is off: {key_file} is {why}; kernels "
                         f"are built and not kept (remove it: a new key is made, and every "
                         f"entry is rebuilt)"]


def test_processes_making_the_key_at_once_agree(tmp_path, monkeypatch):
    # GIVEN another process that makes the key between this one's look and its own attempt
    cache = DiskCache(tmp_path / "c")
    make = clc.wrapping.disk_cache.secret._make_secret
    first = []

    def racing(root_fd):
        make(root_fd)                   # the other process's key, which it may use at once
        first.append((tmp_path / "c" / "key").read_bytes())
        make(root_fd)                   # this one's: must not replace it
    monkeypatch.setattr(clc.wrapping.disk_cache.secret, "_make_secret", racing)
    assert cache.put(key(1), b"cubin")
    # THEN the first key stays, and no temporary file is left
    assert (tmp_path / "c" / "key").read_bytes() == first[0]
    assert [p.name for p in (tmp_path / "c").iterdir() if p.is_file()] == ["key"]
    monkeypatch.undo()
    assert DiskCache(tmp_path / "c").get(key(1)) == b"cubin"


# --- the size cap ----------------------------------------------------------------------------

def test_entry_larger_than_the_cap_is_never_read(user, monkeypatch):
    # GIVEN an entry stored under a large cap, read under a small one
    user.put(key(1), b"z" * 5000)
    said = []
    small = DiskCache(user.root, max_bytes=1000, warn=said.append)

    read_all = clc.wrapping.disk_cache.store.read_all

    def read_small(fd, size):
        assert size <= 1000, "read an entry larger than the cap"
        return read_all(fd, size)
    monkeypatch.setattr(clc.wrapping.disk_cache.store, "read_all", read_small)
    # THEN it is a miss without a read, said once
    assert small.get(key(1)) is None
    assert said == [f"wrapped-kernel disk cache: ignored {user.path(key(1))}, "
                    f"{HEADER_SIZE + 5000} bytes, more than the cache's cap of 1000: taken as "
                    f"missing (said once for entries like it)"]


# --- the shared cache ------------------------------------------------------------------------

@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A shared cache filled by its owner and opened for reading. pytest's directories lie
    under /tmp, which everyone may write, so the ancestors are checked from tmp_path down
    here; test_shared_cache_under_tmp_is_refused checks /tmp itself."""
    ancestors = clc.wrapping.disk_cache.shared._ancestors
    monkeypatch.setattr(clc.wrapping.disk_cache.shared, "_ancestors",
                        lambda path: [a for a in ancestors(path)
                                      if a.startswith(str(tmp_path))])
    root = tmp_path / "shared"
    admin = DiskCache(root, shared="")
    admin.put(key(1), b"admin cubin", {"kernel": "k"})
    for path in [root, *root.rglob("*")]:
        if path.name != "key":
            path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def test_shared_cache_serves_misses_and_is_never_written(tmp_path, shared):
    said = []
    cache = DiskCache(tmp_path / "mine", shared=shared, warn=said.append)
    before = {p: p.read_bytes() for p in shared.rglob("*") if p.is_file()}
    # WHEN the user's own cache misses THEN the shared entry is used
    assert cache.get_entry(key(1)) == (b"admin cubin", {"kernel": "k"})
    assert cache.stats()["shared_hits"] == 1
    # AND what the user builds goes to the user's own cache only
    assert cache.put(key(2), b"mine")
    assert {p: p.read_bytes() for p in shared.rglob("*") if p.is_file()} == before
    assert cache.get(key(2)) == b"mine" and os.path.exists(cache.path(key(2)))
    assert said == []


def test_shared_cache_from_the_environment(tmp_path, shared, monkeypatch):
    monkeypatch.setenv("CLC_CACHE_SHARED_DIR", str(shared))
    cache = DiskCache(tmp_path / "mine")
    assert cache.shared == str(shared) and cache.get(key(1)) == b"admin cubin"


def test_damaged_shared_entry_is_not_used(tmp_path, shared):
    path = shared / key(1)[:2] / f"{key(1)}.cubin"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    said = []
    cache = DiskCache(tmp_path / "mine", shared=shared, warn=said.append)
    assert cache.get(key(1)) is None and cache.get(key(1)) is None
    assert said == [f"shared wrapped-kernel cache entry {path} is damaged: not used"]
    assert path.exists()


def test_shared_entry_writable_by_others_is_not_used(tmp_path, shared):
    path = shared / key(1)[:2] / f"{key(1)}.cubin"
    path.chmod(0o666)
    said = []
    cache = DiskCache(tmp_path / "mine", shared=shared, warn=said.append)
    assert cache.get(key(1)) is None
    assert said == [f"shared wrapped-kernel cache: ignored {path}, writable by group and "
                    f"others (mode 0666): taken as missing (said once for entries like it)"]


@pytest.mark.skipif(not ROOT, reason="making a file of another user needs root")
def test_shared_entry_of_a_third_user_is_not_used(tmp_path, shared):
    path = shared / key(1)[:2] / f"{key(1)}.cubin"
    os.chown(path, OTHER_UID, -1)
    said = []
    cache = DiskCache(tmp_path / "mine", shared=shared, warn=said.append)
    assert cache.get(key(1)) is None
    owner = os.stat(shared).st_uid
    assert f"owned by uid {OTHER_UID}, not by root or uid {owner}" in said[0]


def test_shared_cache_under_tmp_is_refused(tmp_path):
    # GIVEN a shared cache in a directory that everyone may write (/tmp, above tmp_path):
    # anyone could have made it, and would then be its owner
    root = tmp_path / "shared"
    DiskCache(root, shared="").put(key(1), b"cubin")
    writable = next(a for a in clc.wrapping.disk_cache.shared._ancestors(str(root.resolve()))
                    if os.stat(a).st_mode & 0o022)
    said = []
    cache = DiskCache(tmp_path / "mine", shared=root, warn=said.append)
    # THEN it is not used, said once; the user's own cache goes on
    assert cache.get(key(1)) is None and cache.get(key(2)) is None
    assert len(said) == 1
    assert said[0].startswith(f"the shared wrapped-kernel cache {root} is not used: {writable} "
                              f"is writable by")
    assert cache.put(key(3), b"mine") and cache.get(key(3)) == b"mine"


# --- clc cache -------------------------------------------------------------------------------

def test_cli_missing_dir_is_an_error(tmp_path, capsys):
    assert main(["cache", "ls", "--dir", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err == f"clc: {tmp_path / 'missing'}: no such cache directory\n"
    assert not (tmp_path / "missing").exists()
    assert main(["cache", "clear", "--dir", str(tmp_path / "missing")]) == 1


def test_cli_refuses_a_directory_others_can_write(tmp_path, capsys):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o1777)
    assert main(["cache", "stats", "--dir", str(root)]) == 1
    assert capsys.readouterr().err == (
        f"clc: {root} is writable by group and others (mode 1777): the cache is not used "
        f"(chmod go-w {root}, or set CLC_CACHE_DIR to a directory that only you can write)\n")


def test_cli_ls_marks_entries_that_would_not_be_used(user, capsys):
    # GIVEN a good entry, an entry others can write, and a rewritten one
    good, loose, forged = key(1), key(2), key(3)
    for k in (good, loose, forged):
        user.put(k, b"cubin", {"kernel": "k"})
    os.chmod(user.path(loose), 0o666)
    forge(pathlib.Path(user.path(forged)), forged, b"evil", json.dumps({"kernel": "k"},
                                                                        sort_keys=True).encode())
    # WHEN listed THEN the loose one is marked; the forged one only when verified
    assert main(["cache", "ls", "--json", "--dir", user.root]) == 0
    problems = {e["key"]: e["problem"] for e in json.loads(capsys.readouterr().out)["entries"]}
    assert problems == {good: None, loose: "writable by group and others (mode 0666)",
                        forged: None}
    assert main(["cache", "ls", "--verify", "--dir", user.root]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines[good[:12]].endswith("ago  kernel=k")
    # (a file that is not trusted is not opened, so its metadata is not shown)
    assert lines[loose[:12]].endswith("ago  (not used: writable by group and others "
                                      "(mode 0666))")
    assert lines[forged[:12]].endswith("kernel=k (not used: failed authentication (rebuilt at "
                                       "its next use))")
