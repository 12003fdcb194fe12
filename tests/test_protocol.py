"""UCX between workers (``mgpu.connect(protocol=...)``, ``--protocol``) and ``mgpu bench
transfer``: every refusal comes before anything starts, and says what to install or change.

CI has no distributed-ucxx: where a test needs it to be there, the check that looks for it
is replaced, and the cluster classes are replaced by ones that record what they were asked
for. The GPU tests at the end run the real thing on two GPUs.
"""
from __future__ import annotations

import json

import dask.config
import distributed
import numpy as np
import pytest
from click.testing import CliRunner

import mgpu
import mgpu.distributed.cluster as cl
import mgpu.distributed.protocol as pr
from mgpu.cli import main
from mgpu.distributed import workers_now


class _Started(Exception):
    """Raised by a recording cluster class instead of starting anything."""


def _recorder(monkeypatch, target, name):
    """Replace ``target.name`` by a class that records its keyword arguments and raises."""
    seen: list[dict] = []

    def record(*args, **kwargs):
        seen.append(kwargs)
        raise _Started(name)

    monkeypatch.setattr(target, name, record, raising=False)
    return seen


@pytest.fixture
def no_ucx(monkeypatch):
    monkeypatch.setattr(pr, "ucx_available", lambda: False)


@pytest.fixture
def with_ucx(monkeypatch):
    monkeypatch.setattr(pr, "ucx_available", lambda: True)


@pytest.fixture
def nothing_starts(monkeypatch):
    """Any cluster or client made fails the test: a refusal must come first."""
    def fail(*args, **kwargs):
        raise AssertionError("a cluster or client was started before the refusal")

    monkeypatch.setattr(distributed, "LocalCluster", fail)
    monkeypatch.setattr(cl, "Client", fail)
    monkeypatch.setattr(cl, "_probe", fail)


def _scheduler_file(tmp_path, address):
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps({"address": address, "type": "Scheduler"}))
    return str(path)


# ------------------------------------------------------------------ refusals


def test_ucx_without_distributed_ucxx_names_the_extra(no_ucx, nothing_starts):
    with pytest.raises(ImportError, match=r"^The 'protocol' parameter of connect is 'ucx', "
                       r"which needs distributed-ucxx, not installed in this Python: pip "
                       r"install 'mgpu\[ucx\]'"):
        mgpu.connect(gpus=False, n_workers=1, protocol="ucx")
    with dask.config.set({"mgpu.connect.protocol": "ucx"}):
        with pytest.raises(ImportError, match=r"mgpu\[ucx\]"):
            mgpu.connect(gpus=False, n_workers=1)


def test_a_ucx_scheduler_without_distributed_ucxx_is_named(no_ucx, nothing_starts, tmp_path):
    with pytest.raises(ImportError, match=r"^The scheduler at ucx://10\.1\.2\.3:8786 speaks "
                       r"UCX, which needs distributed-ucxx.*mgpu\[ucx\]"):
        mgpu.connect("ucx://10.1.2.3:8786")
    path = _scheduler_file(tmp_path, "ucx://10.1.2.3:8786")
    with pytest.raises(ImportError, match=r"^The scheduler at ucx://10\.1\.2\.3:8786, from the "
                       r"scheduler file .*scheduler\.json speaks UCX"):
        mgpu.connect(path)


@pytest.mark.parametrize("address, protocol, speaks", [
    ("tcp://127.0.0.1:8786", "ucx", "tcp"),
    ("ucx://127.0.0.1:8786", "tcp", "ucx"),
    ("tls://127.0.0.1:8786", "ucx", "tls"),
    ("ucxx://127.0.0.1:8786", "tcp", "ucxx"),
])
def test_a_protocol_that_differs_from_the_address_is_refused(with_ucx, nothing_starts, address,
                                                             protocol, speaks):
    with pytest.raises(ValueError, match=rf"^The 'protocol' parameter of connect must match "
                       rf"the scheduler's address, which speaks {speaks}:// \({address}\)\. Got "
                       rf"protocol='{protocol}'\. Leave protocol out"):
        mgpu.connect(address, protocol=protocol)


def test_the_protocol_setting_must_match_too_and_be_known(with_ucx, nothing_starts, tmp_path):
    path = _scheduler_file(tmp_path, "tcp://127.0.0.1:8786")
    with dask.config.set({"mgpu.connect.protocol": "ucx"}):
        with pytest.raises(ValueError, match=r"^The 'protocol' parameter of connect \(from "
                           r"mgpu.connect.protocol\) must match .* speaks tcp:// "
                           r"\(tcp://127.0.0.1:8786, from the scheduler file"):
            mgpu.connect(path)
    with dask.config.set({"mgpu.connect.protocol": "udp"}):
        with pytest.raises(ValueError, match=r"^The 'protocol' parameter of connect comes from "
                           r"mgpu.connect.protocol, which must be one of \['tcp', 'ucx'\] or "
                           r"null. Got 'udp'"):
            mgpu.connect(gpus=False)


