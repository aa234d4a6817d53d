# SPDX-License-Identifier: Apache-2.0
"""Every task of every job step under clc, through the SPANK plugin, on a real Slurm cluster
(munged, slurmctld and two slurmd, nodes n1 and n2, started here on localhost) over the fake
driver of tests/fixtures/native.

The programs are tests/fixtures/native's: prog_cudart launches vecAdd 5 times, scale twice and
debug_kernel once (the fake driver prints its own counts at exit: `fake: NAME launches=N`);
prog_linked, linked with an rpath to the fake, launches debug_kernel twice.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "native"))

from build import build_native  # noqa: E402
from cluster import Cluster, ensure_user  # noqa: E402
from harness import DENY_DEBUG_ONLY  # noqa: E402

from clc.capture.reader import read_captures  # noqa: E402

USER = "clcslurm"

# tests/integration's deny-debug policy (debug kernels refused), and one tenant refused all
POLICY = DENY_DEBUG_ONLY.replace("default: allow\n", "default: allow\non_error: deny\n") + """\
  - name: blocked-tenant
    match: {tenant: blocked}
    action: deny
"""


@pytest.fixture(scope="module")
def site(clc_for_jobs):
    """A directory every user can read: the fake driver and programs, the administrator's
    policy, the captures' directory and the cluster's files; and clc, installed where every
    user can run it."""
    top = Path(tempfile.mkdtemp(prefix="clc-slurm-"))
    os.chmod(top, 0o755)
    native = build_native(top / "native")
    for d in (top / "native", top / "etc", top / "captures", top / "jobs"):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755)
    os.chmod(top / "jobs", 0o1777)  # where jobs of any user write their scripts and output
    (top / "etc" / "policy.yaml").write_text(POLICY)
    os.chmod(top / "etc" / "policy.yaml", 0o644)
    yield {"top": top, "native": native, "clc": clc_for_jobs}
    shutil.rmtree(top, ignore_errors=True)


def plugstack(site, **extra):
    args = {"policy": site["top"] / "etc" / "policy.yaml", "python": site["clc"].python,
            "captures": site["top"] / "captures", "tenant": "account", **extra}
    return f"required {site['clc'].plugin} " + " ".join(f"{k}={v}" for k, v in args.items()
                                                        if v is not None)


@pytest.fixture(scope="module")
def cluster(site):
    (site["top"] / "cluster").mkdir()
    c = Cluster(site["top"] / "cluster", [plugstack(site)])
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


@pytest.fixture
def line(cluster, site):
    """The plugstack.conf line, put back after a test that changes it."""
    yield
    cluster.set_plugstack([plugstack(site)])


def plain(mangled):
    """A kernel's own name from its mangled one: debug_kernel from _Z12debug_kernelPi."""
    m = re.match(r"_Z(\d+)", mangled)
    return mangled[m.end():m.end() + int(m[1])] if m else mangled


def fake_counts(text):
    """[{kernel: launches}] per process that printed the fake driver's counts; lines of srun
    --label ("0: fake: ...") are grouped by their task."""
    runs = {}
    for m in re.finditer(r"^(?:(\d+): )?fake: (\S+) launches=(\d+)", text, re.M):
        task = runs.setdefault(m[1], [{}])
        if m[2] in task[-1]:  # the same task's next process
            task.append({})
        task[-1][plain(m[2])] = int(m[3])
    return [counts for task in runs.values() for counts in task]


def new_job_dir(site, before):
    dirs = {p for p in (site["top"] / "captures").iterdir()} - before
    assert len(dirs) == 1, dirs
    return dirs.pop()


def denied_by_kernel(path):
    (cap,) = read_captures([str(path)])
    return {plain(cap.kernel(k).mangled): s.denied for k, s in cap.stats.items()}


def env(site, **more):
    return {"LD_LIBRARY_PATH": str(site["native"]["libcuda"].parent), **more}


