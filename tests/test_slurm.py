"""SLURM deployment: the batch script and dask-jobqueue, run for real on a one-node SLURM.

The `slurm` tests use the SLURM that answers here, or start one with
deploy/slurm/local-slurm.sh (root with apt-get: it installs Debian's slurm-wlm and munge) and
stop it afterwards. The script-making tests need no SLURM.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner
from conftest import REPO_ROOT

import mgpu
from mgpu.cli import cluster_jobs, main
from mgpu.deploy import slurm_script
from mgpu.distributed import workers_now

LOCAL_SLURM = REPO_ROOT / "deploy" / "slurm" / "local-slurm.sh"
SPMD_CHECK = REPO_ROOT / "deploy" / "slurm" / "spmd_check.py"


def _answers(env: dict[str, str]) -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env,
                         timeout=30)
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mix", "alloc"))


def _unavailable(reason: str) -> None:
    """Skip, or fail where the SLURM tests must run (``MGPU_REQUIRE_SLURM=1``, set by .ci/run):
    a skipped SLURM test would let CI pass without the deployment it promises to check."""
    if os.environ.get("MGPU_REQUIRE_SLURM") == "1":
        pytest.fail(f"{reason}; MGPU_REQUIRE_SLURM=1 asks for the SLURM tests to run")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """Environment variables for a SLURM that takes jobs."""
    env = dict(os.environ)
    if _answers(env):
        yield env
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        _unavailable("no SLURM answers here and none can be started (needs root, and apt-get "
                     "or an installed slurm-wlm)")
    state = tmp_path_factory.mktemp("slurm")
    # below pytest's own 600 s limit, so that a slow install fails with SLURM's words
    out = subprocess.run(["bash", str(LOCAL_SLURM), "start", str(state)], capture_output=True,
                         text=True, timeout=540)
    if out.returncode == 3:
        _unavailable(f"SLURM could not be installed: {out.stderr.strip()}")
    assert out.returncode == 0, f"the local SLURM did not start:\n{out.stderr}"
    env["SLURM_CONF"] = str(state / "slurm.conf")
    try:
        yield env
    finally:
        subprocess.run(["bash", str(LOCAL_SLURM), "stop", str(state)], timeout=120)


def _script(args: list[str]) -> str:
    r = CliRunner().invoke(main, ["slurm", "script", *args])
    assert r.exit_code == 0, r.output
    return r.output


def _sbatch(path, env, timeout=300) -> tuple[int, str]:
    """Submit, wait for the job; its exit status and job id. A job still queued or running
    after ``timeout`` s is cancelled and the test fails with SLURM's reason."""
    sub = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True,
                         env=env, timeout=60, cwd=path.parent)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True,
                           text=True, env=env, timeout=30)
        if not q.stdout.strip():
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", job], env=env, timeout=30)
        pytest.fail(f"job {job} did not finish within {timeout} s: {q.stdout.strip()}")
    info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                          env=env, timeout=30).stdout
    code = re.search(r"\bExitCode=(\d+):(\d+)", info)
    assert code, info
    return int(code.group(1)), job


def _jaccard_job(folder, graph, out):
    """A batch script, in ``folder``, that runs ``mgpu run jaccard`` on two CPU workers."""
    script = folder / "job.sbatch"
    script.write_text(_script(["--cpus-per-worker", "1", "--workers-per-node", "2", "--mem",
                               "2G", "--time", "00:10:00", "--wait", "120", "--shared-dir",
                               str(folder), "--", "run", "jaccard", str(graph), "--out",
                               str(out)]))
    return script


def _no_job_left(env: dict[str, str], user_jobs_before: set[str]) -> bool:
    for _ in range(30):
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                             env=env, timeout=30)
        if not set(out.stdout.split()) - user_jobs_before:
            return True
        time.sleep(1)
    return False


