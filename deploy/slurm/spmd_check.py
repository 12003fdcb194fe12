"""An SPMD job on a running cluster: the job script of ``mgpu slurm script -- python ...``.

It joins the cluster that the batch script started (its scheduler file is in
``$MGPU_SCHEDULER_FILE``; ``--address`` names another), spreads a power-law matrix over every
worker in row tiles of equal nonzeros, and runs one ``mgpu.spmd`` job: each rank sums its
tiles' columns, the ranks all-reduce the sums (NCCL between GPU workers, the host channel
between CPU workers), then time an all-reduce of a dense buffer. It prints which host each
rank ran on, the largest relative error of the all-reduced sums against the same sums made
in this one process, and the all-reduce's median time; it exits with status 1 when the sums
disagree (more than 1e-9 relative) or a rank saw other sums than rank 0.

    mgpu slurm script --nodes 2 --gpus-per-node 4 --shared-dir $HOME/mgpu-jobs \\
        -- python deploy/slurm/spmd_check.py --shape 2000000x200000 --nnz 2e8 > job.sbatch
    sbatch job.sbatch
"""
from __future__ import annotations

import argparse
import collections
import os
import socket
import statistics
import sys
import time

import numpy as np


def _sync(xp) -> None:
    if xp.__name__ == "cupy":
        xp.cuda.get_current_stream().synchronize()


def column_sums(comm, parts, n_cols: int, elems: int, repeats: int) -> dict:
    """One rank's part of the job (``mgpu.spmd``'s function)."""
    xp = comm.xp
    local = xp.zeros(n_cols, dtype=xp.float64)
    for p in parts:
        local += xp.asarray(p.data.astype(xp.float64).sum(axis=0)).ravel()
    total = comm.allreduce(local)
    buf = xp.ones(elems, dtype=xp.float32)
    comm.allreduce(buf)  # warm-up: NCCL's first call sets its channels up
    times = []
    for _ in range(repeats):
        comm.barrier()
        _sync(xp)
        t0 = time.perf_counter()
        out = comm.allreduce(buf)
        _sync(xp)
        times.append(time.perf_counter() - t0)
    if not float(out[0]) == comm.size:
        raise AssertionError(f"rank {comm.rank}: all-reduce of ones gave {float(out[0])}, "
                             f"not {comm.size}")
    host_total = total.get() if xp.__name__ == "cupy" else total
    return {"rank": comm.rank, "host": socket.gethostname(), "worker": comm.workers[comm.rank],
            "tiles": [p.index for p in parts], "sums": host_total if comm.rank == 0 else None,
            "checksum": float(host_total.sum()), "allreduce_s": statistics.median(times)}


def _shape(text: str) -> tuple[int, int]:
    rows, _, cols = text.lower().partition("x")
    return int(rows), int(cols)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=os.environ.get("MGPU_SCHEDULER_FILE"),
                        help="scheduler address or file (default: $MGPU_SCHEDULER_FILE, set "
                        "by mgpu's batch script)")
    parser.add_argument("--shape", type=_shape, default=(200_000, 20_000),
                        help="ROWSxCOLS of the power-law matrix (default 200000x20000)")
    parser.add_argument("--nnz", type=float, default=2e6, help="its nonzeros (default 2e6)")
    parser.add_argument("--tiles-per-worker", type=int, default=2)
    parser.add_argument("--elems", type=int, default=100_000 * 128,
                        help="float32 elements of the timed all-reduce (default 100000x128)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if not args.address:
        parser.error("no cluster: give --address, or run inside mgpu's batch script "
                     "(which sets MGPU_SCHEDULER_FILE)")

    import mgpu
    from mgpu.synthetic import powerlaw_csr

    S = powerlaw_csr(*args.shape, int(args.nnz), seed=0)
    want = np.asarray(S.astype(np.float64).sum(axis=0)).ravel()
    with mgpu.connect(args.address) as client:
        n = len(mgpu.distributed.workers_now(client))
        X = mgpu.from_scipy(S, n * args.tiles_per_worker, client=client)
        t0 = time.perf_counter()
        ranks = mgpu.spmd(column_sums, X, args=(S.shape[1], args.elems, args.repeats),
                          client=client, name="spmd-check")
        took = time.perf_counter() - t0
    hosts = collections.Counter(r["host"] for r in ranks)
    print(f"spmd check: {len(ranks)} rank(s) on {len(hosts)} host(s) ("
          + ", ".join(f"{h}: {c}" for h, c in sorted(hosts.items())) + f"), job {took:.2f} s")
    for r in ranks:
        print(f"  rank {r['rank']}: {r['worker']} on {r['host']}, tiles {r['tiles']}")
    got = ranks[0]["sums"]
    err = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)))
    same = len({r["checksum"] for r in ranks}) == 1
    t = statistics.median(r["allreduce_s"] for r in ranks)
    size = 4 * args.elems
    bus = 2 * (len(ranks) - 1) / len(ranks) * size / t / 1e9 if len(ranks) > 1 else float("nan")
    print(f"column sums of {S.shape[0]:,} x {S.shape[1]:,} ({S.nnz:,} nonzeros) all-reduced: "
          f"max relative error {err:.2e} against one process; every rank the same: {same}")
    print(f"all-reduce of {size / 1e6:.1f} MB over {len(ranks)} rank(s): {t * 1e3:.3f} ms "
          f"median, {bus:.1f} GB/s bus bandwidth")
    return 0 if err <= 1e-9 and same else 1


if __name__ == "__main__":
    sys.exit(main())
