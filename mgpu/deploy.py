"""Deployment files: the SLURM batch script of ``deploy/slurm/`` filled in for one job.

``deploy/`` stays at the top level of the source tree; the wheel carries it as
``mgpu/_deploy`` and :func:`deploy_dir` finds either.
"""
from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Collection
from pathlib import Path

__all__ = ["deploy_dir", "slurm_script"]

_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_INTERFACE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def deploy_dir() -> Path:
    """Folder of the deployment files: the wheel's copy first, then the source checkout's."""
    here = Path(__file__).resolve().parent
    for c in (here / "_deploy", here.parent / "deploy"):
        if (c / "slurm" / "mgpu.sbatch").is_file():
            return c
    raise FileNotFoundError("mgpu's deploy/ files were not found; reinstall mgpu (the wheel "
                            "carries them in mgpu/_deploy).")


def slurm_script(workflow: list[str], *, jobs: Collection[str] | None = None, nodes: int = 1,
                 gpus_per_node: int = 0, workers_per_node: int | None = None,
                 cpus_per_worker: int = 4, mem: str = "16G", time: str = "01:00:00",
                 shared_dir: str = ".", log_dir: str | None = None, job_name: str = "mgpu",
                 wait: int = 300, partition: str | None = None, account: str | None = None,
                 python: str | None = None, protocol: str | None = None,
                 interface: str | None = None) -> str:
    """The batch script that runs ``mgpu <workflow>`` (or a Python script) on a Dask cluster
    inside one SLURM job, over one or more nodes.

    The scheduler runs on the job's first node and writes its address to a scheduler file
    in ``shared_dir``; ``srun`` starts ``workers_per_node`` workers on every node, which
    join it through that file; the job runs on the first node once every worker is there.
    Everything between them (Dask's transfers, the host channel and the NCCL bootstrap of
    :func:`mgpu.spmd`) goes to the addresses the workers give the scheduler, never to
    localhost, so the nodes must reach each other on them (``interface`` picks the network).

    Parameters
    ----------
    workflow : list of str
        The mgpu command line without ``mgpu`` and without ``--address``, e.g.
        ``["run", "jaccard", "graph.txt.gz", "--out", "j.npz"]``: an ``mgpu run`` job. Or
        ``["python", "job.py", ...]``: a Python script run with ``python``, which finds the
        scheduler file in ``$MGPU_SCHEDULER_FILE`` and joins with
        ``mgpu.connect(os.environ["MGPU_SCHEDULER_FILE"])`` (``deploy/slurm/spmd_check.py``
        is one).
    jobs : collection of str, optional
        The ``mgpu run`` jobs that run on a cluster; a job not among them is refused.
        Default: those of the ``mgpu`` command, read from its commands (the ``run`` jobs that
        take ``--address``, :func:`mgpu.cli.cluster_jobs`).
    nodes, gpus_per_node
        Nodes, and GPUs asked for on each (``--gres=gpu:N``); 0 starts CPU workers.
    workers_per_node : int, optional
        Default: one per GPU, or 1 on CPU nodes.
    cpus_per_worker, mem, time
        ``--cpus-per-task`` of each worker, ``--mem`` per node, ``--time``.
    shared_dir : str
        A folder every node sees: the scheduler file goes there.
    log_dir : str, optional
        Where SLURM writes the job's output (default: ``shared_dir``).
    wait : int
        Seconds any start-up wait may take before the job stops with a message.
    python : str, optional
        The Python that has mgpu (default: this one).
    protocol : {'tcp', 'ucx'}, optional
        What the scheduler and workers speak (default tcp): ``'ucx'`` needs distributed-ucxx
        (``mgpu[ucx]``) on every node.
    interface : str, optional
        The network interface the scheduler and workers listen on (``ib0``, ``eth0``);
        default: the one Dask picks (the scheduler's route out, the workers' route to it).

    Examples
    --------
    >>> s = slurm_script(["run", "partition", "--powerlaw", "1000x100"], gpus_per_node=2)
    >>> "#SBATCH --gres=gpu:2" in s and "--ntasks-per-node=2" in s and "-m dask_cuda.cli" in s
    True
    """
    _check(workflow, jobs, nodes, gpus_per_node, workers_per_node, cpus_per_worker, mem, time,
           wait)
    _check_network(protocol, interface, python)
    per_node = workers_per_node or max(gpus_per_node, 1)
    python = python or sys.executable
    extra = []
    if gpus_per_node:
        extra.append(f"#SBATCH --gres=gpu:{gpus_per_node}")
    if partition:
        extra.append(f"#SBATCH --partition={partition}")
    if account:
        extra.append(f"#SBATCH --account={account}")
    q = shlex.quote
    if gpus_per_node:
        worker = f"{q(python)} -m dask_cuda.cli"
        srun_opts = f"--cpus-per-task={cpus_per_worker} --gpus-per-task=1"
        kind = "GPU"
    else:
        worker = (f"{q(python)} -m distributed.cli.dask_worker --nworkers 1 "
                  f"--nthreads {cpus_per_worker}")
        srun_opts = f"--cpus-per-task={cpus_per_worker}"
        kind = "CPU"
    network = "".join(f" --{k} {q(v)}" for k, v in (("protocol", protocol),
                                                     ("interface", interface)) if v)
    if workflow[0] == "python":
        job = f"{q(python)} " + " ".join(q(w) for w in workflow[1:])
    else:
        job = f"{q(python)} -m mgpu " + " ".join(q(w) for w in workflow) \
            + ' --address "$SCHED_FILE"'
    fill = {
        "JOB_NAME": job_name,
        "NODES": str(nodes),
        "WORKERS_PER_NODE": str(per_node),
        "CPUS_PER_WORKER": str(cpus_per_worker),
        "MEM": mem,
        "TIME": time,
        "LOG_DIR": log_dir or shared_dir,
        "SBATCH_EXTRA": "\n".join(extra),
        "WAIT_S": str(int(wait)),
        "SHARED_DIR": q(shared_dir),
        "PYTHON": q(python),
        "WORKER_KIND": kind,
        "WORKER_COMMAND": worker,
        "SRUN_WORKER_OPTIONS": srun_opts,
        "NETWORK_OPTIONS": network,
        "JOB": job,
    }
    text = (deploy_dir() / "slurm" / "mgpu.sbatch").read_text()
    for key, value in fill.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(re.findall(r"@([A-Z_]+)@", text)))
    if left:  # a template and its filler out of step
        raise AssertionError(f"unfilled fields in deploy/slurm/mgpu.sbatch: {left}")
    return text


