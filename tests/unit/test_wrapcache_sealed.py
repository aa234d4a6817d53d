# SPDX-License-Identifier: Apache-2.0
"""The wrap disk cache of a program under clc-run is clc-run's choice: its place, shared place
and cap are resolved once from clc-run's environment and sealed into the program's settings,
and nothing the program does to its own environment moves them."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from clc.errors import EXIT_USAGE, ClcError
from clc.policy import parse_policy
from clc.runtime import engine as runtime_engine
from clc.runtime.engine import Engine
from clc.runtime.shim import preload_environment, preload_path
from clc.wrapping.cache import CACHE_SETTINGS, DiskCache, cache_key, cache_settings

POLICY_JSON = parse_policy("version: 1\ndefault: allow\n").to_json()


def clc_run_command():
    script = pathlib.Path(sys.executable).parent / "clc-run"
    return [str(script)] if script.exists() else [sys.executable, "-m", "clc", "run"]


@pytest.fixture
def program_environment(tmp_path, monkeypatch):
    """What a program sets in its own environment to move the cache: every variable that
    the environment-based cache reads, $HOME (the default root's ~) and its directory."""
    evil = tmp_path / "evil"
    monkeypatch.setenv("CLC_CACHE_DIR", str(evil / "cache"))
    monkeypatch.setenv("CLC_CACHE_SHARED_DIR", str(evil / "shared"))
    monkeypatch.setenv("CLC_CACHE_MAX_BYTES", "7")
    monkeypatch.setenv("HOME", str(evil / "home"))
    return evil


# ---- clc-run's side: resolved once, from clc-run's environment --------------------------------

def test_cache_settings_are_absolute_and_resolved_from_the_given_environment(tmp_path,
                                                                            monkeypatch):
    # GIVEN clc-run's environment, and a process environment that says otherwise
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/elsewhere")
    environ = {"HOME": str(tmp_path / "home"), "CLC_CACHE_DIR": "rel/cache",
               "CLC_CACHE_SHARED_DIR": "~/shared", "CLC_CACHE_MAX_BYTES": "64M"}
    # THEN each value is made absolute from the given environment and clc-run's directory
    assert cache_settings(environ) == {
        "CLC_CACHE_DIR": str(tmp_path / "rel" / "cache"),
        "CLC_CACHE_SHARED_DIR": str(tmp_path / "home" / "shared"),
        "CLC_CACHE_MAX_BYTES": str(64 << 20)}
    # AND without them: ~/.cache/clc of the given $HOME, no shared cache, 1 GiB
    assert cache_settings({"HOME": str(tmp_path / "home")}) == {
        "CLC_CACHE_DIR": str(tmp_path / "home" / ".cache" / "clc"),
        "CLC_CACHE_SHARED_DIR": "", "CLC_CACHE_MAX_BYTES": str(1 << 30)}
    assert tuple(cache_settings({})) == CACHE_SETTINGS


def test_a_bad_cap_is_a_usage_error_of_clc_run():
    with pytest.raises(ClcError, match="CLC_CACHE_MAX_BYTES='huge'") as e:
        cache_settings({"CLC_CACHE_MAX_BYTES": "huge"})
    assert e.value.exit_code == EXIT_USAGE


def test_the_engine_reads_the_cache_names_from_the_sealed_settings():
    # clc.runtime.engine lists them without importing clc.wrapping.cache: the two must agree
    assert runtime_engine._CACHE_SETTINGS == CACHE_SETTINGS


@pytest.mark.skipif(preload_path() is None, reason="the shim is not built (pip install .)")
def test_preload_environment_seals_the_cache(tmp_path):
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
            "CLC_CACHE_DIR": str(tmp_path / "c"), "CLC_CACHE_MAX_BYTES": "2G"}
    _, settings = preload_environment(base, policy_json=POLICY_JSON, on_error="allow",
                                      output="")
    assert {k: settings[k] for k in CACHE_SETTINGS} == {
        "CLC_CACHE_DIR": str(tmp_path / "c"), "CLC_CACHE_SHARED_DIR": "",
        "CLC_CACHE_MAX_BYTES": str(2 << 30)}
    with pytest.raises(ClcError, match="CLC_CACHE_MAX_BYTES"):
        preload_environment(dict(base, CLC_CACHE_MAX_BYTES="1.5G"), policy_json=POLICY_JSON,
                            on_error="allow", output="")


# ---- the program's side: only the sealed settings count ---------------------------------------

def sealed(tmp_path):
    return {"CLC_CACHE_DIR": str(tmp_path / "sealed"),
            "CLC_CACHE_SHARED_DIR": str(tmp_path / "sealed-shared"),
            "CLC_CACHE_MAX_BYTES": "1048576"}


def test_from_settings_ignores_the_environment(tmp_path, program_environment):
    # GIVEN a process environment that names another cache, and the sealed settings
    cache = DiskCache.from_settings(sealed(tmp_path))
    # THEN the cache is the sealed one
    assert (cache.root, cache.shared, cache.max_bytes) == (
        str(tmp_path / "sealed"), str(tmp_path / "sealed-shared"), 1 << 20)
    # AND an empty shared setting means none, not "ask the environment"
    cache = DiskCache.from_settings(dict(sealed(tmp_path), CLC_CACHE_SHARED_DIR=""))
    assert cache.shared is None
    assert cache.put(cache_key("sealed"), b"abc")
    assert os.listdir(tmp_path / "sealed") and not program_environment.exists()