def test_every_task_of_a_step_runs_under_the_policy(cluster, site):
    before = set((site["top"] / "captures").iterdir())
    p = cluster.srun("-n2", "--label", "--account=research", site["native"]["prog_cudart"],
                     env=env(site))
    assert p.returncode == 0, p.stderr + cluster.logs()
    runs = fake_counts(p.stdout)
    assert len(runs) == 2, p.stdout
    for counts in runs:  # debug_kernel refused in both tasks, the rest launched
        assert counts["debug_kernel"] == 0 and counts["vecAdd"] == 5, counts
    job = new_job_dir(site, before)
    assert sorted(f.name for f in job.iterdir()) == ["0.0.clc", "0.1.clc"]
    for f in job.iterdir():  # its launch and the graph node it was set into
        assert denied_by_kernel(f)["debug_kernel"] == 2
        (cap,) = read_captures([str(f)])
        assert cap.run == {"tenant": "research", "uid": 0, "labels": {
            "job": job.name, "step": "0", "task": f.name.split(".")[1]}}
    assert (job.stat().st_uid, job.stat().st_mode & 0o777) == (0, 0o700)
    # the node's metrics: this job's two tasks, counted under its account
    m = subprocess.run([sys.executable, "-m", "clc", "metrics", site["top"] / "captures"],
                       capture_output=True, text=True, timeout=60)
    assert m.returncode == 0, m.stderr
    got = {(s.name, s.labels.get("hpc_job"), s.labels.get("tenant"), s.labels.get("kernel")):
           s.value for fam in text_string_to_metric_families(m.stdout) for s in fam.samples}
    assert got[("clc_launches_denied_total", job.name, "research", "debug_kernel(int*)")] == 4
    assert got[("clc_processes", job.name, "research", None)] == 2


def test_a_step_spanning_nodes_runs_under_clc_on_each(cluster, site):
    before = set((site["top"] / "captures").iterdir())
    p = cluster.srun("-N2", "-n2", "--label", "--account=research",
                     site["native"]["prog_cudart"], env=env(site))
    assert p.returncode == 0, p.stderr
    runs = fake_counts(p.stdout)
    assert len(runs) == 2 and all(r["debug_kernel"] == 0 and r["vecAdd"] == 5 for r in runs)
    job = new_job_dir(site, before)
    for node in ("n1", "n2"):  # one task on each node's slurmd
        log = (cluster.root / "log" / f"slurmd.{node}.log").read_text()
        assert f"launch task StepId={job.name}.0 " in log, node
    assert sorted(f.name for f in job.iterdir()) == ["0.0.clc", "0.1.clc"]


def test_the_tenant_is_the_jobs_account_whatever_its_environment_says(cluster, site):
    blocked = cluster.srun("--account=blocked", site["native"]["prog_cudart"],
                           env=env(site, CLC_TENANT="research", SLURM_JOB_ACCOUNT="research"))
    assert blocked.returncode == 0, blocked.stderr
    (counts,) = fake_counts(blocked.stdout)
    assert counts["vecAdd"] == 0 and counts["scale"] == 0, counts
    fine = cluster.srun("--account=research", site["native"]["prog_cudart"],
                        env=env(site, CLC_TENANT="blocked", SLURM_JOB_ACCOUNT="blocked"))
    (counts,) = fake_counts(fine.stdout)
    assert counts["vecAdd"] == 5 and counts["debug_kernel"] == 0, counts