def _check(workflow: list[str], jobs: Collection[str] | None, nodes: int, gpus: int,
           per_node: int | None, cpus: int, mem: str, time: str, wait: int) -> None:
    if jobs is None:
        # the jobs are the command line's: this module belongs to its layer (DESIGN.md)
        from mgpu.cli.run import cluster_jobs

        jobs = cluster_jobs()
    if workflow[:1] == ["python"] and len(workflow) >= 2:
        return _check_sizes(nodes, gpus, per_node, cpus, mem, time, wait)
    if len(workflow) < 2 or workflow[0] != "run" or workflow[1] not in jobs:
        among = f", one of {', '.join(sorted(jobs))}"
        raise ValueError(f"The workflow must be an 'mgpu run' job that runs on a cluster{among} "
                         f"(e.g. run partition --powerlaw 100000x5000), or python SCRIPT "
                         f"[ARGS]. Got {' '.join(workflow) or 'nothing'!r}.")
    if "--address" in workflow:
        raise ValueError("The workflow must not give --address: the batch script passes its "
                         "own scheduler file.")
    _check_sizes(nodes, gpus, per_node, cpus, mem, time, wait)


def _check_network(protocol: str | None, interface: str | None, python: str | None) -> None:
    from mgpu.distributed.protocol import PROTOCOLS, UCX_INSTALL, ucx_available

    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"The 'protocol' parameter of slurm_script must be one of "
                         f"{sorted(PROTOCOLS)} or None. Got {protocol!r}.")
    # the batch script's Python is this one unless told otherwise: check what can be checked
    if protocol == "ucx" and python in (None, sys.executable) and not ucx_available():
        raise ValueError("The 'protocol' parameter of slurm_script is 'ucx', which needs "
                         f"distributed-ucxx in the job's Python ({sys.executable}): "
                         f"{UCX_INSTALL}.")
    if interface is not None and not _INTERFACE.match(interface):
        raise ValueError(f"The 'interface' parameter of slurm_script must be a network "
                         f"interface name such as ib0 or eth0. Got {interface!r}.")


def _check_sizes(nodes: int, gpus: int, per_node: int | None, cpus: int, mem: str, time: str,
                 wait: int) -> None:
    for name, value in (("nodes", nodes), ("cpus_per_worker", cpus), ("wait", wait)):
        if value < 1:
            raise ValueError(f"The '{name}' parameter of slurm_script must be >= 1. Got {value}.")
    if gpus < 0 or (per_node is not None and per_node < 1):
        raise ValueError("gpus_per_node must be >= 0 and workers_per_node >= 1.")
    if gpus and per_node is not None and per_node != gpus:
        raise ValueError(f"With GPUs the job runs one worker per GPU: workers_per_node must be "
                         f"{gpus} (or left out). Got {per_node}.")
    if not _MEM.match(mem):
        raise ValueError(f"mem must be a SLURM size such as 16G or 64000M. Got {mem!r}.")
    if not _TIME.match(time):
        raise ValueError(f"time must be a SLURM time such as 01:00:00 or 1-00:00:00. Got "
                         f"{time!r}.")
