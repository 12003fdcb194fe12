"""Promises that RELIABILITY.md lists: a lost worker costs time, not results; the embedded
cluster is reachable from this machine only; user files are never unpickled."""
from __future__ import annotations

import os
import re
import signal

import numpy as np
import scipy.sparse as sp
from conftest import REPO_ROOT

import mgpu


def test_jaccard_result_survives_a_killed_worker():
    """A worker process is killed as soon as the first row block is back; the blocks it held
    or would have run are computed elsewhere (or by its restarted process) and the weights
    are identical to an undisturbed run."""
    rng = np.random.default_rng(0)
    A = sp.random(3000, 3000, density=0.004, random_state=rng, format="csr")
    G = ((A + A.T) > 0).astype(np.float64).tocsr()
    ref = mgpu.jaccard(G)
    with mgpu.connect(gpus=False, n_workers=3) as client:
        killed = []

        def kill_one(_edges: int) -> None:
            if not killed:
                addr, pid = sorted(client.run(os.getpid).items())[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(addr)

        J = mgpu.jaccard(G, parts=24, client=client, progress=kill_one)
    assert killed
    assert (J != ref).nnz == 0 and np.array_equal(J.indptr, ref.indptr)


def test_embedded_cluster_listens_on_localhost_only():
    with mgpu.connect(gpus=False, n_workers=2) as client:
        info = client.scheduler_info()
        addresses = [client.scheduler.address, *info["workers"]]
    assert addresses and all(a.startswith("tcp://127.0.0.1:") for a in addresses), addresses


def test_no_user_file_is_ever_unpickled():
    """No pickle loads and no allow_pickle=True anywhere in the library or the workflows."""
    bad = re.compile(r"allow_pickle\s*=\s*True|pickle\.loads?\(|\.load\(.*mmap_mode")
    offenders = []
    for folder in ("mgpu", "workflows", "deploy"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if bad.search(line):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders
