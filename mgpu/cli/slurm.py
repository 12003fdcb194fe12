"""``mgpu slurm``: batch scripts that run an ``mgpu run`` job (or a Python script) on a Dask
cluster inside one SLURM allocation of one or more nodes."""
from __future__ import annotations

from pathlib import Path

import click

from mgpu.cli._errors import Group
from mgpu.cli.run import cluster_jobs
from mgpu.distributed.protocol import PROTOCOLS


@click.group(cls=Group)
def slurm() -> None:
    """SLURM: batch scripts that run mgpu jobs on a Dask cluster inside one allocation."""


@slurm.command("script", context_settings={"ignore_unknown_options": True})
@click.argument("workflow", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--nodes", default=1, show_default=True, type=int)
@click.option("--gpus-per-node", default=0, show_default=True, type=int,
              help="GPUs per node (--gres=gpu:N), one dask-cuda worker each; 0 for CPU workers.")
@click.option("--workers-per-node", default=None, type=int,
              help="CPU workers per node (default 1; with GPUs, one per GPU).")
@click.option("--cpus-per-worker", default=4, show_default=True, type=int)
@click.option("--mem", default="16G", show_default=True, help="--mem per node.")
@click.option("--time", "time_limit", default="01:00:00", show_default=True)
@click.option("--shared-dir", default=".", show_default=True,
              help="A folder every node sees (the scheduler file goes there).")
@click.option("--log-dir", default=None, help="Where the job's output goes (default: "
              "--shared-dir).")
@click.option("--job-name", default="mgpu", show_default=True)
@click.option("--wait", default=300, show_default=True, type=int,
              help="Seconds any start-up wait may take.")
@click.option("--partition", default=None)
@click.option("--account", default=None)
@click.option("--protocol", type=click.Choice(sorted(PROTOCOLS)), default=None,
              help="What the scheduler and workers speak (default tcp); ucx needs mgpu[ucx] "
              "on every node.")
@click.option("--interface", default=None, help="Network interface the scheduler and workers "
              "listen on, e.g. ib0 (default: Dask's choice).")
def slurm_script_cmd(workflow: tuple[str, ...], nodes: int, gpus_per_node: int,
                     workers_per_node: int | None, cpus_per_worker: int, mem: str,
                     time_limit: str, shared_dir: str, log_dir: str | None, job_name: str,
                     wait: int, partition: str | None, account: str | None,
                     protocol: str | None, interface: str | None) -> None:
    """Print the batch script that runs WORKFLOW (an `mgpu run` job, e.g. `-- run jaccard
    graph.txt.gz --out j.npz`, or `-- python job.py ARGS`) on a scheduler and workers
    started inside the job.

    Submit it with `sbatch`: it starts the scheduler on the first node, workers on every
    node with srun (one per GPU, or CPU workers), waits for all of them with a timeout, runs
    the job against them and shuts everything down, whatever the job's outcome. A Python
    job joins with `mgpu.connect(os.environ["MGPU_SCHEDULER_FILE"])`.
    """
    from mgpu.deploy import slurm_script

    text = slurm_script(list(workflow), jobs=cluster_jobs(), nodes=nodes,
                        gpus_per_node=gpus_per_node, workers_per_node=workers_per_node,
                        cpus_per_worker=cpus_per_worker, mem=mem, time=time_limit,
                        shared_dir=str(Path(shared_dir).resolve()),
                        log_dir=str(Path(log_dir).resolve()) if log_dir else None,
                        job_name=job_name, wait=wait, partition=partition, account=account,
                        protocol=protocol, interface=interface)
    click.echo(text, nl=False)
