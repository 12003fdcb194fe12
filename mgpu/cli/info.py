"""``mgpu info``: versions, the cluster mgpu starts or joins, and its workers."""
from __future__ import annotations

import importlib.metadata
import platform
import time

import click

import mgpu
from mgpu.cli import _options as opt
from mgpu.cli._errors import Command
from mgpu.cli._output import fmt_bytes, worker_device

_VERSIONED = ("numpy", "scipy", "numba", "dask", "distributed", "dask-cuda", "cupy-cuda13x",
              "cupy-cuda12x", "cupy")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cluster_line(address: str | None, gpus: bool | None, n_gpus: int) -> str:
    if address:
        return f"cluster: joins the scheduler at {address}"
    if (gpus is None and n_gpus) or gpus:
        return f"cluster: embedded LocalCUDACluster, one worker per GPU ({n_gpus} visible)"
    return f"cluster: embedded LocalCluster on the CPU ({n_gpus} GPUs visible)"


@click.command(cls=Command)
@click.option("--address", default=None, help="Join this scheduler (or scheduler file) "
              "instead of starting an embedded cluster.")
@click.option("--start/--no-start", default=True, show_default=True,
              help="Start (or join) the cluster and list its workers.")
@opt.gpus
@opt.protocol
def info(address: str | None, start: bool, gpus: bool | None) -> None:
    """Versions, the cluster mgpu starts or joins, and every worker's GPU or CPUs."""
    from mgpu.backends.loader import kernel_dir
    from mgpu.distributed import connect, describe_workers, visible_gpus

    click.echo(f"mgpu {mgpu.__version__}  (Python {platform.python_version()}, "
               f"{platform.system()} {platform.machine()})")
    for dist in _VERSIONED:
        v = _version(dist)
        if v is not None:
            click.echo(f"  {dist:<14} {v}")
    try:
        click.echo(f"  kernels        {kernel_dir()}")
    except FileNotFoundError as exc:
        click.echo(f"  kernels        MISSING: {exc}")
    click.echo(_cluster_line(address, gpus, visible_gpus()))
    if not start:
        return
    t0 = time.perf_counter()
    with connect(address, gpus=gpus) as client:
        workers = describe_workers(client)
        click.echo(f"{len(workers)} worker(s), up in {time.perf_counter() - t0:.1f} s "
                   f"(scheduler {client.scheduler.address}):")
        for addr, w in workers.items():
            click.echo(f"  {addr}  host={w['host']} pid={w['pid']} "
                       f"threads={w.get('nthreads', '?')} mem={fmt_bytes(w.get('memory_limit'))}"
                       f"  {worker_device(w)}")

