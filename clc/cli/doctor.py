# SPDX-License-Identifier: Apache-2.0
"""`clc doctor`: what clc needs, found or not, one line each."""

import ctypes
import ctypes.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile

from clc import __version__, words
from clc.runtime.shim import PACKAGE, bridge_path, libpython_path, preload_path

# the task launcher, beside the plugin (shim/slurm/clc_slurm_exec.c)
LAUNCHER = "clc-slurm-exec"

__all__ = ["DoctorCommand", "driver_status", "initialized_driver", "slurm_status"]


def initialized_driver():
    """(libcuda, None) once cuInit succeeded, else (None, why not)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return None, f"no NVIDIA driver (libcuda.so.1 not loadable: {e})"
    rc = cuda.cuInit(0)
    if rc != 0:
        return None, f"libcuda loaded but cuInit failed (CUresult {rc})"
    return cuda, None


def driver_status():
    """(ok, text) for the NVIDIA driver: version and GPUs, or why there is none."""
    cuda, why = initialized_driver()
    if cuda is None:
        return False, why
    version = ctypes.c_int()
    count = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    cuda.cuDeviceGetCount(ctypes.byref(count))
    names = []
    for i in range(count.value):
        dev = ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(dev), i) == 0:
            cuda.cuDeviceGetName(name, 256, dev)
            names.append(f"{i}: {name.value.decode(errors='replace')}")
    v = version.value
    gpus = words.count(count.value, "GPU")
    return True, f"CUDA driver API {v // 1000}.{v % 1000 // 10}, {gpus}: " + (
        "; ".join(names) or "none")


_CU_DEV_RESOURCE_TYPE_SM = 1
_RESOURCE_BYTES = 144  # CUdevResource_v1: the type, 92 bytes of padding, then the SM resource


def partition_status():
    """(ok, text): whether the GPUs can be partitioned by SMs (green contexts, which sm_share
    confines kernels with), their SM count and the partition step, per device."""
    cuda, _ = initialized_driver()
    if cuda is None:
        return False, "no driver"
    if not hasattr(cuda, "cuDeviceGetDevResource"):
        return False, "this driver has no green contexts (CUDA 12.4 or later has them): " \
            "sm_share needs the splice (mechanism: splice)"
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    parts, ok = [], True
    for i in range(count.value):
        resource = (ctypes.c_uint * (_RESOURCE_BYTES // 4))()
        rc = cuda.cuDeviceGetDevResource(i, resource, _CU_DEV_RESOURCE_TYPE_SM)
        if rc != 0:
            ok = False
            parts.append(f"{i}: cannot be partitioned (CUresult {rc})")
            continue
        sms, step = resource[24], resource[25]
        parts.append(f"{i}: {sms} SMs in steps of {step}")
    return ok and bool(parts), "green contexts: " + ("; ".join(parts) or "no GPU")


def mps_status():
    """(running, text): whether an MPS control daemon runs where clc-run would join one
    (priority.mps: clc/runtime/mps.py), which shares across processes need (without it the GPU
    time-slices between processes' contexts)."""
    from clc.runtime import mps
    explicit = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    ours = mps.clc_pipe_dir(os.environ)
    places = mps.places(os.environ)
    control = shutil.which("nvidia-cuda-mps-control")
    for pipe in places:
        try:
            if pipe == ours and not explicit and not mps.ours_intact(ours):
                continue
        except mps.MpsProblem as e:
            return False, f"{e}: clc-run does not look under it"
        if not os.path.exists(os.path.join(pipe, "control")):
            continue
        if control is None:
            return True, (f"an MPS daemon is running ({pipe}; no nvidia-cuda-mps-control on "
                          "PATH to ask it): shares hold across processes")
        try:
            found = mps.find_daemon(control, pipe)
        except mps.MpsProblem as e:
            return False, f"{e}: clc-run does not join it"
        if found is not None:
            return True, (f"an MPS daemon is running ({pipe}, {len(found.servers)} servers): "
                          "shares hold across processes")
    return False, (f"no MPS daemon ({' or '.join(places)}): a share holds within a program, "
                   "but processes' contexts time-slice, so shares across processes cannot hold"
                   " (priority.mps: start has clc-run start one)")


def _library(names):
    """Where a library is found, or None."""
    for name in names:
        found = ctypes.util.find_library(name)
        try:
            ctypes.CDLL(found or f"lib{name}.so")
            return f"found ({found or f'lib{name}.so'})"
        except OSError:
            continue
    try:
        from cuda.bindings import nvjitlink, nvrtc  # noqa: F401

        return "found (through cuda-bindings)"
    except Exception:
        return None


# ---- Slurm: what the plugin takes, and what a job's user can run ----------------------------

# the user that stands for a job's when doctor runs as root: in no group of root's
JOB_USER = "nobody"


def _others(mode, bits):
    """Whether `mode` gives other users (not the owner, not its group) the access `bits`, of
    os.R_OK and os.X_OK."""
    want = (stat.S_IROTH if bits & os.R_OK else 0) | (stat.S_IXOTH if bits & os.X_OK else 0)
    return mode & want == want


def _ancestors(path):
    """The directories above `path`, from /: those of the path as written (which a link may
    leave for another tree) and those of its real path."""
    out = []
    for p in (os.path.abspath(path), os.path.realpath(path)):
        parts = p.split("/")[1:-1]
        out += ["/" + "/".join(parts[:i]) for i in range(len(parts) + 1)]
    return list(dict.fromkeys(out))


def closed_to_others(path, bits):
    """The first thing that keeps other users from `path` with the access `bits`: a directory
    above it they cannot enter, or the file's own mode; None when nothing does."""
    for d in _ancestors(path):
        try:
            mode = os.stat(d).st_mode
        except OSError as e:
            return f"{d}: {e.strerror}"
        if not _others(mode, os.X_OK):
            return f"{d} (mode {stat.S_IMODE(mode):04o}) cannot be entered by other users"
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except OSError as e:
        return f"{real}: {e.strerror}"
    if not _others(mode, bits):
        what = "run" if bits & os.X_OK else "read"
        return f"{real} (mode {stat.S_IMODE(mode):04o}) cannot be {what} by other users"
    return None


def _package_closed(package):
    """The first directory or file of clc's package that other users cannot list or read."""
    why = closed_to_others(package, os.R_OK | os.X_OK)
    if why:
        return why
    for top, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # Python does without them
        for name in dirs + files:
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            if not _others(mode, os.R_OK | (os.X_OK if stat.S_ISDIR(mode) else 0)):
                return f"{path} (mode {stat.S_IMODE(mode):04o}) cannot be read by other users"
    return None


def not_roots(path):
    """What the plugin finds wrong with `path` as a file of clc's (shim/slurm/clc_spank.c,
    admin_owned): each part of it root's, the file regular and writable by nobody else, the
    directories writable by nobody else unless sticky; None when nothing is."""
    want = "expected a file owned by root and writable by nobody else, through such directories"
    parts = path.split("/")[1:]
    for i in range(len(parts)):
        p = "/" + "/".join(parts[:i + 1])
        try:
            st = os.lstat(p)
        except OSError as e:
            return f"{p}: {e.strerror}"
        loose = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        last = i == len(parts) - 1
        if st.st_uid != 0 or (last and (not stat.S_ISREG(st.st_mode) or loose)) or \
                (not last and (not stat.S_ISDIR(st.st_mode) or
                               (loose and not st.st_mode & stat.S_ISVTX))):
            return f"{path}: {want} ({p} is not)"
    return None


def _fails_as_job_user(python, launcher):
    """Why JOB_USER cannot start a task as the plugin does (clc-slurm-exec, then clc-run from
    clc's Python, isolated, on a program, with the libraries a task's programs load); None when
    it can, or when there is no such user to try."""
    try:
        pw = pwd.getpwnam(JOB_USER)
    except KeyError:
        return None
    run = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], cwd="/", capture_output=True,
               text=True, timeout=120, env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                                            "LANG": "C.UTF-8"})
    with tempfile.TemporaryDirectory(prefix="clc-doctor-") as top:
        os.chmod(top, 0o755)
        policy = os.path.join(top, "policy.yaml")
        with open(policy, "w") as f:
            f.write("version: 1\ndefault: allow\n")
        os.chmod(policy, 0o644)
        bridge = bridge_path()
        steps = [([launcher], lambda p: "CLC_SLURM_FD is not set" in p.stderr),
                 ([python, "-I", "-m", "clc", "run", "--policy", policy, "--no-capture",
                   "--no-report", "--", "/bin/true"], lambda p: p.returncode == 0 and not p.stderr)]
        if bridge:  # loaded into a task's program at its first launch
            steps.append(([python, "-I", "-c", f"open({str(bridge)!r}, 'rb').close()"],
                          lambda p: p.returncode == 0))
        for argv, started in steps:
            try:
                p = subprocess.run(argv, **run)
            except OSError as e:
                return f"{argv[0]}: {e.strerror}, as user {JOB_USER}"
            except subprocess.TimeoutExpired:
                return f"{argv[0]} did not finish in 120 s, as user {JOB_USER}"
            if not started(p):
                last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
                return f"{' '.join(argv[:4])} fails as user {JOB_USER}: {last}"
    return None


