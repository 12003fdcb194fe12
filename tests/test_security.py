"""Dask's TLS for clusters that span machines, as docs/deploying.md configures it:
certificates named in Dask's config, the embedded cluster and mgpu.connect following it, and a
client without them refused with a message."""
from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.distributed import from_scipy, workers_now

def _graph(n: int = 60, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    upper = sp.triu(sp.random(n, n, density=0.1, random_state=rng, format="csr"), k=1)
    G = (upper + upper.T).tocsr()
    G.data[:] = 1.0
    return G


@pytest.mark.parametrize("gpus", [False, pytest.param(True, marks=pytest.mark.gpu)],
                         ids=["LocalCluster", "LocalCUDACluster"])
def test_embedded_cluster_and_a_joining_client_speak_tls_from_the_config(tls_config, gpus):
    G = _graph()
    expected = mgpu.jaccard(G)
    with dask.config.set(tls_config):
        with mgpu.connect(gpus=gpus, n_workers=None if gpus else 2, timeout=120) as client:
            address = client.scheduler.address
            assert address.startswith("tls://127.0.0.1:"), address
            workers = workers_now(client)
            assert workers and all(w.startswith("tls://") for w in workers), workers
            got = mgpu.jaccard(G, parts=2)
            assert (got != expected).nnz == 0
            if gpus:  # chunks on the GPU workers, GPU work through them
                x = from_scipy(G, device="gpu", client=client)
                np.testing.assert_allclose(mgpu.row_norms(x).compute().get(),
                                           mgpu.row_norms(G), rtol=1e-6)
            # a second client, joining by address as a job on another node would
            with mgpu.connect(address, n_workers=len(workers), timeout=30) as other:
                assert other.submit(sum, [1, 2, 3]).result() == 6


def test_a_client_without_the_certificates_is_refused_with_a_message(tls_config):
    with dask.config.set(tls_config):
        with mgpu.connect(gpus=False, n_workers=1) as client:
            address = client.scheduler.address
            bare = {"distributed.comm.require-encryption": False,
                    "distributed.comm.tls.ca-file": None,
                    "distributed.comm.tls.client.cert": None,
                    "distributed.comm.tls.client.key": None}
            with dask.config.set(bare):
                with pytest.raises(ValueError, match="speaks TLS.*distributed.comm.tls.ca-file"):
                    mgpu.connect(address, timeout=5)
                # plain TCP to a TLS listener: the handshake never completes
                with pytest.raises(TimeoutError, match="did not come up within 2 s"):
                    mgpu.connect(address.replace("tls://", "tcp://"), timeout=2)

