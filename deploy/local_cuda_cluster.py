"""Run an mgpu job on a LocalCUDACluster started with the options that matter, optionally with
CPU workers beside the GPU workers in the same cluster.

    python deploy/local_cuda_cluster.py --devices 0,1 --rmm-pool 24GB --cpu-workers 2 \\
        -- run knn-graph corpus.mtx --out graph.npz

- ``--devices``: the GPUs to use (CUDA_VISIBLE_DEVICES order; one worker each); ``none``
  starts no GPU worker (a CPU-only cluster, e.g. to try a job out).
- ``--rmm-pool``: an RMM memory pool per GPU (e.g. ``24GB``): allocations come from the pool
  instead of cudaMalloc, which matters for jobs that allocate per batch.
- ``--protocol``: ``tcp`` (default) or ``ucx`` (NVLink/InfiniBand between workers, needs
  mgpu[ucx], i.e. distributed-ucxx).
- ``--cpu-workers N``: N CPU worker processes joined to the same scheduler. Workers carry
  resources, ``GPU=1`` on the GPU workers and ``CPU=1`` on the CPU ones, so work submitted with
  ``resources={"GPU": 1}`` lands only on GPUs and CPU-friendly blocks can be sent to the CPU
  workers with ``resources={"CPU": 1}``.

The job (an ``mgpu run`` command line after ``--``) joins the scheduler, waits for every worker
(``mgpu.connect.min-workers``, with ``--timeout``), and the cluster is closed when it ends; the
script exits with the job's status. ``mgpu info --address`` prints the GPU ↔ worker mapping
(UUIDs) of a running cluster.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default=None,
                        help="comma-separated GPU ids, or 'none' (default: every GPU)")
    parser.add_argument("--rmm-pool", default=None, help="RMM pool size per GPU, e.g. 24GB")
    parser.add_argument("--protocol", default="tcp", choices=("tcp", "ucx"))
    parser.add_argument("--cpu-workers", type=int, default=0)
    parser.add_argument("--cpu-threads", type=int, default=1, help="threads per CPU worker")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the workers")
    parser.add_argument("job", nargs=argparse.REMAINDER,
                        help="-- then the mgpu command line, e.g. -- run partition --powerlaw "
                        "100000x5000")
    args = parser.parse_args(argv)
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job or job[0] != "run":
        parser.error("give the job after --, e.g. -- run partition --powerlaw 100000x5000")
    if args.cpu_workers < 0:
        parser.error("--cpu-workers must be >= 0")

    import distributed

    gpu = args.devices is None or args.devices.lower() != "none"
    if gpu:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=args.devices, rmm_pool_size=args.rmm_pool,
            protocol=args.protocol, resources={"GPU": 1}, host="127.0.0.1",
            dashboard_address=None, death_timeout=args.timeout)
    else:
        if args.cpu_workers == 0:
            parser.error("--devices none needs --cpu-workers >= 1")
        cluster = distributed.LocalCluster(n_workers=0, host="127.0.0.1",
                                           dashboard_address=None, protocol=args.protocol)
    address = cluster.scheduler_address
    n_gpu = len(cluster.workers)
    helpers = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "1",
         "--nthreads", str(args.cpu_threads), "--resources", "CPU=1", "--death-timeout",
         str(args.timeout), "--name", f"cpu-{i}"],
        # a CPU worker sees no GPU, so that nothing it runs makes a CUDA context
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}) for i in range(args.cpu_workers)]
    env = {**os.environ, "DASK_MGPU__CONNECT__MIN_WORKERS": str(n_gpu + args.cpu_workers),
           "DASK_MGPU__CONNECT__TIMEOUT": str(args.timeout)}
    print(f"cluster at {address}: {n_gpu} GPU worker(s), {args.cpu_workers} CPU worker(s)",
          flush=True)
    try:
        return subprocess.run([sys.executable, "-m", "mgpu", *job, "--address", address],
                              env=env).returncode
    finally:
        for p in helpers:
            p.terminate()
        deadline = time.monotonic() + args.timeout
        for p in helpers:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