def test_ucx_where_encryption_is_required_is_refused(with_ucx, nothing_starts):
    with dask.config.set({"distributed.comm.require-encryption": True}):
        with pytest.raises(ValueError, match=r"'ucx', which does not encrypt, but Dask's config "
                           r"sets distributed.comm.require-encryption"):
            mgpu.connect(gpus=False, protocol="ucx")


@pytest.mark.parametrize("bad", ["nccl", "UCX", 3])
def test_unknown_protocols_are_refused_by_name(bad, nothing_starts):
    with pytest.raises(ValueError, match=r"^The 'protocol' parameter of connect must be a str "
                       r"among \{'tcp', 'ucx'\} or None\. Got"):
        mgpu.connect(gpus=False, protocol=bad)


# ------------------------------------------------------------------ what is started


def test_ucx_starts_the_embedded_cluster_with_it(with_ucx, monkeypatch):
    monkeypatch.setattr(cl, "visible_gpus", lambda: 0)
    seen = _recorder(monkeypatch, distributed, "LocalCluster")
    with pytest.raises(_Started):
        mgpu.connect(gpus=False, n_workers=2, protocol="ucx")
    assert seen[-1]["protocol"] == "ucx" and seen[-1]["n_workers"] == 2
    # tcp, or nothing said: Dask's default scheme (TLS where the config requires it)
    for kw in ({"protocol": "tcp"}, {}):
        with pytest.raises(_Started):
            mgpu.connect(gpus=False, n_workers=1, **kw)
        assert "protocol" not in seen[-1]


def test_ucx_starts_dask_cuda_with_it(with_ucx, monkeypatch):
    import sys
    import types

    monkeypatch.setattr(cl, "visible_gpus", lambda: 2)
    fake = types.ModuleType("dask_cuda")
    monkeypatch.setitem(sys.modules, "dask_cuda", fake)
    seen = _recorder(monkeypatch, fake, "LocalCUDACluster")
    with pytest.raises(_Started):
        mgpu.connect(protocol="ucx")
    assert seen[-1]["protocol"] == "ucx" and seen[-1]["n_workers"] == 2
    assert seen[-1]["resources"] == {"GPU": 1}


def test_slurm_jobs_get_the_protocol(with_ucx, monkeypatch):
    dask_jobqueue = pytest.importorskip("dask_jobqueue")
    seen = _recorder(monkeypatch, dask_jobqueue, "SLURMCluster")
    with pytest.raises(_Started):
        mgpu.connect(slurm={"cores": 1, "memory": "1GiB"}, protocol="ucx")
    assert seen[-1]["protocol"] == "ucx://"
    with pytest.raises(_Started):
        mgpu.connect(slurm={"cores": 1, "memory": "1GiB"})
    assert "protocol" not in seen[-1]


def test_tcp_joins_and_starts_as_before():
    with mgpu.connect(gpus=False, n_workers=1, protocol="tcp") as client:
        address = client.scheduler.address
        assert address.startswith("tcp://")
        with mgpu.connect(address, protocol="tcp", timeout=20) as joined:
            assert joined.submit(sum, [40, 2]).result() == 42


# ------------------------------------------------------------------ the command line


def test_cli_protocol_is_refused_before_any_work(no_ucx):
    r = CliRunner().invoke(main, ["info", "--protocol", "ucx"])
    assert r.exit_code == 2
    assert "Invalid value for '--protocol': ucx needs distributed-ucxx: pip install " \
           "'mgpu[ucx]'" in r.output
    r = CliRunner().invoke(main, ["info", "--protocol", "nccl"])
    assert r.exit_code == 2 and "'nccl' is not one of 'tcp', 'ucx'" in r.output


def test_cli_protocol_goes_through_connect_for_the_command_only(with_ucx, nothing_starts):
    r = CliRunner().invoke(main, ["run", "partition", "--powerlaw", "50x40", "--nnz", "200",
                                  "--protocol", "tcp", "--address", "ucx://127.0.0.1:8786"])
    assert r.exit_code == 2, r.output
    assert "The 'protocol' parameter of connect (from mgpu.connect.protocol) must match the " \
           "scheduler's address, which speaks ucx://" in r.output
    assert dask.config.get("mgpu.connect.protocol") is None  # only for that command


def test_cli_scaling_benchmarks_take_the_protocol():
    for name in ("sddmm-scaling", "knn-scaling", "spgemm-scaling", "gap", "transfer"):
        cmd = main.commands["bench"].commands[name]
        opts = {o for p in cmd.params for o in p.opts}
        assert {"--protocol", "--protocols"} & opts, name