@pytest.mark.slurm
def test_batch_script_runs_a_workflow_on_real_data(slurm, data_dir, tmp_path):
    from mgpu import io

    graph = data_dir / "graphs" / "facebook_combined.txt.gz"
    out = tmp_path / "fb.npz"
    script = _jaccard_job(tmp_path, graph, out)
    status, job = _sbatch(script, slurm)
    log = (tmp_path / f"mgpu-{job}.out").read_text()
    assert status == 0, log
    assert "2 CPU worker(s)" in log and "weights of 88,234 edges" in log
    assert f"mgpu: job {job} finished with status 0" in log
    G = io.load_snap(graph, symmetric=True, dtype=np.float64)
    J = sp.load_npz(out)
    assert (J != mgpu.jaccard(G)).nnz == 0 and J.nnz == 2 * 88_234
    # everything shut down: no scheduler file, no job, no step left
    assert not list(tmp_path.glob("mgpu-scheduler-*.json"))
    assert _no_job_left(slurm, set())


@pytest.mark.slurm
def test_batch_script_runs_over_tls_from_the_dask_config(slurm, tls_config, tmp_path):
    import yaml

    rng = np.random.default_rng(1)
    edges = np.unique(np.sort(rng.integers(0, 200, size=(1500, 2)), axis=1), axis=0)
    edges = edges[edges[:, 0] != edges[:, 1]]
    graph = tmp_path / "g.txt"
    np.savetxt(graph, edges, fmt="%d")
    conf = tmp_path / "dask-config"
    conf.mkdir()
    nested: dict = {}
    for key, value in tls_config.items():
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    (conf / "tls.yaml").write_text(yaml.safe_dump(nested))
    out = tmp_path / "j.npz"
    script = _jaccard_job(tmp_path, graph, out)
    # the scheduler's "Scheduler at:" line is an INFO record (the CLI, run in this process
    # by other tests, may have set DASK_LOGGING__DISTRIBUTED lower for its children)
    status, job = _sbatch(script, {**slurm, "DASK_CONFIG": str(conf),
                                   "DASK_LOGGING__DISTRIBUTED": "info"})
    log = (tmp_path / f"mgpu-{job}.out").read_text()
    assert status == 0, log
    listening = re.findall(r"Scheduler at:\s+(\S+)", log)
    assert listening and all(a.startswith("tls://") for a in listening), log
    assert "2 CPU worker(s)" in log
    from mgpu import io

    G = io.load_snap(graph, symmetric=True, dtype=np.float64)
    J = sp.load_npz(out)
    assert (J != mgpu.jaccard(G)).nnz == 0 and J.nnz == 2 * len(edges)
    assert not list(tmp_path.glob("mgpu-scheduler-*.json"))
    assert _no_job_left(slurm, set())


@pytest.mark.slurm
def test_batch_script_reports_a_failing_workflow_and_cleans_up(slurm, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(_script(["--cpus-per-worker", "1", "--mem", "1G", "--time", "00:05:00",
                               "--wait", "60", "--shared-dir", str(tmp_path), "--", "run",
                               "jaccard", str(tmp_path / "missing.txt"), "--out",
                               str(tmp_path / "j.npz")]))
    status, job = _sbatch(script, slurm)
    log = (tmp_path / f"mgpu-{job}.out").read_text()
    assert status != 0
    assert f"mgpu: job {job} finished with status" in log and "status 0" not in log
    assert not list(tmp_path.glob("mgpu-scheduler-*.json"))
    assert _no_job_left(slurm, set())


@pytest.mark.slurm
def test_batch_script_runs_an_spmd_python_job_on_cpu_workers(slurm, tmp_path):
    """A Python job (deploy/slurm/spmd_check.py) joins through $MGPU_SCHEDULER_FILE and runs
    one mgpu.spmd job over both workers: the all-reduced column sums equal the one-process
    sums to the bit (the host channel reduces in rank order)."""
    script = tmp_path / "job.sbatch"
    script.write_text(_script(["--cpus-per-worker", "1", "--workers-per-node", "2", "--mem",
                               "2G", "--time", "00:10:00", "--wait", "120", "--shared-dir",
                               str(tmp_path), "--", "python", str(SPMD_CHECK), "--shape",
                               "20000x3000", "--nnz", "2e5", "--elems", "100000",
                               "--repeats", "3"]))
    # the job's Python imports mgpu from this checkout, as the workers do
    env = {**slurm, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                slurm.get("PYTHONPATH")]))}
    status, job = _sbatch(script, env)
    log = (tmp_path / f"mgpu-{job}.out").read_text()
    assert status == 0, log
    assert "2 CPU worker(s)" in log
    assert re.search(r"spmd check: 2 rank\(s\) on 1 host\(s\)", log), log
    ranks = re.findall(r"rank (\d): (tcp://\S+) on \S+, tiles \[(\d+), (\d+)\]", log)
    assert sorted(r[0] for r in ranks) == ["0", "1"] and len({r[1] for r in ranks}) == 2
    assert sorted(int(t) for r in ranks for t in r[2:]) == [0, 1, 2, 3]
    assert "max relative error 0.00e+00 against one process; every rank the same: True" in log
    assert f"mgpu: job {job} finished with status 0" in log
    assert not list(tmp_path.glob("mgpu-scheduler-*.json"))
    assert _no_job_left(slurm, set())