@pytest.mark.parametrize("change, error", [
    ({"CLC_CACHE_DIR": None}, "lack CLC_CACHE_DIR"),
    ({"CLC_CACHE_DIR": "relative"}, "CLC_CACHE_DIR='relative' is not an absolute path"),
    ({"CLC_CACHE_DIR": ""}, "CLC_CACHE_DIR='' is not an absolute path"),
    ({"CLC_CACHE_SHARED_DIR": "rel"}, "CLC_CACHE_SHARED_DIR='rel' is not an absolute path"),
    ({"CLC_CACHE_MAX_BYTES": "1G"}, "CLC_CACHE_MAX_BYTES='1G' is not a number of bytes"),
])
def test_from_settings_refuses_settings_clc_run_would_not_make(tmp_path, change, error):
    settings = {k: v for k, v in {**sealed(tmp_path), **change}.items() if v is not None}
    with pytest.raises(ValueError, match=error):
        DiskCache.from_settings(settings)


def test_an_engine_with_sealed_settings_keeps_its_cache(tmp_path, program_environment):
    # GIVEN an engine made from settings that fix the cache
    engine = Engine({"CLC_POLICY": POLICY_JSON, **sealed(tmp_path)})
    # WHEN the program changes its environment before its first wrapped kernel
    os.environ["CLC_CACHE_DIR"] = str(program_environment / "later")
    # THEN the wrap engine's disk cache is the sealed one
    disk = engine.wrapping()._cache()
    assert (disk.root, disk.shared, disk.max_bytes) == (
        str(tmp_path / "sealed"), str(tmp_path / "sealed-shared"), 1 << 20)


def test_sealed_settings_without_the_cache_turn_it_off(monkeypatch, capsys, program_environment):
    # GIVEN settings from the shim that do not name the cache
    monkeypatch.setattr(runtime_engine, "shim_settings", lambda: {"CLC_POLICY": POLICY_JSON})
    engine = Engine()
    # THEN there is no disk cache (the environment, the program's, is not asked), said once
    assert engine.wrapping()._cache() is None
    assert engine.wrapping()._cache() is None
    err = capsys.readouterr().err
    assert err.count("the wrapped-kernel disk cache is off: clc-run's settings lack "
                     "CLC_CACHE_DIR, CLC_CACHE_SHARED_DIR, CLC_CACHE_MAX_BYTES") == 1
    assert not program_environment.exists()


def test_settings_handed_in_without_the_cache_use_the_environment(tmp_path, monkeypatch):
    # GIVEN an engine made outside clc-run (no sealed settings), as `clc wrap` and tests do
    monkeypatch.setenv("CLC_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.delenv("CLC_CACHE_SHARED_DIR", raising=False)
    monkeypatch.delenv("CLC_CACHE_MAX_BYTES", raising=False)
    engine = Engine({"CLC_POLICY": POLICY_JSON})
    # THEN the environment says where the cache is
    assert engine.wrapping()._cache().root == str(tmp_path / "env")


PROGRAM = """\
import json, os, sys
evil = sys.argv[1]
os.environ["CLC_CACHE_DIR"] = os.path.join(evil, "cache")
os.environ["CLC_CACHE_SHARED_DIR"] = os.path.join(evil, "shared")
os.environ["CLC_CACHE_MAX_BYTES"] = "7"
os.environ["HOME"] = os.path.join(evil, "home")
os.chdir(sys.argv[2])
from clc.runtime.engine import Engine
from clc.wrapping.cache import cache_key
disk = Engine().wrapping()._cache()
stored = disk.put(cache_key("from the program"), b"a cubin")
print(json.dumps({"root": disk.root, "shared": disk.shared, "max_bytes": disk.max_bytes,
                  "stored": stored}))
"""


@pytest.mark.skipif(preload_path() is None, reason="the shim is not built (pip install .)")
def test_a_program_under_clc_run_cannot_move_the_cache(tmp_path):
    # GIVEN clc-run started in tmp_path with a relative cache directory, a shared one and a cap
    env = dict(os.environ, CLC_CACHE_DIR="sealed", CLC_CACHE_SHARED_DIR=str(tmp_path / "sh"),
               CLC_CACHE_MAX_BYTES="1M")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    evil = tmp_path / "evil"
    # WHEN the program sets every cache variable, $HOME and its directory, then makes the
    # engine (as the bridge does, from the settings the shim copied) and stores an entry
    proc = subprocess.run(clc_run_command() + ["--no-capture", "-q", "--", sys.executable,
                                               "-c", PROGRAM, str(evil), str(elsewhere)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # THEN the cache is where clc-run resolved it, and the entry is there
    seen = json.loads(proc.stdout)
    assert seen == {"root": str(tmp_path / "sealed"), "shared": str(tmp_path / "sh"),
                    "max_bytes": 1 << 20, "stored": True}
    assert os.listdir(tmp_path / "sealed")
    assert not evil.exists() and not os.listdir(elsewhere)


@pytest.mark.skipif(preload_path() is None, reason="the shim is not built (pip install .)")
def test_a_bad_cap_stops_clc_run_before_the_program_starts(tmp_path):
    marker = tmp_path / "ran"
    proc = subprocess.run(clc_run_command() + ["--no-capture", "--", "touch", str(marker)],
                          env=dict(os.environ, CLC_CACHE_MAX_BYTES="12 parsecs"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_USAGE
    assert "CLC_CACHE_MAX_BYTES='12 parsecs': expected a number of bytes" in proc.stderr
    assert not marker.exists()
