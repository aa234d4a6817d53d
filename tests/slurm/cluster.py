# SPDX-License-Identifier: Apache-2.0
"""A real Slurm cluster on localhost for the tests: munged, slurmctld and one slurmd per node
(nodes n1, n2, ... on this one machine, each slurmd on a port of its own), started from a
generated configuration with every file under one directory, and stopped with everything they
started.

Needs root (slurmd starts tasks as their users), Slurm's daemons and client, and munge
(tests/slurm/install-packages.sh installs them where it can). Clients reach the cluster
through SLURM_CONF alone: `AuthInfo=socket=` names the cluster's own munge socket for the
daemons and the clients alike.
"""

import glob
import grp
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "munge", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue",
            "scancel")


def missing():
    """Why a cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the cluster's daemons need root"
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (tests/slurm/install-packages.sh)"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root, plugstack=(), nodes=2, cpus=2):
        self.root = Path(root)
        self.plugstack = list(plugstack)
        self.procs = []
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}
        # cgroup.conf's lines, where this Slurm needs one (None: none written)
        self.cgroup = _cgroup_conf()

    # ---- up and down --------------------------------------------------------------------

    def start(self, timeout=60):
        r = self.root
        for d in ("", "log", "state", "spool"):
            (r / d).mkdir(exist_ok=True)
            os.chmod(r / d, 0o755)
        self._start_munge()
        ports = set()
        while len(ports) < 1 + len(self.nodes):
            ports.add(_free_port())
        ctld, *node_ports = sorted(ports)
        (r / "slurm.conf").write_text("\n".join([
            "ClusterName=clctest", "SlurmctldHost=localhost", f"SlurmctldPort={ctld}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
            "CredType=cred/munge", f"AuthInfo=socket={r}/munge/munge.socket",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd.%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log", f"SlurmdLogFile={r}/log/slurmd.%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info", f"PlugStackConfig={r}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "MpiDefault=none",
            *_switch_none(), "MailProg=/bin/true",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none", "ReturnToService=2", "InactiveLimit=0",
            "KillWait=5", "MinJobAge=300",
            # the nodes as configured, not as probed: CPUs even on a machine with fewer
            "SlurmdParameters=config_overrides",
            *(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} "
              f"CPUs={self.cpus} State=UNKNOWN" for n, port in zip(self.nodes, node_ports)),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
        self.set_plugstack(self.plugstack)
        os.chmod(r / "slurm.conf", 0o644)
        if self.cgroup is not None:
            (r / "cgroup.conf").write_text("".join(f"{line}\n" for line in self.cgroup))
            os.chmod(r / "cgroup.conf", 0o644)
        for n in self.nodes:
            (r / "spool" / n).mkdir(exist_ok=True)
        for name, argv in (("slurmctld", ["slurmctld", "-D", "-i", "-f", f"{r}/slurm.conf"]),
                           *((f"slurmd.{n}", ["slurmd", "-D", "-f", f"{r}/slurm.conf", "-N", n])
                             for n in self.nodes)):
            out = open(r / "log" / f"{name}.out", "w")
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout
        while True:
            state = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env,
                                   capture_output=True, text=True).stdout.split()
            if state == ["idle"] * len(self.nodes):
                return self
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up ({', '.join(dead) or state!r}):"
                                   f"\n{self.logs()}")
            time.sleep(0.2)

    def _start_munge(self):
        m = self.root / "munge"
        m.mkdir(exist_ok=True)
        user = "munge" if _user_exists("munge") else "root"
        pw = pwd.getpwnam(user)
        os.chown(m, pw.pw_uid, pw.pw_gid)
        os.chmod(m, 0o755)  # the socket is reached by every user's clients
        key = m / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chown(key, pw.pw_uid, pw.pw_gid)
        os.chmod(key, 0o400)
        subprocess.run(["runuser", "-u", user, "--", "munged", f"--socket={m}/munge.socket",
                        f"--key-file={key}", f"--pid-file={m}/munged.pid",
                        f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"],
                       check=True, capture_output=True, timeout=30)
        for _ in range(200):
            if (m / "munge.socket").exists() and (m / "munged.pid").exists():
                return
            time.sleep(0.05)
        raise RuntimeError(f"munged did not start: {(m / 'munged.log').read_text()[-2000:]}")

    def set_plugstack(self, lines):
        """plugstack.conf's lines; slurmstepd reads the file again for every step."""
        self.plugstack = list(lines)
        path = self.root / "plugstack.conf"
        path.write_text("".join(f"{line}\n" for line in self.plugstack))
        os.chmod(path, 0o644)

    def stop(self):
        subprocess.run(["scancel", "--user=root"], env=self.env, capture_output=True)
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        pid_file = self.root / "munge" / "munged.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass

    def logs(self):
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"== {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    # ---- jobs ---------------------------------------------------------------------------

    def _as(self, user, argv):
        return argv if user is None else ["runuser", "-u", user, "--", *argv]

    def srun(self, *args, user=None, env=None, timeout=120, cwd=None):
        """srun ARGS as `user` (root when None): the CompletedProcess."""
        argv = self._as(user, ["env", f"SLURM_CONF={self.env['SLURM_CONF']}", "srun",
                               *map(str, args)])
        return subprocess.run(argv, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, cwd=cwd or self.root)

    def sbatch(self, script, *args, user=None, env=None, timeout=120, cwd=None, script_args=()):
        """Submits `script` (text) with sbatch --wait ARGS, given `script_args`; (CompletedProcess,
        job id, the job's output text)."""
        cwd = Path(cwd or self.root)
        path = cwd / f"job{time.monotonic_ns()}.sh"
        path.write_text(script)
        os.chmod(path, 0o755)
        out = cwd / f"{path.stem}.out"
        argv = self._as(user, ["env", f"SLURM_CONF={self.env['SLURM_CONF']}", "sbatch",
                               "--wait", "--parsable", f"--output={out}", *map(str, args),
                               str(path), *map(str, script_args)])
        proc = subprocess.run(argv, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, cwd=cwd)
        job = proc.stdout.strip().split(";")[0]
        text = out.read_text(errors="replace") if out.exists() else ""
        return proc, job, text


def slurm_version():
    """(major, minor) of the installed slurmd, or None."""
    try:
        out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2])) if m else None


def _cgroup_conf():
    """From 23.11 slurmd sets up a cgroup for its steps whatever the plugins, through systemd's
    dbus with cgroup/v2, and fails where there is none (a container); cgroup/v1's plugin, with
    no cgroup plugin of the steps' configured, starts there (tried on Ubuntu 24.04's 23.11.4;
    `CgroupPlugin=disabled` is not in 23.11)."""
    version = slurm_version()
    if version is None or version < (23, 11):
        return None
    return ["CgroupPlugin=cgroup/v1"]


def _switch_none():
    """SwitchType=switch/none where this Slurm has that plugin (23.11 dropped it: no
    SwitchType is no switch)."""
    dirs = glob.glob("/usr/lib/*/slurm-wlm") + glob.glob("/usr/lib*/slurm")
    if dirs and not any(os.path.exists(os.path.join(d, "switch_none.so")) for d in dirs):
        return []
    return ["SwitchType=switch/none"]


def _user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def ensure_user(name):
    """A local user for jobs (made with useradd when missing): (uid, gid)."""
    if not _user_exists(name):
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True,
                       capture_output=True)
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


def group_name(gid):
    return grp.getgrgid(gid).gr_name
