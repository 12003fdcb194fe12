"""Connecting to a Dask cluster: an embedded one by default, or any running scheduler."""
from __future__ import annotations

import json
import logging
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterator
from numbers import Integral, Real
from typing import Any

import distributed
import distributed.diagnostics.plugin
from dask.utils import parse_timedelta

from mgpu import config
from mgpu.distributed.protocol import check_protocol
from mgpu.ops.validation import Boolean, InstanceOf, Interval, check_param

logger = logging.getLogger(__name__)

__all__ = ["CLIENT", "Client", "connect", "current_client", "describe_workers", "visible_gpus",
           "worker_info", "workers_now"]


# the constraint of a ``client=`` parameter (mgpu.ops.validation.check_param)
CLIENT = InstanceOf((distributed.Client,), "a distributed.Client")


class Client(distributed.Client):
    """A :class:`distributed.Client` that also closes the cluster :func:`connect` started.

    Used as a context manager (``with mgpu.connect() as client:``) or closed with
    :meth:`close`; a client that joined a running scheduler leaves that cluster alone.
    """

    _mgpu_cluster: Any = None

    def __init__(self, *args: Any, **kwargs: Any):
        self._mgpu_helpers: list[subprocess.Popen] = []
        super().__init__(*args, **kwargs)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        result = super().close(*args, **kwargs)
        cluster, self._mgpu_cluster = self._mgpu_cluster, None
        helpers, self._mgpu_helpers = self._mgpu_helpers, []
        for p in helpers:
            p.terminate()
        for p in helpers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if cluster is not None:
            cluster.close()
        return result


def _cpu_worker(address: str, threads: int, timeout: float) -> subprocess.Popen:
    """A CPU worker process joined to ``address``, with no GPU visible to it (so that nothing
    it runs makes a CUDA context) and the resource ``CPU=1``."""
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "1",
         "--nthreads", str(threads), "--resources", "CPU=1", "--name", "cpu-0",
         "--death-timeout", str(timeout)],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def current_client() -> distributed.Client | None:
    """The client of this process's current cluster (``distributed.default_client``), or None."""
    try:
        return distributed.default_client()
    except ValueError:
        return None


def visible_gpus() -> int:
    """Number of CUDA GPUs this process could give workers, without creating a context.

    Reads ``CUDA_VISIBLE_DEVICES`` and NVML (through dask-cuda, when installed); 0 when
    dask-cuda or the NVIDIA driver is missing.
    """
    try:
        from dask_cuda.utils import get_n_gpus
    except ImportError:
        return 0
    try:
        return int(get_n_gpus())
    except Exception as exc:  # no driver, NVML refuses: no GPU workers
        logger.debug("no GPUs visible: %s", exc)
        return 0


def _timeout_error(what: str, timeout: float, hint: str) -> TimeoutError:
    return TimeoutError(f"{what} did not come up within {timeout:g} s. {hint}")


def completed(futures: list[Any], what: str, client: Any) -> Iterator[Any]:
    """The futures as they finish; a TimeoutError that says what was waited for when none of
    them finishes for ``mgpu.dist.stall-timeout``, where a cluster whose workers are gone, or
    a task that no worker can run, would make the wait last forever."""
    timeout = float(parse_timedelta(config.get("dist.stall-timeout"), "s"))
    pending = list(futures)
    while pending:
        try:
            done, not_done = distributed.wait(pending, timeout=timeout,
                                              return_when="FIRST_COMPLETED")
        except TimeoutError:
            n = len(workers_now(client))
            raise TimeoutError(
                f"{what}: {len(pending)} of {len(futures)} task(s) made no progress for "
                f"{timeout:g} s, with {n} worker(s) in the cluster. Check the workers' logs "
                "(a worker that died and did not come back, or one without the memory or GPU "
                "the task needs); raise mgpu.dist.stall-timeout if a task of this job runs "
                "longer.") from None
        yield from (f for f in pending if f in done)
        pending = [f for f in pending if f in not_done]