def test_a_batch_script_and_the_steps_it_starts(cluster, site):
    before = set((site["top"] / "captures").iterdir())
    prog, jobs = site["native"]["prog_cudart"], site["top"] / "jobs"
    script = f"#!/bin/sh\n{prog} > {jobs}/batch.txt\nsrun --output={jobs}/step.txt {prog}\n"
    proc, job_id, out = cluster.sbatch(script, "--account=research", env=env(site), cwd=jobs)
    assert proc.returncode == 0, proc.stderr + out + cluster.logs()
    for name in ("batch.txt", "step.txt"):
        (counts,) = fake_counts((jobs / name).read_text())
        assert counts["debug_kernel"] == 0 and counts["vecAdd"] == 5, counts
    job = new_job_dir(site, before)
    assert job.name == job_id
    # the batch step's shell launched nothing: the capture is its child's
    (batch,) = job.glob("batch.0.child-*.clc")
    assert sorted(f.name for f in job.iterdir()) == ["0.0.clc", batch.name]
    assert denied_by_kernel(batch)["debug_kernel"] == 2


def test_a_batch_scripts_arguments_are_its_own(cluster, site):
    """The batch step comes from the controller, never as --multi-prog: an argument that reads
    as a configuration's line stays an argument."""
    jobs = site["top"] / "jobs"
    prog = site["native"]["prog_cudart"]
    proc, _, out = cluster.sbatch(f"#!/bin/sh\necho \"args: $1\"\n{prog}\n", env=env(site),
                                  cwd=jobs, script_args=["0 an-argument"])
    assert proc.returncode == 0, proc.stderr + out
    assert "args: 0 an-argument" in out
    (counts,) = fake_counts(out)
    assert counts["debug_kernel"] == 0 and counts["vecAdd"] == 5, counts


def test_job_arrays_write_a_directory_per_array_task(cluster, site):
    before = set((site["top"] / "captures").iterdir())
    prog = site["native"]["prog_cudart"]
    proc, _, _ = cluster.sbatch(f"#!/bin/sh\n{prog}\n", "--array=0-1", "--account=research",
                                env=env(site), cwd=site["top"] / "jobs")
    assert proc.returncode == 0, proc.stderr
    dirs = {p for p in (site["top"] / "captures").iterdir()} - before
    assert len(dirs) == 2 and all(len(list(d.glob("batch.0.child-*.clc"))) == 1 for d in dirs)


def test_a_program_that_clears_its_environment_stays_under_the_policy(cluster, site):
    lib = site["native"]["libcuda"].parent
    p = cluster.srun("env", "-i", f"LD_LIBRARY_PATH={lib}", site["native"]["prog_cudart"],
                     env=env(site))
    (counts,) = fake_counts(p.stdout)
    assert counts["debug_kernel"] == 0 and counts["vecAdd"] == 5, p.stdout + p.stderr


def test_export_none_stays_under_the_policy(cluster, site):
    p = cluster.srun("--export=NONE", site["native"]["prog_linked"])
    (counts,) = fake_counts(p.stdout)
    assert counts["debug_kernel"] == 0 and counts["vecAdd"] == 3, p.stdout + p.stderr


# srun --multi-prog configurations, each accepted by srun, that give tasks 0 and 1 prog_cudart
# (PROG), with the configuration file's mode
MULTI_PROG = {
    "comments": ("# two ranks\n\n0 PROG\n1 PROG\n", 0o644),
    "an executable file": ("0 PROG\n1 PROG\n", 0o755),
    "CRLF, a blank first line": ("\r\n0 PROG\r\n1 PROG\r\n", 0o644),
    "a form feed before the ranks": ("\f0-1 PROG\n", 0o644),
    "a comma before the ranks": (",0,1 PROG\n", 0o644),
    "a comment continued onto the next line": ("# ranks \\\nnot a line\n0-1 PROG\n", 0o644),
    "star, quotes and %t": ("* 'PROG' %t\n", 0o644),
}


@pytest.mark.parametrize("text,mode", MULTI_PROG.values(), ids=MULTI_PROG.keys())
def test_a_multi_prog_step_is_refused_not_run_without_clc(cluster, site, text, mode):
    conf = site["top"] / "jobs" / "multi.conf"
    conf.write_text(text.replace("PROG", str(site["native"]["prog_cudart"])), newline="")
    os.chmod(conf, mode)
    p = cluster.srun("-n2", "--multi-prog", conf, env=env(site))
    assert p.returncode != 0 and "fake:" not in p.stdout, p.stdout
    for task in (0, 1):  # each task, told on the job's standard error
        assert re.search(rf"clc: srun --multi-prog steps cannot run under clc: line \d+ of this "
                         rf"step's configuration \({re.escape(str(conf))}\) gives task {task} "
                         "a program",
                         p.stderr), p.stderr