def slurm_status(python=None, package=None):
    """(ok, text) for the SPANK plugin: its plugstack.conf line, where the plugin takes this
    installation and a job's user can run it (tried as JOB_USER when doctor runs as root, else
    read from the files' modes); else why not."""
    python = python or sys.executable
    package = package or PACKAGE
    plugin, launcher = os.path.join(package, "libclc_spank.so"), os.path.join(package, LAUNCHER)
    if not os.path.exists(plugin):
        return False, ("SPANK plugin not built (spank.h was missing when clc was installed: "
                       "install libslurm-dev, then clc)")
    why = (not_roots(os.path.realpath(python)) or not_roots(launcher) or
           closed_to_others(python, os.X_OK) or closed_to_others(launcher, os.X_OK) or
           _package_closed(package) or
           (_fails_as_job_user(python, launcher) if os.geteuid() == 0 else None))
    if why:
        return False, (f"jobs cannot run this clc: {why}; under the plugin every task would "
                       "stop. Install clc into a Python every user can run, in root's "
                       "directories (docs/deploy.md)")
    return True, (f"plugstack.conf: required {plugin} policy=/etc/clc/policy.yaml "
                  f"python={python} (docs/deploy.md)")


class DoctorCommand:
    name = "doctor"
    help = "check the driver, the GPUs, the shim, the bridge and the JIT libraries"

    @staticmethod
    def add_arguments(parser):
        pass

    def run(self, args):
        ok = True

        def line(name, good, text, optional=False):
            nonlocal ok
            ok = ok and (good or optional)
            mark = "ok  " if good else "-   " if optional else "FAIL"
            print(f"{mark} {name:<11} {text}")

        line("clc", True, f"{__version__} on Python {sys.version.split()[0]} ({sys.executable})")
        good, text = driver_status()
        line("driver", good, text)
        preload = preload_path()
        if preload:
            env = dict(os.environ, LD_PRELOAD=str(preload))
            probe = subprocess.run(["/bin/true"], env=env, capture_output=True, text=True)
            good = probe.returncode == 0 and not probe.stderr
            line("shim", good, f"{preload} " + ("loads" if good else f"fails: {probe.stderr}"))
        else:
            line("shim", False, "not built (pip install . builds it)")
        bridge = bridge_path()
        line("bridge", bridge is not None,
             f"{bridge} (Python {sys.version_info.major}.{sys.version_info.minor})" if bridge
             else "not built for this Python")
        good, text = partition_status()
        line("partitions", good, text, optional=True)
        good, text = mps_status()
        line("MPS", good, text, optional=True)
        lib = libpython_path()
        line("libpython", True, f"{lib} (C and C++ programs can be decided)" if lib else
             "none: this Python has no shared library, so only Python programs of this "
             "version can be decided")
        for name, lib in (("nvJitLink", "nvJitLink"), ("NVRTC", "nvrtc")):
            found = _library([lib])
            line(name, found is not None, f"{found or 'not found'} (needed by wrap rules only)",
                 optional=True)
        good, text = slurm_status()
        line("Slurm", good, text, optional=True)
        return 0 if ok else 1