def result(future: Any, what: str, client: Any) -> Any:
    """``future.result()``, waited for as :func:`completed` waits: a TimeoutError that says
    what was waited for after ``mgpu.dist.stall-timeout`` without it."""
    for done in completed([future], what, client):
        return done.result()


def task_placement(holders: list[str], gpu: bool) -> dict[str, Any]:
    """``client.submit`` keywords that run a tile's task where the tile is (``holders``, its
    worker). Asked, not pinned, for CPU tiles: when that worker is lost the tile is made again
    elsewhere and its work follows it, where a pin would wait for the lost worker for ever. A
    GPU tile belongs to its device and stays pinned (moving one has not been tried)."""
    return {"workers": list(holders) or None, "allow_other_workers": bool(holders) and not gpu}


def _wait_for_workers(client: Any, n: int, timeout: float, where: str, logs: str) -> None:
    """Block until ``n`` workers are connected; on timeout close the client and say how many
    came up and where their logs are."""
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError as exc:
        have = len(workers_now(client))
        client.close()
        raise TimeoutError(f"{n} worker(s) of {where} did not come up within {timeout:g} s "
                           f"({have} did). {logs}") from exc


def slurm_cluster(options: dict[str, Any], gpus: bool | None = None,
                  protocol: str | None = None) -> tuple[Any, int, int]:
    """dask-jobqueue's SLURMCluster for ``connect(slurm=options)``, not yet scaled: the
    cluster, the jobs to submit and the workers each job brings. ``protocol="ucx"``: the
    scheduler listens on ucx://, and the workers, which follow its address, speak UCX too."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as exc:
        raise ImportError("connect(slurm=...) needs dask-jobqueue: pip install "
                          "'mgpu[slurm]'") from exc
    kw = dict(options)
    jobs = int(kw.pop("jobs", 1))
    gpus_per_job = int(kw.pop("gpus_per_job", 1 if gpus else 0))
    if jobs < 1 or gpus_per_job < 0:
        raise ValueError(f"The 'slurm' parameter of connect needs jobs >= 1 and gpus_per_job "
                         f">= 0. Got jobs={jobs}, gpus_per_job={gpus_per_job}.")
    kw.setdefault("processes", 1)
    if protocol is not None:
        kw.setdefault("protocol", f"{protocol}://")
    if gpus_per_job:
        # dask-cuda's worker: one worker per GPU that SLURM gives the job
        kw.setdefault("worker_command", "dask_cuda.cli")
        kw["job_extra_directives"] = [*kw.get("job_extra_directives", []),
                                      f"--gres=gpu:{gpus_per_job}"]
    cluster = SLURMCluster(**kw)
    return cluster, jobs, gpus_per_job or int(kw["processes"])


def _connect_slurm(options: dict[str, Any], gpus: bool | None, timeout: float,
                   protocol: str | None = None) -> Client:
    """Workers as SLURM jobs through dask-jobqueue (see :func:`connect`)."""
    options = {"death_timeout": timeout, **options}
    cluster, jobs, per_job = slurm_cluster(options, gpus, protocol)
    logger.info("submitting %d SLURM job(s):\n%s", jobs, cluster.job_script())
    cluster.scale(jobs=jobs)
    client = Client(cluster, timeout=timeout)
    client._mgpu_cluster = cluster
    _wait_for_workers(client, jobs * per_job, timeout, f"{jobs} SLURM job(s)",
                      f"Check them with squeue; their logs are in "
                      f"{options.get('log_directory') or 'the folder they were submitted from'}.")
    return client


def connect(
    address: str | None = None,
    *,
    gpus: bool | None = None,
    n_workers: int | None = None,
    timeout: float | None = None,
    slurm: dict[str, Any] | None = None,
    cpu_threads: int | None = None,
    protocol: str | None = None,
) -> Client:
    """Connect to a Dask cluster, starting an embedded one when no address is given.

    Parameters
    ----------
    address : str, optional
        A running scheduler (``"tcp://host:8786"``) or the path of a scheduler file. Without
        one, an embedded cluster is started: a dask-cuda ``LocalCUDACluster`` (one worker per
        GPU) when GPUs are visible, otherwise a ``LocalCluster`` sized to the CPU. The
        embedded cluster listens on ``mgpu.connect.host`` (localhost by default), over TLS
        when Dask's config asks for encryption (``distributed.comm.require-encryption``
        with ``distributed.comm.tls.*`` certificates).
    gpus : bool, optional
        Force (True) or forbid (False) GPU workers for the embedded cluster; default: use
        GPUs when any are visible.
    n_workers : int, optional
        Workers of the embedded cluster (default: every GPU, or ``mgpu.connect.n-workers``,
        or one per four cores). With ``address``: wait until this many workers have joined
        (default ``mgpu.connect.min-workers``; 0 does not wait).
    timeout : float, optional
        Seconds to wait for the scheduler and the workers (default ``mgpu.connect.timeout``).
    slurm : dict, optional
        Start the workers as SLURM jobs through dask-jobqueue's ``SLURMCluster`` (needs
        ``mgpu[slurm]``): its keyword arguments (``cores``, ``memory``, ``walltime``,
        ``queue``, ``account``, ...) over the ``jobqueue.slurm`` section of dask's config
        (``deploy/jobqueue.yaml`` is an example), plus ``jobs`` (how many to submit, default
        1). With ``gpus=True`` each job asks for ``gpus_per_job`` GPUs (default 1,
        ``--gres=gpu:N``) and runs dask-cuda's worker, one worker per GPU.
    cpu_threads : int, optional
        Embedded GPU cluster only: also start one CPU worker with this many threads, which
        sees no GPU (a mixed cluster, for work split between GPUs and CPUs such as HSGD*).
        GPU workers carry the resource ``GPU=1`` and the CPU worker ``CPU=1``.
    protocol : {'tcp', 'ucx'}, optional
        How the workers of a cluster started here (embedded, or SLURM jobs) talk:
        ``'tcp'`` (Dask's TCP, or TLS where Dask's config requires encryption) or
        ``'ucx'`` (UCX through distributed-ucxx, ``pip install 'mgpu[ucx]'``: NVLink,
        InfiniBand or shared memory, GPU buffers sent without a copy through host memory;
        dask-cuda's ``LocalCUDACluster(protocol="ucx")``). Default
        ``mgpu.connect.protocol``, else TCP. A running scheduler speaks the scheme of its
        address (``ucx://host:port``); a protocol given or set with ``address`` must match
        it.

    Returns
    -------
    Client
        A distributed client; closing it (or leaving its ``with`` block) also closes an
        embedded cluster.

    Raises
    ------
    ConnectionError
        At once, without waiting ``timeout``, if nothing listens at a ``tcp://`` or
        ``tls://`` address (ConnectionRefusedError) or its host does not resolve.
    TimeoutError
        If the scheduler or the workers do not come up in time; the message says which and
        where to look.
    ValueError
        If ``gpus=True`` but no GPU is visible, or ``n_workers < 1``, or ``address`` is a
        ``tls://`` scheduler and Dask's config holds no client certificate, or
        ``protocol`` differs from the scheme of ``address``, or is ``'ucx'`` where Dask's
        config requires encryption.
    ImportError
        If UCX is asked for (``protocol='ucx'`` or a ``ucx://`` address) and
        distributed-ucxx is not installed; nothing is started.

    Examples
    --------
    >>> import mgpu
    >>> with mgpu.connect(gpus=False, n_workers=1) as client:  # doctest: +SKIP
    ...     print(len(mgpu.distributed.workers_now(client)))
    1
    """
    check_param(address, "address", "connect",
                [InstanceOf((str,), "a str (the scheduler's address, tcp://host:port)"), None])
    check_param(gpus, "gpus", "connect", [Boolean(), None])
    check_param(n_workers, "n_workers", "connect", [Interval(Integral, 1, None), None])
    check_param(timeout, "timeout", "connect", [Interval(Real, 0, None, closed="neither"), None])
    check_param(slurm, "slurm", "connect",
                [InstanceOf((dict,), "a dict of dask-jobqueue SLURMCluster options"), None])
    # the range of cpu_threads is refused below, in words that say what it adds
    check_param(cpu_threads, "cpu_threads", "connect", [Interval(Integral, None, None), None])
    if cpu_threads is not None and (cpu_threads < 1 or address is not None or slurm is not None):
        raise ValueError("The 'cpu_threads' parameter of connect adds a CPU worker to an "
                         f"embedded cluster and must be >= 1. Got {cpu_threads!r}"
                         + (" with an address or slurm." if cpu_threads >= 1 else "."))
    protocol = check_protocol(protocol, address)
    return _low_latency(_connect(address, gpus=gpus, n_workers=n_workers, timeout=timeout,
                                 slurm=slurm, cpu_threads=cpu_threads, protocol=protocol))


class _SchedulerBatching(distributed.diagnostics.plugin.SchedulerPlugin):
    """Sets the scheduler's batching of what it sends to clients and workers to ``interval``
    seconds: the streams open now on start, each new worker's when it joins (a restarted
    worker too). distributed fixes these at 2 ms (clients) and 5 ms (workers)."""

    name = "mgpu-batching"

    def __init__(self, interval: float):
        self.interval = interval

    def _lower(self, comms: Any) -> None:
        for comm in comms:
            if hasattr(comm, "interval"):
                comm.interval = self.interval

    async def start(self, scheduler: Any) -> None:
        self._lower(scheduler.stream_comms.values())
        self._lower(scheduler.client_comms.values())

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self._lower([scheduler.stream_comms.get(worker)])

    def add_client(self, scheduler: Any, client: str) -> None:
        # the client's stream opens just after this hook: lower it once the loop turns
        scheduler.loop.add_callback(lambda: self._lower([scheduler.client_comms.get(client)]))


class _WorkerBatching(distributed.diagnostics.plugin.WorkerPlugin):
    """Sets a worker's batching of what it sends to the scheduler (2 ms in distributed)."""

    name = "mgpu-batching"

    def __init__(self, interval: float):
        self.interval = interval

    def setup(self, worker: Any) -> None:
        comm = getattr(worker, "batched_stream", None)
        if hasattr(comm, "interval"):
            comm.interval = self.interval


def _low_latency(client: Client) -> Client:
    """Lower every message batching between client, scheduler and workers to
    ``mgpu.connect.batch-interval``.

    distributed batches each stream's messages: 10 ms from a client to the scheduler, 5 ms
    from the scheduler to a worker, 2 ms from a worker back and from the scheduler to a
    client. One iterative call after another (an SDDMM, an SpMM, a kNN batch) waits through
    them however short its tasks are: with only the client's batching lowered, a no-op
    task's round trip on a GPU worker costs about as long as a whole SDDMM tile of tens of
    millions of nonzeros. The client's interval is an attribute of its stream; the
    scheduler's and the workers' are set by plugins, which also reach workers that join or
    restart later. A null setting leaves the cluster as it is; a scheduler that cannot load
    the plugin (mgpu not installed there) keeps its own batching, with a warning.
    """
    interval = parse_timedelta(config.get("connect.batch-interval"))
    if interval is None:
        return client
    comm = getattr(client, "scheduler_comm", None)
    if hasattr(comm, "interval"):
        comm.interval = interval
    try:
        client.register_plugin(_SchedulerBatching(interval))
        client.register_plugin(_WorkerBatching(interval))
    except Exception as exc:  # e.g. a scheduler without mgpu: slower, still correct
        logger.warning("could not lower the cluster's message batching to %s s (%s: %s); "
                       "back-to-back calls keep distributed's 2-5 ms per hop", interval,
                       type(exc).__name__, exc)
    return client


def _check_tls(address: str) -> None:
    """Refuse a ``tls://`` scheduler (given or in a scheduler file) before any client is made
    when Dask's config gives this client no certificate: distributed's own TypeError leaves
    the failed client's event loop behind, and the next client of the process can hang."""
    if os.path.isfile(address):
        try:
            with open(address) as f:
                address = str(json.load(f).get("address", ""))
        except (OSError, ValueError, AttributeError):
            return  # distributed reports an unreadable scheduler file in its own words
    if not address.startswith("tls://"):
        return
    sec = distributed.Security()
    if sec.tls_ca_file is None or sec.tls_client_cert is None:
        raise ValueError(
            f"The scheduler at {address} speaks TLS and Dask's config gives this client no "
            "certificate: set distributed.comm.tls.ca-file, distributed.comm.tls.client.cert "
            "and distributed.comm.tls.client.key (docs/deploying.md: across machines, "
            "encrypted).")


def _file_address(path: str) -> str | None:
    """The address a scheduler file names, or None (distributed reports an unreadable
    file in its own words)."""
    try:
        with open(path) as f:
            return str(json.load(f).get("address", "")) or None
    except (OSError, ValueError, AttributeError):
        return None


def _probe(address: str | None, wait: float = 2.0) -> None:
    """Refuse at once a TCP scheduler address where nothing listens (the connection is
    refused) or whose host does not resolve, rather than letting the client retry it for
    the whole ``mgpu.connect.timeout``. A host that does not answer within ``wait`` seconds
    (a firewall that drops packets, a scheduler still starting) is left to the client's
    own wait, as is any address of another protocol (ucx://, inproc://)."""
    if not address:
        return
    scheme, sep, rest = address.rpartition("://")
    if sep and scheme not in ("tcp", "tls"):
        return
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit():
        return  # distributed reports a malformed address in its own words
    host = host.strip("[]")  # an IPv6 literal
    try:
        with socket.create_connection((host, int(port)), timeout=wait):
            return
    except ConnectionRefusedError:
        raise ConnectionRefusedError(
            f"Nothing listens at {address} (the connection was refused): start the scheduler "
            "there first (`dask scheduler`, or mgpu's SLURM batch script), or check the "
            "address and port its log gives.") from None
    except socket.gaierror as exc:
        raise ConnectionError(f"The scheduler address {address} names a host that does not "
                              f"resolve ({exc.strerror}): check the address.") from None
    except OSError:  # timed out, unreachable: the client's own wait decides
        return


def _connect(address: str | None, *, gpus: bool | None, n_workers: int | None,
             timeout: float | None, slurm: dict[str, Any] | None,
             cpu_threads: int | None = None, protocol: str | None = None) -> Client:
    timeout = float(timeout if timeout is not None else config.get("connect.timeout"))
    if address is not None:
        kw: dict[str, Any] = {"timeout": timeout}
        if os.path.isfile(address):
            kw["scheduler_file"] = address
        else:
            kw["address"] = address
        _check_tls(address)
        _probe(kw.get("address") or _file_address(address))
        try:
            client = Client(**kw)
        except (OSError, TimeoutError) as exc:
            raise _timeout_error(
                f"The scheduler at {address}",
                timeout,
                "Check that it is running and reachable from here (its log says which "
                "address it listens on); raise mgpu.connect.timeout if it is slow to start.",
            ) from exc
        want = n_workers or int(config.get("connect.min-workers") or 0)
        if want:
            _wait_for_workers(client, want, timeout, f"the scheduler at {address}",
                              "Their logs are where they were started (for the SLURM batch "
                              "script: the job's output file).")
        return client
    if slurm is not None:
        return _connect_slurm(slurm, gpus, timeout, protocol)

    n_gpus = visible_gpus()
    use_gpus = n_gpus > 0 if gpus is None else gpus
    if use_gpus and n_gpus == 0:
        raise ValueError(
            "gpus=True but no GPU is visible (dask-cuda is missing or NVML found no device); "
            "install mgpu[gpu] or pass gpus=False."
        )
    if cpu_threads and not use_gpus:
        raise ValueError("The 'cpu_threads' parameter of connect adds a CPU worker beside GPU "
                         "workers; an embedded CPU cluster is sized by n_workers and "
                         "mgpu.connect.threads-per-worker instead.")
    host = config.get("connect.host")
    dashboard = ":8787" if config.get("connect.dashboard") else None
    # None: Dask's default scheme (tcp, or tls where the config requires encryption)
    speaks = {} if protocol is None else {"protocol": protocol}
    if use_gpus:
        from dask_cuda import LocalCUDACluster

        n = n_workers or n_gpus
        logger.info("starting LocalCUDACluster with %d GPU worker(s) on %s (%s)", n, host,
                    protocol or "tcp")
        cluster = LocalCUDACluster(
            n_workers=n,
            host=host,
            dashboard_address=dashboard,
            death_timeout=timeout,
            resources={"GPU": 1},
            **speaks,
        )
        what = "LocalCUDACluster (GPU workers)"
    else:
        from distributed.deploy.utils import nprocesses_nthreads

        cores = os.cpu_count() or 1
        # Dask's own sizing (one process per core up to 4 cores, then about sqrt(cores)).
        default_n, default_threads = nprocesses_nthreads(cores)
        n = n_workers or config.get("connect.n-workers") or default_n
        threads = config.get("connect.threads-per-worker") or (
            default_threads if n == default_n else max(1, cores // n)
        )
        logger.info("starting LocalCluster: %d worker(s) x %d thread(s) on %s (%s)", n,
                    threads, host, protocol or "tcp")
        cluster = distributed.LocalCluster(
            n_workers=n,
            threads_per_worker=threads,
            processes=True,
            host=host,
            dashboard_address=dashboard,
            death_timeout=timeout,
            **speaks,
        )
        what = "LocalCluster (CPU workers)"
    client = Client(cluster, timeout=timeout)
    client._mgpu_cluster = cluster
    if cpu_threads:
        client._mgpu_helpers.append(_cpu_worker(cluster.scheduler_address, cpu_threads,
                                                timeout))
        n += 1
        what = "LocalCUDACluster (GPU workers) and its CPU worker"
    _wait_for_workers(client, n, timeout, f"the embedded {what}",
                      "Worker logs go to this process's stderr (set "
                      "DASK_LOGGING__DISTRIBUTED=debug for more).")
    return client


def _cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def worker_info(dask_worker: Any = None) -> dict[str, Any]:
    """What a worker runs on: host, pid, threads, and its GPU if it has one.

    Runs inside the worker (``client.run(worker_info)`` passes ``dask_worker``). The GPU is the first entry of the
    worker's ``CUDA_VISIBLE_DEVICES`` (dask-cuda pins one per worker), read through NVML so
    that no CUDA context is made.
    """
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "gpu": None,
    }
    if dask_worker is not None:
        info["nthreads"] = dask_worker.state.nthreads
        info["memory_limit"] = dask_worker.memory_manager.memory_limit
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() in ("", "-1"):
        return info
    first = visible.split(",")[0].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if first.startswith(("GPU-", "MIG-")):
                h = pynvml.nvmlDeviceGetHandleByUUID(first)
            else:
                h = pynvml.nvmlDeviceGetHandleByIndex(int(first))
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
        finally:
            pynvml.nvmlShutdown()
        info["gpu"] = {
            "index": first,
            "name": name.decode() if isinstance(name, bytes) else name,
            "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            "memory": int(mem),
        }
    except Exception as exc:  # NVML missing or refusing: report what is known
        info["gpu"] = {"index": first, "error": f"{type(exc).__name__}: {exc}"}
    return info


def workers_now(client: distributed.Client) -> dict[str, dict[str, Any]]:
    """The cluster's workers by address, each with what the scheduler knows of it, asked of
    the scheduler at the call. ``client.scheduler_info()["workers"]`` is not that: the
    client's periodic refresh (every ``distributed.client.scheduler-info-interval``) stores
    an identity without its workers, and can land between that call's own fetch and its
    return, so that it names no worker while the workers are up."""
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def describe_workers(client: distributed.Client) -> dict[str, dict[str, Any]]:
    """:func:`worker_info` of every worker, keyed by worker address (sorted)."""
    return dict(sorted(client.run(worker_info).items()))