def test_a_step_whose_argument_reads_as_a_multi_prog_configuration(cluster, site):
    """The plugin cannot tell a step's own arguments from the configuration text of a
    --multi-prog step: an argument that gives this task a line is refused, one that gives it
    none runs under clc."""
    prog = site["native"]["prog_cudart"]
    p = cluster.srun(prog, "0 looks-like-a-line", env=env(site))
    assert p.returncode != 0 and "fake:" not in p.stdout, p.stdout
    assert f"line 1 of this step's configuration ({prog}) gives task 0 a program" in p.stderr
    p = cluster.srun(prog, "1 for-another-task", env=env(site))
    assert p.returncode == 0, p.stderr
    (counts,) = fake_counts(p.stdout)
    assert counts["debug_kernel"] == 0 and counts["vecAdd"] == 5, counts


def _prolog(site, name, lines):
    path = site["top"] / "jobs" / name
    path.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    os.chmod(path, 0o755)
    return path


def test_a_task_prolog_cannot_hand_the_task_other_settings(cluster, site):
    """A user's --task-prolog runs after the plugin and may set the task's environment: a
    CLC_SLURM_FD that names anything but the plugin's sealed settings stops the task."""
    prolog = _prolog(site, "fd.sh", ["export CLC_SLURM_FD=0"])
    p = cluster.srun(f"--task-prolog={prolog}", site["native"]["prog_cudart"], env=env(site))
    assert p.returncode != 0 and "fake:" not in p.stdout
    assert "clc-slurm-exec: CLC_SLURM_FD names no settings of the clc SPANK plugin" in p.stderr


def test_python_and_loader_variables_of_the_job_do_not_reach_clc(cluster, site):
    """PYTHONPATH cannot put another `clc` in clc-run's place (Python runs isolated), and the
    job's LD_PRELOAD reaches the program, not clc."""
    evil = site["top"] / "jobs" / "evil" / "clc"
    evil.mkdir(parents=True, exist_ok=True)
    (evil / "__init__.py").write_text("raise SystemExit('the job replaced clc')\n")
    (evil / "__main__.py").write_text("raise SystemExit('the job replaced clc')\n")
    prolog = _prolog(site, "py.sh", [f"export PYTHONPATH={evil.parent}",
                                     f"export PYTHONHOME={evil.parent}"])
    p = cluster.srun(f"--task-prolog={prolog}", site["native"]["prog_cudart"], env=env(site))
    assert "the job replaced clc" not in p.stderr
    (counts,) = fake_counts(p.stdout)
    assert counts["debug_kernel"] == 0, p.stdout + p.stderr


def test_a_jobs_own_policy_is_refused_unless_the_administrator_allows_it(cluster, site, line):
    mine = site["top"] / "jobs" / "mine.yaml"
    mine.write_text("version: 1\ndefault: allow\n")
    p = cluster.srun(f"--clc-policy={mine}", site["native"]["prog_cudart"], env=env(site))
    assert p.returncode != 0 and "fake:" not in p.stdout
    assert "this cluster runs jobs under its administrator's policy only" in \
        p.stderr + cluster.logs()
    cluster.set_plugstack([plugstack(site, user_policy=1)])
    p = cluster.srun(f"--clc-policy={mine}", site["native"]["prog_cudart"], env=env(site))
    (counts,) = fake_counts(p.stdout)
    assert counts["debug_kernel"] == 1, p.stdout + p.stderr


