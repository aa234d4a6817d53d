# SPDX-License-Identifier: Apache-2.0
"""A node's captures, counted per job, user, tenant, GPU and kernel, as Prometheus metrics for
node_exporter's textfile collector (`clc metrics`, docs/deploy.md).

Each capture's RUN record says its tenant, its user's uid and its labels (the Slurm plugin's
launcher gives `job`, `step` and `task`); its DEVICE records each device's UUID; its kernels'
counts are the shim's last snapshot (written every second while the process runs, and at its
exit), so a node's running jobs are counted too. Labels that DCGM's exporter has are named as
it names them, so that the series join with its own: `Hostname`, `hpc_job` (not `job`, which
Prometheus sets to the scrape's job), `UUID` (the GPU, not its ordinal in the process, which
CUDA_VISIBLE_DEVICES makes 0 in every job); the rest are clc's own (docs/metrics.md).

The prometheus_client library makes the text (its collectors and exposition format).
"""

import dataclasses
import pwd
import socket
from collections import defaultdict

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from clc import abi

__all__ = ["Tally", "OTHER_KERNELS", "DEFAULT_MAX_KERNELS", "RUN_LABELS", "registry"]

OTHER_KERNELS = "(other)"  # the kernel label of the kernels past the cap, counted together
DEFAULT_MAX_KERNELS = 100
DEFAULT_MAX_JOBS = 1000    # distinct (job, user, tenant) on a node, at most
OTHER = ("(other)", "(other)", "(other)")  # job, user, tenant of the runs past that cap


@dataclasses.dataclass(slots=True)
class KernelCounts(abi.Counters):
    """A kernel's counters (abi.KERNEL_COUNTERS, the shim's list) summed over captures, and
    its launches confined to a green context's SMs."""

    confined: int = 0

    @classmethod
    def of(cls, stats):
        """The counts of a capture's KernelStatsRecord."""
        counts = cls(**{c: getattr(stats, c) for c in abi.KERNEL_COUNTERS})
        counts.confined = stats.launches if stats.confined_sms else 0
        return counts

    def add(self, other):
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclasses.dataclass
class HeldCounts:
    holds: int = 0
    held_ns: int = 0


LABEL_MAX = 128     # characters of a job, user or tenant label value
KERNEL_MAX = 512    # of a kernel's name
GPU_MAX = 64        # distinct GPUs on a node; those past it are counted as UUID="(other)"
# The labels of every series but clc_jobs_folded's, DCGM's names where it has them.
RUN_LABELS = ["Hostname", "hpc_job", "user", "tenant"]


def _label(value, limit=LABEL_MAX):
    text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError, OverflowError):
        return str(uid)


