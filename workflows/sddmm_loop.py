"""Your own loop of SDDMM calls on data that stays on the workers: one SPMD job, and the same
loop driven call by call from the client.

Shows: a bag-of-words corpus S kept in row tiles on the workers, and a loop of SDDMM calls
whose factors change between calls. The loop fits a positive rank-K model ``A Bᵀ`` to S's
margins (iterative proportional fitting): each step computes ``P = A Bᵀ`` on S's pattern
(``mgpu.sddmm(..., hadamard=False)``), scales A's rows so that P's row sums are S's (each
worker its own rows: no exchange), then B's rows so that the scaled P's column sums are S's
(every worker's column sums added up: one all-reduce).

- SPMD (``mgpu.spmd``): one task per worker runs all the steps on its tiles, B replicated on
  every worker and its update all-reduced through the communicator (NCCL between GPU
  workers); the client waits once and follows the row-margin error through progress events.
- Per call: the same steps as ``mgpu.sddmm`` calls on the dask array of tiles, with the
  factors' updates as lazy dask arrays between calls. No call waits (each returns what
  ``client.persist`` returns), so the calls queue on the cluster and the client waits once,
  at the end; but every call is a Dask graph, and B travels to every worker each step.

Run (the AP corpus of ../shared/data, two CPU workers):

    python workflows/sddmm_loop.py ../shared/data/bow/ap.dat.gz -k 16 --steps 50 \
        --workers 2 --cpu

``--out FILE`` writes both loops' results (A, B, the error per step, the times) as JSON.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

import mgpu
from mgpu import io


def _xp(X):
    """numpy for scipy/numpy data, cupy for a GPU worker's cupyx/cupy data."""
    if isinstance(X, (np.ndarray, sp.spmatrix, sp.sparray)):
        return np
    import cupy

    return cupy


def _row_sums(X, xp):
    return xp.asarray(X.sum(axis=1)).ravel()


def _scale(col, target, xp):
    """target / col where col > 0, else 1 (an empty row or column keeps its factor row)."""
    return xp.where(col > 0, target / xp.where(col > 0, col, 1), 1).astype(np.float32)


# ------------------------------------------------------------------------------------- SPMD

def fit_spmd(comm, s_parts, a_parts, B, steps):
    """One worker's share of the loop: its row tiles of S and A; B whole. Returns its rows
    of A (by tile) and, on rank 0, B and the error per step."""
    xp = comm.xp
    S = [p.data for p in s_parts]
    # copies: the parts are the workers' chunks of A_tiles, which Dask keeps for other
    # graphs; the loop updates its factors in place
    A = [xp.array(p.data, dtype=xp.float32) for p in a_parts]
    B = xp.array(B, dtype=xp.float32)  # a copy of its own: ranks may share a process
    r = [_row_sums(s, xp) for s in S]
    c = comm.allreduce(sum(xp.asarray(s.sum(axis=0)).ravel() for s in S))
    r2 = comm.allreduce(xp.asarray([sum(float((ri * ri).sum()) for ri in r)]))[0]
    errors = []
    for step in range(steps):
        stats = xp.zeros(B.shape[0] + 1, dtype=xp.float32)
        for s, a, ri in zip(S, A, r):
            P = mgpu.sddmm(s, a, B, hadamard=False, check_finite=False)
            rs = _row_sums(P, xp)
            t = _scale(rs, ri, xp)
            a *= t[:, None]
            stats[:-1] += P.T @ t  # column sums of the row-scaled P
            stats[-1] += ((rs - ri) ** 2).sum()
        stats = comm.allreduce(stats)  # every worker's column sums and error, added
        B *= _scale(stats[:-1], c, xp)[:, None]
        errors.append(float((stats[-1] / r2) ** 0.5))
        comm.report({"step": step + 1, "row_error": errors[-1]})
    host = [a.get() if xp is not np else a for a in A]
    return {"tiles": [p.index for p in a_parts], "A": host,
            "B": (B.get() if xp is not np else B) if comm.rank == 0 else None,
            "errors": errors}


# --------------------------------------------------------------------------- per call

def _tile_scale(P, r):
    xp = _xp(P)
    return _scale(_row_sums(P, xp), xp.asarray(r).ravel(), xp)[:, None]


def _tile_columns(P, t):
    xp = _xp(P)
    return (P.T @ xp.asarray(t).ravel())[None, :]


def _tile_error(P, r):
    xp = _xp(P)
    return xp.asarray([[float(((_row_sums(P, xp) - xp.asarray(r).ravel()) ** 2).sum())]])


def _a_update(A, t):
    xp = _xp(t)
    return xp.asarray(A) * t


def _b_update(B, col, c):
    xp = _xp(col)
    return xp.asarray(B) * _scale(col.ravel(), xp.asarray(c).ravel(), xp)[:, None]