# ------------------------------------------------------------------ bench transfer


def test_bench_transfer_moves_a_host_array_between_two_cpu_workers(tmp_path, no_ucx):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["bench", "transfer", "--device", "cpu", "--size", "4MB",
                                  "--repeats", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "ucx: not measured, distributed-ucxx is not installed" in r.output
    assert "| tcp (tcp://) | numpy | 0.004 GB |" in r.output
    (row,) = json.loads(out.read_text())
    assert row["protocol"] == "tcp" and row["bytes"] == 4_000_000 and row["repeats"] == 2
    assert len(row["transfer_s"]) == 2 and all(t > 0 for t in row["transfer_s"])
    assert row["gbps"] == pytest.approx(np.median([4e6 / t / 1e9 for t in row["transfer_s"]]))
    assert row["gbps_min"] <= row["gbps"] <= row["gbps_max"]


def test_bench_transfer_checks_that_the_array_arrived_whole(monkeypatch):
    """A move that changed the data is an error, not a number."""
    from mgpu.bench import transfer

    monkeypatch.setattr(transfer, "_checksum", lambda x: float(np.float32(x[0]) + 1))
    with pytest.raises(RuntimeError, match="changed on the way"):
        transfer.bench_transfer(4096, ("tcp",), gpu=False, repeats=1)


@pytest.mark.parametrize("args, match", [
    (["--device", "gpu"], "bench transfer between GPU workers needs 2 GPUs; 0 visible. Pass "
                          "--device cpu"),
    (["--device", "cpu", "--protocols", "ucx"], "ucx needs distributed-ucxx: pip install "
                                                "'mgpu[ucx]'"),
    (["--device", "cpu", "--protocols", "tcp,nccl"], "expected protocols among tcp, ucx, got "
                                                     "'tcp,nccl'"),
    (["--device", "cpu", "--size", "lots"], "expected a size such as 1GB or 256MiB"),
    (["--device", "cpu", "--size", "2"], "must be at least 4 bytes"),
])
def test_bench_transfer_refuses_before_starting_anything(args, match, no_ucx, monkeypatch):
    monkeypatch.setattr(cl, "visible_gpus", lambda: 0)
    monkeypatch.setattr("mgpu.distributed.visible_gpus", lambda: 0)
    r = CliRunner().invoke(main, ["bench", "transfer", *args])
    assert r.exit_code == 2 and match in r.output, r.output


def test_bench_transfer_rmm_pool_needs_rmm_and_gpu_workers(monkeypatch, no_ucx):
    import importlib.util

    real = importlib.util.find_spec
    for have_rmm, match in ((False, "Invalid value for '--rmm-pool': needs rmm: pip install "
                                    "'mgpu[ucx]'"),
                            (True, "--rmm-pool is for GPU workers; leave it out with --device "
                                   "cpu")):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, have=have_rmm: (object() if have else None)
                            if name == "rmm" else real(name, *a))
        r = CliRunner().invoke(main, ["bench", "transfer", "--device", "cpu", "--rmm-pool",
                                      "8GB"])
        assert r.exit_code == 2 and match in r.output, r.output


# ------------------------------------------------------------------ on GPUs


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_ucx_moves_a_cupy_array_between_two_gpu_workers_intact():
    pytest.importorskip("distributed_ucxx", reason="UCX is an extra: pip install 'mgpu[ucx]'")
    import cupy

    with mgpu.connect(gpus=True, n_workers=2, protocol="ucx") as client:
        assert client.scheduler.address.startswith("ucx://")
        workers = sorted(workers_now(client))
        assert all(w.startswith("ucx://") for w in workers)
        x = client.submit(lambda: cupy.arange(1 << 20, dtype=cupy.float32), workers=workers[:1],
                          pure=False)
        got = client.submit(lambda a: (type(a).__module__, float(a.astype("float64").sum())),
                            x, workers=workers[1:], allow_other_workers=False).result()
    assert got[0].startswith("cupy") and got[1] == float((1 << 20) * ((1 << 20) - 1) / 2)


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_bench_transfer_between_two_gpu_workers():
    """TCP, and UCX with an RMM pool where mgpu[ucx] is installed: each row's moves are
    checked (sample sums) and come from the receiving worker's own fetch record."""
    import importlib.util

    from mgpu.bench.transfer import bench_transfer

    protocols = ("tcp", "ucx") if pr.ucx_available() else ("tcp",)
    pool = (1 << 30) if importlib.util.find_spec("rmm") else None
    rows = bench_transfer(64 << 20, protocols, gpu=True, repeats=2, rmm_pool=pool)
    assert [(r["protocol"], r["scheme"], r["array"]) for r in rows] == \
        [(p, p, "cupy") for p in protocols]
    assert all(r["gbps"] > 0 and len(r["transfer_s"]) == 2 for r in rows)
