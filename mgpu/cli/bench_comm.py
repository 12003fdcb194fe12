"""``mgpu bench allreduce``: the SPMD communicator's all-reduce against torch.distributed."""
from __future__ import annotations

import click

from mgpu.cli import _options as opt
from mgpu.cli._output import write_json

_GPUS = {"auto": None, "cpu": False, "gpu": True}  # --device auto|cpu|gpu as connect's gpus


def _check_gpu_workers(counts: tuple[int, ...], device: str) -> tuple[int, ...]:
    """--workers refused before any work when GPU workers are more than GPUs."""
    from mgpu.distributed import visible_gpus

    n_gpus = visible_gpus()
    if (device == "gpu" or (device == "auto" and n_gpus)) and max(counts) > n_gpus:
        raise click.UsageError(f"--workers asks for {max(counts)} GPU workers but {n_gpus} "
                               "GPU(s) are visible; lower it or pass --device cpu.")
    return counts


@click.command("allreduce")
@click.option("--shape", default="100000x128", show_default=True, type=opt.Shape(),
              metavar="ROWSxCOLS", help="The float32 buffer all-reduced.")
@opt.worker_counts("2,4")
@opt.worker_kind
@opt.repeats(20, "Timed all-reduces (median).")
@click.option("--no-peer", is_flag=True, help="Skip torch.distributed's NCCL all-reduce.")
@opt.json_out()
def bench_allreduce(shape: tuple[int, int], workers: tuple[int, ...], device: str,
                    repeats: int, no_peer: bool, json_path: str | None) -> None:
    """All-reduce of one buffer among 2, 4, … workers through mgpu's SPMD communicator
    (NCCL on GPU workers), against torch.distributed's NCCL in the same processes."""
    from mgpu.bench import allreduce as b

    counts = _check_gpu_workers(workers, device)
    rows = b.bench_allreduce(shape, counts, repeats=repeats, gpus=_GPUS[device],
                             peer=not no_peer, progress=click.echo)
    click.echo(b.markdown(rows))
    write_json(json_path, rows)