@pytest.mark.slurm
def test_dask_jobqueue_workers_run_a_distributed_op(slurm, tmp_path, monkeypatch):
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    rng = np.random.default_rng(0)
    A = sp.random(300, 300, density=0.03, random_state=rng, format="csr")
    G = ((A + A.T) > 0).astype(np.float64).tocsr()
    with mgpu.connect(slurm=dict(cores=1, memory="1GiB", walltime="00:10:00", jobs=2,
                                 log_directory=str(tmp_path), local_directory=str(tmp_path),
                                 python=sys.executable), timeout=180) as client:
        assert len(workers_now(client)) == 2
        J = mgpu.jaccard(G, parts=4, client=client)
    assert (J != mgpu.jaccard(G)).nnz == 0
    assert _no_job_left(slurm, set())  # closing the client cancelled the worker jobs


# ------------------------------------------------------------- scripts, without SLURM


def test_cpu_and_gpu_scripts_are_filled_and_valid_bash(tmp_path):
    cpu = slurm_script(["run", "partition", "--powerlaw", "1000x100"], cpus_per_worker=2,
                       workers_per_node=3, shared_dir=str(tmp_path))
    gpu = slurm_script(["run", "knn-graph", "data file.mtx", "--out", "g.npz"], nodes=2,
                       gpus_per_node=4, partition="gpu", account="proj")
    for text in (cpu, gpu):
        assert not re.search(r"@[A-Z_]+@", text)  # every field filled
        path = tmp_path / "s.sh"
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "--ntasks-per-node=3" in cpu and "distributed.cli.dask_worker" in cpu
    assert "--nthreads 2" in cpu and "--gres" not in cpu
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:4",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj", "-m dask_cuda.cli",
                 "--gpus-per-task=1", "'data file.mtx'", "mgpu-kernels-"):
        assert line in gpu, line


def test_a_multi_node_script_starts_workers_on_every_node_and_a_python_job(tmp_path,
                                                                          monkeypatch):
    import mgpu.distributed.protocol as pr

    monkeypatch.setattr(pr, "ucx_available", lambda: True)
    text = slurm_script(["python", "my job.py", "--iters", "5"], nodes=2, gpus_per_node=4,
                        protocol="ucx", interface="ib0", shared_dir=str(tmp_path))
    path = tmp_path / "s.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert not re.search(r"@[A-Z_]+@", text)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:4",
                 'export MGPU_SCHEDULER_FILE="$SCHED_FILE"'):
        assert line in text, line
    scheduler = text[text.index("-m distributed.cli.dask_scheduler"):].split("&")[0]
    workers = text[text.index('srun --overlap --nodes="$SLURM_JOB_NUM_NODES"'):].split("&")[0]
    # the workers: PER_NODE on each of the job's nodes, one GPU each, speaking UCX on ib0
    for piece in ('--ntasks="$N_WORKERS"', '--ntasks-per-node="$PER_NODE"',
                  "--gpus-per-task=1", "-m dask_cuda.cli", '--scheduler-file "$SCHED_FILE"',
                  "--protocol ucx", "--interface ib0"):
        assert piece in workers, piece
    assert "--protocol ucx" in scheduler and "--interface ib0" in scheduler
    # the job: the script itself (no `-m mgpu`, no --address), run by the job's Python
    last = text.rstrip().splitlines()[-1]
    assert last == f"{sys.executable} 'my job.py' --iters 5"
    tcp = slurm_script(["run", "partition", "--powerlaw", "10x10"], nodes=2)
    assert "--protocol" not in tcp and "--interface" not in tcp
    assert tcp.rstrip().endswith('-m mgpu run partition --powerlaw 10x10 --address '
                                 '"$SCHED_FILE"')


