"""Matrix factorisation in several modes from one start, each on the cluster it needs.

What ``mgpu run mf`` and ``mgpu bench mf`` do between reading the ratings and reporting:
check the modes, split the ratings, start (or join) the cluster the modes need, and train
every mode with :func:`mgpu.bench.mf.train_modes`. Nothing here prints; the caller hears of
each step through callbacks.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import scipy.sparse as sp

import mgpu.distributed.cluster as _cluster
from mgpu.bench.mf import train_modes
from mgpu.mf import MODES, split_ratings
from mgpu.mf.modes import GPU_MODES, MIXED_MODES

__all__ = ["compare_modes", "parse_modes"]


def parse_modes(modes: str | Sequence[str]) -> list[str]:
    """The modes of a comma-separated list (or a sequence), each one of ``mgpu.mf.MODES``.

    >>> parse_modes("sequential, cpu")
    ['sequential', 'cpu']
    """
    names = [m.strip() for m in (modes.split(",") if isinstance(modes, str) else modes)
             if m.strip()]
    bad = [m for m in names if m not in MODES]
    if bad or not names:
        raise ValueError(f"modes must be among {', '.join(MODES)}; got {modes!r}")
    return names


def connect_for(modes: Sequence[str], address: str | None = None,
                cpu_threads: int | None = None) -> Any:
    """The cluster the modes need: none (sequential alone), a CPU cluster (cpu), GPU workers
    (gpu), or GPU workers and a CPU worker of ``cpu_threads`` threads (the hsgd modes; default
    one thread per core not driving a GPU). ``address`` joins a running scheduler instead."""
    if all(m == "sequential" for m in modes):
        return None
    if address is not None:
        return _cluster.connect(address)
    if not any(m in GPU_MODES for m in modes):
        return _cluster.connect(gpus=False)
    n_gpus = _cluster.visible_gpus()
    if n_gpus == 0:
        raise ValueError(f"modes {', '.join(m for m in modes if m in GPU_MODES)} run on GPU "
                         "workers and no GPU is visible; use sequential and cpu, or --address "
                         "a cluster with GPU workers.")
    if any(m in MIXED_MODES for m in modes):
        threads = cpu_threads or max(1, (os.cpu_count() or 1) - n_gpus)
        return _cluster.connect(gpus=True, cpu_threads=threads)
    return _cluster.connect(gpus=True)


def compare_modes(R: sp.spmatrix, modes: str | Sequence[str], *, k: int, lr: float,
                  reg: float, epochs: int, target_rmse: float | None,
                  test_fraction: float = 0.1, seed: int = 0, address: str | None = None,
                  cpu_threads: int | None = None, one_cluster: bool = False,
                  split: Callable[[sp.csr_matrix, sp.csr_matrix], None] | None = None,
                  on_cluster: Callable[[str | None, Any], None] | None = None,
                  callback: Callable[[str], Callable[[dict[str, Any]], None]] | None = None,
                  done: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Split ``R`` and train every mode of ``modes`` from one start.

    Without ``address`` or ``one_cluster``, each mode that needs a cluster gets a fresh
    embedded one of the same shape: on a shared cluster a mode run after others inherits
    what they left on the workers, and the `cpu` mode after the GPU modes takes markedly
    longer to the target than it does first.

    Parameters
    ----------
    R : sparse matrix of shape (n_users, n_items)
        The ratings.
    modes : str or sequence of str
        Modes of ``mgpu.MatrixFactorization``, comma-separated or as a list.
    k, lr, reg, epochs, target_rmse, seed
        As ``MatrixFactorization`` takes them (``target_rmse`` 0 or None: every epoch).
    test_fraction : float
        Share of the ratings held out at random for the test RMSE.
    address, cpu_threads, one_cluster
        Where the modes run: see :func:`connect_for`.
    split, on_cluster, callback, done
        ``split(train, test)`` once the ratings are split; ``on_cluster(mode, client)`` for
        each cluster started or joined (``mode`` None for the one shared by every mode);
        ``callback(mode)`` gives a fit's per-epoch callback; ``done(mode, model)`` as each
        mode finishes.

    Returns
    -------
    dict of str to MatrixFactorization
        The fitted models by mode, in the order of ``modes``.

    Raises
    ------
    ValueError
        An unknown mode, a ``test_fraction`` outside (0, 1), or GPU modes with no GPU.
    """
    names = parse_modes(modes)
    train, test = split_ratings(R.tocoo(), test_fraction, seed)
    if split is not None:
        split(train, test)
    fresh = address is None and not one_cluster and len(names) > 1
    client = None if fresh else connect_for(names, address, cpu_threads)
    if client is not None and on_cluster is not None:
        on_cluster(None, client)

    @contextlib.contextmanager
    def cluster(mode: str) -> Iterator[None]:
        """A fresh cluster around one mode's fit, where each mode gets its own."""
        own = connect_for(names, None, cpu_threads) if fresh and mode != "sequential" else None
        try:
            if own is not None and on_cluster is not None:
                on_cluster(mode, own)
            yield
        finally:
            if own is not None:
                own.close()

    try:
        return train_modes(train, test, names, k=k, lr=lr, reg=reg, epochs=epochs,
                           target_rmse=target_rmse or None, seed=seed, callback=callback,
                           done=done, cluster=cluster)
    finally:
        if client is not None:
            client.close()