def fit_per_call(S_tiles, A0, B0, r, c, steps):
    """The same loop as mgpu.sddmm calls from the client. Each call and each update is
    started (``persist``) and not waited for: the client waits when it computes the
    result."""
    rows, n = S_tiles.chunks[0], B0.shape[0]
    A = da.from_array(A0, chunks=(rows, A0.shape[1]))
    B = da.from_array(B0, chunks=B0.shape)
    r = da.from_array(r[:, None], chunks=(rows, 1))
    c = da.from_array(c[:, None], chunks=(n, 1))
    tiles = (1,) * len(rows)
    errors = []
    for _ in range(steps):
        P = mgpu.sddmm(S_tiles, A, B, hadamard=False, check_finite=False)
        t = da.map_blocks(_tile_scale, P, r, chunks=(rows, (1,)), dtype=np.float32)
        A = da.map_blocks(_a_update, A, t, dtype=np.float32)
        col = da.map_blocks(_tile_columns, P, t, chunks=(tiles, (n,)),
                            dtype=np.float32).sum(axis=0)
        B = da.map_blocks(_b_update, B, col[:, None], c, dtype=np.float32)
        err = da.map_blocks(_tile_error, P, r, chunks=(tiles, (1,)), dtype=np.float64).sum()
        # started, not waited for: the next call's graph reads the new factors where they
        # are, instead of holding (and the end recomputing) the chain of every update
        A, B, err = dask.persist(A, B, err)
        errors.append(err)
    return A, B, errors


def _host(x):
    return np.asarray(x.get() if hasattr(x, "get") else x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", help="bag-of-words file (LDA-C or UCI docword, plain or gzip)")
    ap.add_argument("-k", type=int, default=16, help="rank of the model")
    ap.add_argument("--steps", type=int, default=50, help="SDDMM calls")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="embedded cluster size")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--cpu", action="store_true", help="CPU workers only")
    where.add_argument("--gpu", action="store_true", help="GPU workers")
    ap.add_argument("--out", help="write the results to this JSON file")
    args = ap.parse_args()

    S = sp.csr_matrix(io.load(args.corpus), dtype=np.float32)
    rng = np.random.default_rng(args.seed)
    A0 = rng.uniform(0.5, 1.5, (S.shape[0], args.k)).astype(np.float32)
    B0 = rng.uniform(0.5, 1.5, (S.shape[1], args.k)).astype(np.float32)
    print(f"{Path(args.corpus).name}: {S.shape[0]:,} x {S.shape[1]:,}, {S.nnz:,} nonzeros; "
          f"rank {args.k}, {args.steps} SDDMM calls")
    gpus = True if args.gpu else False if args.cpu else None
    with mgpu.connect(gpus=gpus, n_workers=args.workers) as client:
        S_tiles = mgpu.from_scipy(S, args.workers, axis=0)  # stays on the workers
        A_tiles = da.from_array(A0, chunks=(S_tiles.chunks[0], args.k))

        def progress(rec: dict) -> None:
            if rec["step"] == 1 or rec["step"] % 10 == 0:
                print(f"SPMD step {rec['step']:3d}: row-margin error {rec['row_error']:.3e}")

        t0 = time.perf_counter()
        ranks = mgpu.spmd(fit_spmd, S_tiles, A_tiles, args=(B0, args.steps),
                          name="sddmm-loop", progress=progress)
        spmd_s = time.perf_counter() - t0
        pieces = sorted((i, a) for rank in ranks for i, a in zip(rank["tiles"], rank["A"]))
        A_spmd, B_spmd = np.vstack([a for _, a in pieces]), ranks[0]["B"]

        t0 = time.perf_counter()
        A_l, B_l, errs = fit_per_call(S_tiles, A0, B0, _row_sums(S, np), _col_sums(S),
                                      args.steps)
        submitted_s = time.perf_counter() - t0
        A_call, B_call, *errs = map(_host, dask.compute(A_l, B_l, *errs))
        per_call_s = time.perf_counter() - t0
    r2 = float((_row_sums(S, np).astype(np.float64) ** 2).sum())
    call_errors = [float((e / r2) ** 0.5) for e in errs]
    diff = max(float(np.abs(A_spmd - A_call).max() / np.abs(A_call).max()),
               float(np.abs(B_spmd - B_call).max() / np.abs(B_call).max()))
    print(f"SPMD: {spmd_s:.2f} s ({spmd_s / args.steps * 1e3:.1f} ms a step, one wait)")
    print(f"per call: {per_call_s:.2f} s ({per_call_s / args.steps * 1e3:.1f} ms a step; "
          f"the {args.steps} calls were submitted in {submitted_s:.2f} s)")
    print(f"row-margin error: {ranks[0]['errors'][0]:.3e} -> {ranks[0]['errors'][-1]:.3e}; "
          f"the two loops' factors differ by {diff:.1e} (relative)")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "spmd": {"seconds": spmd_s, "errors": ranks[0]["errors"], "A": A_spmd.tolist(),
                     "B": B_spmd.tolist()},
            "per_call": {"seconds": per_call_s, "errors": call_errors, "A": A_call.tolist(),
                         "B": B_call.tolist()},
            "tiles": len(S_tiles.chunks[0]), "k": args.k, "steps": args.steps,
            "seed": args.seed}))


def _col_sums(S):
    return np.asarray(S.sum(axis=0)).ravel().astype(np.float32)


if __name__ == "__main__":
    main()