def test_ucx_batch_scripts_need_distributed_ucxx(monkeypatch):
    import mgpu.distributed.protocol as pr

    monkeypatch.setattr(pr, "ucx_available", lambda: False)
    with pytest.raises(ValueError, match=r"'protocol' parameter of slurm_script is 'ucx', which "
                       r"needs distributed-ucxx in the job's Python .*mgpu\[ucx\]"):
        slurm_script(["run", "partition", "--powerlaw", "10x10"], protocol="ucx")
    # another Python (on the nodes) is not this one's to check
    assert "--protocol ucx" in slurm_script(["run", "partition", "--powerlaw", "10x10"],
                                            protocol="ucx", python="/opt/env/bin/python")
    r = CliRunner().invoke(main, ["slurm", "script", "--protocol", "ucx", "--", "run",
                                  "partition", "--powerlaw", "10x10"])
    assert r.exit_code == 2 and "needs distributed-ucxx" in r.output


@pytest.mark.parametrize("kw, match", [
    (dict(workflow=["run", "gap", "c.txt"], jobs=("jaccard", "knn-graph", "mf", "partition")),
     "one of jaccard, knn-graph, mf, partition"),
    (dict(workflow=["run", "nope", "r.csv"], jobs=cluster_jobs()),
     "one of gap, gradient-mf, jaccard, knn-graph, mf, partition"),
    # by default, the jobs of the mgpu command
    (dict(workflow=["run", "nope", "r.csv"]),
     "one of gap, gradient-mf, jaccard, knn-graph, mf, partition"),
    (dict(workflow=["run", "als", "r.csv"]), "one of gap, gradient-mf, jaccard"),
    (dict(workflow=["info"]), "must be an 'mgpu run' job"),
    (dict(workflow=["run", "mf", "r.csv", "--address", "x"]), "must not give --address"),
    (dict(mem="lots"), "mem must be a SLURM size"),
    (dict(time="1h"), "time must be a SLURM time"),
    (dict(gpus_per_node=2, workers_per_node=3), "workers_per_node must be 2"),
    (dict(nodes=0), "'nodes' parameter of slurm_script must be >= 1"),
    (dict(workflow=["python"]), r"or python SCRIPT \[ARGS\]. Got 'python'"),
    (dict(protocol="nccl"), r"'protocol' parameter of slurm_script must be one of \['tcp', "
                            r"'ucx'\] or None. Got 'nccl'"),
    (dict(interface="ib0; rm -rf ~"), "'interface' parameter of slurm_script must be a network "
                                      "interface name"),
])
def test_bad_script_requests_are_refused(kw, match):
    kw = {"workflow": ["run", "partition", "--powerlaw", "10x10"], **kw}
    with pytest.raises(ValueError, match=match):
        slurm_script(kw.pop("workflow"), **kw)


def test_cli_prints_the_script_or_a_usage_error():
    r = CliRunner().invoke(main, ["slurm", "script", "--", "run", "nope", "c.txt"])
    assert r.exit_code == 2 and "one of gap, gradient-mf, jaccard, knn-graph, mf, partition" in r.output
    r = CliRunner().invoke(main, ["slurm", "script", "--", "info"])
    assert r.exit_code == 2 and "must be an 'mgpu run' job" in r.output
    text = _script(["--gpus-per-node", "2", "--", "run", "partition", "--powerlaw", "10x10"])
    assert text.startswith("#!/bin/bash") and "--gres=gpu:2" in text