class Tally:
    """Counts added capture by capture (add), then folded to at most max_kernels kernels per
    job (fold) and turned into metric families (families)."""

    def __init__(self, hostname=None, max_kernels=DEFAULT_MAX_KERNELS,
                 max_jobs=DEFAULT_MAX_JOBS):
        self.hostname = hostname or socket.gethostname().split(".")[0]
        self.max_kernels = max_kernels
        self.max_jobs = max_jobs
        self.jobs_folded = 0  # (job, user, tenant) counted together as OTHER
        # (job, user, tenant) -> GPU UUID -> kernel -> KernelCounts
        self.kernels = defaultdict(lambda: defaultdict(lambda: defaultdict(KernelCounts)))
        self.held = defaultdict(lambda: defaultdict(HeldCounts))  # (job, user, tenant) -> gpu
        self.processes = defaultdict(int)  # (job, user, tenant) -> captures read
        self.partial = defaultdict(int)  # (job, user, tenant) -> those that lost records
        self.folded = {}  # (job, user, tenant) -> kernels counted as OTHER_KERNELS
        self.uuids = set()  # the GPUs named so far, at most GPU_MAX

    def add(self, capture, owner_uid=None, job=None):
        """One capture. The user is the file's owner (owner_uid) where known, not what the
        file says (its writer may say anything); the job is `job` where the caller knows it
        (the Slurm plugin's directory), else the run's `job` label; the tenant is the run's.
        Label values are cut to LABEL_MAX characters."""
        run = capture.run or {}
        labels = run.get("labels") if isinstance(run.get("labels"), dict) else {}
        uid = owner_uid if owner_uid is not None else run.get("uid")
        key = (_label(job if job is not None else labels.get("job", "")),
               _label(_user(uid) if uid is not None else ""), _label(run.get("tenant", "")))
        self.processes[key] += 1
        self.partial[key] += capture.partial
        for kernel_id, st in capture.stats.items():
            k = capture.kernel(kernel_id)
            gpu = self._gpu(capture, k.device)
            counts = self.kernels[key][gpu][_label(k.name, KERNEL_MAX)]
            counts.add(KernelCounts.of(st))
        for h in capture.holds:
            held = self.held[key][self._gpu(capture, h.device)]
            held.holds += 1
            held.held_ns += h.held_ns

    def _gpu(self, capture, device):
        """The UUID label of a capture's device ordinal: its DEVICE record's UUID, "" where it
        has none (a shim or driver that did not say), "(other)" past GPU_MAX distinct GPUs (a
        capture's writer may name any number)."""
        uuid = capture.devices.get(device, "")
        if uuid and uuid not in self.uuids:
            if len(self.uuids) >= GPU_MAX:
                return "(other)"
            self.uuids.add(uuid)
        return uuid

    def fold_jobs(self):
        """The (job, user, tenant) past max_jobs, those with the fewest launches, counted
        together as OTHER, their kernels as OTHER_KERNELS; how many were folded."""
        keys = set(self.kernels) | set(self.held) | set(self.processes)
        if len(keys) <= self.max_jobs:
            return 0

        def launches(key):
            return sum(c.launches for k in self.kernels.get(key, {}).values() for c in k.values())
        keep = set(sorted(keys, key=lambda k: (-launches(k), k))[:self.max_jobs - 1])
        for key in [k for k in keys if k not in keep]:
            for gpu, kernels in self.kernels.pop(key, {}).items():
                for c in kernels.values():
                    self.kernels[OTHER][gpu][OTHER_KERNELS].add(c)
            for gpu, h in self.held.pop(key, {}).items():
                self.held[OTHER][gpu].holds += h.holds
                self.held[OTHER][gpu].held_ns += h.held_ns
            self.processes[OTHER] += self.processes.pop(key, 0)
            self.partial[OTHER] += self.partial.pop(key, 0)
            self.jobs_folded += 1
        return self.jobs_folded

    def fold(self):
        """Each job's kernels past max_kernels (those with the fewest launches on the node)
        counted together as OTHER_KERNELS; {key: how many were folded} for the jobs where it
        happened."""
        for key, gpus in self.kernels.items():
            if key == OTHER:
                continue
            names = defaultdict(int)
            for kernels in gpus.values():
                for name, c in kernels.items():
                    names[name] += c.launches
            if len(names) <= self.max_kernels:
                continue
            keep = set(sorted(names, key=lambda n: (-names[n], n))[:self.max_kernels - 1])
            for gpu, kernels in gpus.items():
                other = KernelCounts()
                for name in [n for n in kernels if n not in keep]:
                    other.add(kernels.pop(name))
                if other.launches or other.denied:
                    kernels[OTHER_KERNELS].add(other)
            self.folded[key] = len(names) - len(keep)
        return dict(self.folded)

    def families(self):
        base = RUN_LABELS
        launches = CounterMetricFamily(
            "clc_launches", "Kernel launches clc saw (allowed, denied or confined)",
            labels=base + ["UUID", "kernel"])
        denied = CounterMetricFamily("clc_launches_denied", "Kernel launches a policy refused",
                                     labels=base + ["UUID", "kernel"])
        confined = CounterMetricFamily(
            "clc_launches_confined", "Kernel launches run on a share of the SMs (sm_share)",
            labels=base + ["UUID", "kernel"])
        gpu_time = CounterMetricFamily(
            "clc_kernel_gpu_seconds", "GPU time of the timed launches (policies with time)",
            labels=base + ["UUID", "kernel"])
        holds = CounterMetricFamily(
            "clc_holds", "Times a best-effort process was held for latency-critical work",
            labels=base + ["UUID"])
        held = CounterMetricFamily("clc_held_seconds", "Time best-effort processes were held",
                                   labels=base + ["UUID"])
        procs = GaugeMetricFamily("clc_processes", "Processes (captures) counted",
                                  labels=base)
        partial = GaugeMetricFamily(
            "clc_captures_partial", "Captures counted that lost records (size cap, full "
            "buffers, write errors): their counts are whole", labels=base)
        folded = GaugeMetricFamily(
            "clc_kernels_folded", f"Kernels of a job counted together as kernel="
            f"\"{OTHER_KERNELS}\" (past the cap on distinct kernels per job)", labels=base)
        for key, gpus in sorted(self.kernels.items()):
            for gpu, kernels in sorted(gpus.items()):
                for name, c in sorted(kernels.items()):
                    values = [self.hostname, *key, gpu, name]
                    launches.add_metric(values, c.launches)
                    denied.add_metric(values, c.denied)
                    if c.confined:
                        confined.add_metric(values, c.confined)
                    if c.timed:
                        gpu_time.add_metric(values, c.gpu_ns / 1e9)
        for key, gpus in sorted(self.held.items()):
            for gpu, h in sorted(gpus.items()):
                holds.add_metric([self.hostname, *key, gpu], h.holds)
                held.add_metric([self.hostname, *key, gpu], h.held_ns / 1e9)
        for key, n in sorted(self.processes.items()):
            procs.add_metric([self.hostname, *key], n)
            partial.add_metric([self.hostname, *key], self.partial.get(key, 0))
        for key, n in sorted(self.folded.items()):
            folded.add_metric([self.hostname, *key], n)
        jobs = GaugeMetricFamily(
            "clc_jobs_folded", "Runs (job, user, tenant) counted together as job, user and "
            "tenant \"(other)\" (past the cap on distinct runs per node)", labels=["Hostname"])
        jobs.add_metric([self.hostname], self.jobs_folded)
        return [launches, denied, confined, gpu_time, holds, held, procs, partial, folded, jobs]


class _Families:
    def __init__(self, families):
        self._families = families

    def collect(self):
        return iter(self._families)


def registry(tally):
    """A prometheus_client registry holding the tally's families."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Families(tally.families()))
    return reg