def test_hook_files_of_a_job_are_refused_unless_allowed(cluster, site):
    hooks = site["top"] / "jobs" / "hooks.py"
    hooks.write_text("import clc\n")
    p = cluster.srun(f"--clc-hooks={hooks}", site["native"]["prog_cudart"], env=env(site))
    assert p.returncode != 0 and "fake:" not in p.stdout
    assert "this cluster does not take hook files from jobs" in p.stderr + cluster.logs()


def test_strict_fails_a_task_whose_launches_were_denied(cluster, site, line):
    cluster.set_plugstack([plugstack(site, strict=1)])
    p = cluster.srun(site["native"]["prog_cudart"], env=env(site))
    (counts,) = fake_counts(p.stdout)
    assert counts["debug_kernel"] == 0
    assert p.returncode == 3, p.stderr  # the program exited 0; clc-run --strict: 3


def test_strict_without_captures_is_a_mistake_of_the_line(cluster, site, line):
    cluster.set_plugstack([plugstack(site, strict=1, captures=None)])
    p = cluster.srun(site["native"]["prog_cudart"], env=env(site))
    assert p.returncode != 0 and "fake:" not in p.stdout
    assert "strict=1 needs captures=DIR" in p.stderr + cluster.logs()


@pytest.mark.parametrize("key, said", [
    ("polcy", "`polcy`: unknown key (did you mean `policy`?)"),
    ("user_hook", "`user_hook`: unknown key (did you mean `user_hooks`?)"),
    ("colour", "`colour=1`: unknown key (policy, python, captures, tenant, strict, user_policy, "
               "user_hooks)")])
def test_an_unknown_key_of_the_line_stops_every_step_and_says_so(cluster, site, line, key, said):
    # GIVEN a plugstack.conf line with a key the plugin does not know
    cluster.set_plugstack([plugstack(site, **{key: 1})])
    p = cluster.srun(site["native"]["prog_cudart"], env=env(site))
    # THEN no task runs, and the message names the key and, where one is close, the right one
    assert p.returncode != 0 and "fake:" not in p.stdout
    assert f"clc plugstack.conf: {said}" in p.stderr + cluster.logs()


def test_a_policy_that_others_can_change_stops_every_step(cluster, site, line):
    loose_dir = site["top"] / "loose"  # a directory everyone may write to, not sticky
    loose_dir.mkdir(exist_ok=True)
    os.chmod(loose_dir, 0o777)
    loose = loose_dir / "policy.yaml"
    loose.write_text(POLICY)
    cluster.set_plugstack([plugstack(site, policy=loose)])
    p = cluster.srun(site["native"]["prog_cudart"], env=env(site))
    assert p.returncode != 0 and "fake:" not in p.stdout
    assert f"policy={loose}: expected a file owned by root and writable by nobody else" in \
        p.stderr + cluster.logs()


def test_a_report_on_request(cluster, site):
    quiet = cluster.srun(site["native"]["prog_cudart"], env=env(site))
    asked = cluster.srun("--clc-report", site["native"]["prog_cudart"], env=env(site))
    assert "Denied by rule:" not in quiet.stderr
    assert re.search(r"^ +1 +1 +2 +0 +2 .* debug_kernel\(int\*\)$", asked.stderr, re.M), \
        asked.stderr
    assert "Denied by rule:" in asked.stderr


def test_a_users_job_writes_captures_only_that_user_reads(cluster, site):
    uid, gid = ensure_user(USER)
    before = set((site["top"] / "captures").iterdir())
    p = cluster.srun("--account=research", site["native"]["prog_cudart"], user=USER,
                     env=env(site), cwd=site["top"] / "jobs")
    assert p.returncode == 0, p.stderr + cluster.logs()
    (counts,) = fake_counts(p.stdout)
    assert counts["debug_kernel"] == 0
    job = new_job_dir(site, before)
    st = job.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (uid, gid, 0o700)
    (cap,) = job.iterdir()
    assert cap.stat().st_uid == uid
