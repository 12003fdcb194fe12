"""All-reduce bandwidth of mgpu's SPMD communicator against ``torch.distributed``'s NCCL, in
the same worker processes of one run.

For each worker count an embedded cluster is started, one tile per worker, and one
:func:`mgpu.spmd` job per count times ``comm.allreduce`` of a float32 buffer (not zeros: rank
``r`` holds ``r + 1``, and the sum is checked). On GPU workers the same processes then join a
``torch.distributed`` NCCL group (its rendezvous address made by rank 0 and handed to the
others through the communicator) and time ``all_reduce`` of the same buffer. Times are wall
clock around a call that returns with the result on the device, medians after warm-up; the
bus bandwidth is NCCL's: ``bytes × 2 (n - 1) / n / time``.
"""
from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.timing import time_cpu


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _torch_allreduce(comm: Any, shape: tuple[int, int], repeats: int) -> float | None:
    """torch.distributed's NCCL all-reduce in this rank's process (None without torch)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    from distributed.comm import get_address_host

    host = get_address_host(comm.workers[0])
    port = comm.bcast_obj(_free_port(host) if comm.rank == 0 else None)
    dist.init_process_group("nccl", init_method=f"tcp://{host}:{port}",
                            world_size=comm.size, rank=comm.rank)
    try:
        t = torch.full(shape, float(comm.rank + 1), device="cuda", dtype=torch.float32)

        def call() -> None:
            dist.all_reduce(t)
            torch.cuda.synchronize()

        return time_cpu(call, repeats=repeats, warmup=3)
    finally:
        dist.destroy_process_group()


def _rank(comm: Any, parts: list[Any], shape: tuple[int, int], repeats: int,
          peer: bool) -> dict[str, Any]:
    xp = comm.xp
    x = xp.full(shape, comm.rank + 1, dtype=xp.float32)
    y = comm.allreduce(x)
    want = comm.size * (comm.size + 1) / 2
    ok = bool((y == want).all())
    mgpu_s = time_cpu(lambda: comm.allreduce(x), repeats=repeats, warmup=3)
    torch_s = _torch_allreduce(comm, shape, repeats) if peer and xp is not np else None
    return {"ok": ok, "mgpu_s": mgpu_s, "torch_s": torch_s}


def bench_allreduce(shape: tuple[int, int], workers: tuple[int, ...], *, repeats: int = 20,
                    gpus: bool | None = None, peer: bool = True,
                    progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows of ``mgpu bench allreduce``: per worker count, the medians, GB/s and the
    ratio to torch.distributed (GPU workers with torch only)."""
    from mgpu.distributed import connect, from_scipy, spmd

    nbytes = int(np.prod(shape)) * 4
    rows = []
    for n in workers:
        with connect(n_workers=n, gpus=gpus) as client:
            tiles = from_scipy(sp.identity(n, format="csr", dtype=np.float32), n,
                               client=client)
            out = spmd(_rank, tiles, args=(shape, repeats, peer), client=client,
                       name="bench-allreduce")
        size = len(out)
        bus = 2 * (size - 1) / size if size > 1 else 1.0
        mgpu_s = max(o["mgpu_s"] for o in out)  # the slowest rank sets the pace
        torch_s = (max(o["torch_s"] for o in out)
                   if all(o["torch_s"] is not None for o in out) else None)
        row = {"workers": size, "kind": "GPU" if gpus or out[0]["torch_s"] is not None
               else "CPU", "bytes": nbytes, "correct": all(o["ok"] for o in out),
               "mgpu_ms": mgpu_s * 1e3, "mgpu_bus_gbs": nbytes * bus / mgpu_s / 1e9}
        if torch_s is not None:
            row.update(torch_ms=torch_s * 1e3, torch_bus_gbs=nbytes * bus / torch_s / 1e9,
                       ratio=torch_s / mgpu_s)
        rows.append(row)
        if progress is not None:
            progress(markdown([row]).splitlines()[-1])
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| workers | kind | MB | correct | mgpu ms | mgpu bus GB/s | torch ms | "
             "torch bus GB/s | mgpu / torch |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        peer = (f"{r['torch_ms']:.3f} | {r['torch_bus_gbs']:.0f} | {r['ratio']:.2f}×"
                if "torch_ms" in r else "– | – | –")
        lines.append(f"| {r['workers']} | {r['kind']} | {r['bytes'] / 1e6:.1f} | "
                     f"{r['correct']} | {r['mgpu_ms']:.3f} | {r['mgpu_bus_gbs']:.1f} | {peer} |")
    return "\n".join(lines)