def test_the_cluster_jobs_are_the_run_commands_that_take_an_address():
    run = main.commands["run"]
    takes = {name for name, cmd in run.commands.items()
             if not cmd.hidden and "--address" in {o for p in cmd.params for o in p.opts}}
    assert set(cluster_jobs()) == takes
    assert {"gap", "gradient-mf", "jaccard", "knn-graph", "mf", "partition"} <= takes


@pytest.mark.parametrize("job", cluster_jobs())
def test_every_cluster_job_gets_a_batch_script(job, tmp_path):
    text = _script(["--gpus-per-node", "1", "--shared-dir", str(tmp_path), "--", "run", job,
                    "input.file", "--out", "out"])
    assert not re.search(r"@[A-Z_]+@", text)  # every field filled
    assert f" run {job} input.file --out out" in text
    path = tmp_path / "s.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_joining_waits_for_the_workers_it_was_told_to_expect():
    with mgpu.connect(gpus=False, n_workers=1) as client:
        address = client.scheduler.address
        with mgpu.connect(address, n_workers=1, timeout=20) as joined:
            assert len(workers_now(joined)) == 1
        with pytest.raises(TimeoutError, match=r"3 worker\(s\) of the scheduler at .* did not "
                                               r"come up within 2 s \(1 did\)"):
            mgpu.connect(address, n_workers=3, timeout=2)


def test_jobqueue_config_and_gpu_jobs_make_valid_job_scripts(tmp_path):
    """deploy/jobqueue.yaml is read by dask-jobqueue as it stands; GPU jobs ask SLURM for
    their GPUs and start dask-cuda's worker."""
    import dask.config
    import yaml

    from mgpu.distributed.cluster import slurm_cluster

    import dask_jobqueue  # noqa: F401  (its defaults, under the file's settings)

    section = yaml.safe_load((REPO_ROOT / "deploy" / "jobqueue.yaml").read_text())
    # the file's keys one by one over dask-jobqueue's defaults, as a user config file merges
    conf = {f"jobqueue.slurm.{k}": v for k, v in section["jobqueue"]["slurm"].items()}
    with dask.config.set(conf):
        cluster, jobs, per_job = slurm_cluster({"jobs": 3, "queue": "gpu",
                                                "log_directory": str(tmp_path)}, gpus=True)
        try:
            text = cluster.job_script()
        finally:
            cluster.close()
    assert (jobs, per_job) == (3, 1)
    for piece in ("#SBATCH -p gpu", "#SBATCH --gres=gpu:1", "--mem=", "-m dask_cuda.cli",
                  "mgpu-kernels-", "#SBATCH -t 01:00:00"):
        assert piece in text, (piece, text)
    with dask.config.set(conf):
        cluster, jobs, per_job = slurm_cluster({"processes": 2, "cores": 4})
        try:
            text = cluster.job_script()
        finally:
            cluster.close()
    assert per_job == 2 and "distributed.cli.dask_worker" in text and "--gres" not in text
    with pytest.raises(ValueError, match="needs jobs >= 1"):
        slurm_cluster({"jobs": 0})


def test_local_cluster_script_runs_a_job_on_mixed_workers(tmp_path):
    """deploy/local_cuda_cluster.py with CPU workers only (no GPU here): the job joins, waits
    for both workers and runs; a failing job's status comes back."""
    script = REPO_ROOT / "deploy" / "local_cuda_cluster.py"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, str(script), "--devices", "none", "--cpu-workers",
                          "2", "--timeout", "60", "--", "run", "partition", "--powerlaw",
                          "2000x500", "--nnz", "20000", "--parts", "2"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "0 GPU worker(s), 2 CPU worker(s)" in out.stdout
    assert "row-norm check on the workers: max relative error" in out.stdout
    bad = subprocess.run([sys.executable, str(script), "--devices", "none", "--cpu-workers",
                          "1", "--", "run", "jaccard", str(tmp_path / "missing.txt"), "--out",
                          str(tmp_path / "j.npz")], capture_output=True, text=True, env=env,
                         timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
