"""A recommender from ratings: GradientMF fitted on a cluster, scored on held-out ratings.

Shows: MovieLens-style ratings split into training and test ratings, the factorisation
``r ≈ μ + u · v`` fitted by full-batch gradient descent with Adam (mgpu.models.GradientMF:
each step one SDDMM and two SpMM) with the users in row tiles on the workers (one SPMD job:
every worker runs all the steps on its tiles, V's gradient all-reduced between them), the
test RMSE per step as the workers report it, and the best-scored movies a user has not rated.

Run (MovieLens ml-latest-small of ../shared/data, two CPU workers):

    python workflows/recommender.py \
        ../shared/data/ratings/ml-latest-small-2016_ratings.csv.gz \
        -k 32 --iters 100 --workers 2 --cpu --user 1 --top 10

``--workers 0`` fits in this process on one device (a GPU when ``--gpu``); ``--out FILE``
writes the history and the recommendations as JSON.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import mgpu
from mgpu.io import load_ratings
from mgpu.mf import split_ratings
from mgpu.models import GradientMF


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ratings", help="ratings file (user,item,rating[,timestamp] lines)")
    ap.add_argument("-k", type=int, default=32, help="rank of the factors")
    ap.add_argument("--iters", type=int, default=100, help="gradient steps")
    ap.add_argument("--lr", type=float, default=0.01, help="Adam's step size")
    ap.add_argument("--reg", type=float, default=0.1, help="L2 penalty")
    ap.add_argument("--test-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--user", type=int, default=None,
                    help="original id of the user to recommend for (default: the first)")
    ap.add_argument("--top", type=int, default=10, help="items recommended")
    ap.add_argument("--workers", type=int, default=None,
                    help="embedded cluster size (default: mgpu.connect's); 0: this process")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--cpu", action="store_true", help="CPU workers only")
    where.add_argument("--gpu", action="store_true", help="GPU workers (or this GPU)")
    ap.add_argument("--out", help="write the results to this JSON file")
    args = ap.parse_args()

    ratings = load_ratings(args.ratings)
    train, test = split_ratings(ratings.matrix, args.test_fraction, args.seed)
    print(f"{Path(args.ratings).name}: {train.shape[0]:,} users x {train.shape[1]:,} items, "
          f"{train.nnz:,} training and {test.nnz:,} test ratings")

    def report(rec: dict) -> None:
        if rec["iteration"] == 1 or rec["iteration"] % 10 == 0:
            print(f"step {rec['iteration']:4d}: training RMSE {rec['train_rmse']:.4f}, "
                  f"test RMSE {rec['test_rmse']:.4f}")

    model = GradientMF(args.k, reg=args.reg, lr=args.lr, iters=args.iters, seed=args.seed)
    if args.workers == 0:
        tr, te = train, test
        if args.gpu:
            import cupyx.scipy.sparse as csp

            tr, te = csp.csr_matrix(train), csp.csr_matrix(test)
        model.fit(tr, te, progress=report)
    else:
        gpus = True if args.gpu else False if args.cpu else None
        with mgpu.connect(gpus=gpus, n_workers=args.workers) as client:
            model.fit(train, test, client=client, progress=report)
    U, V = (np.asarray(A.get() if hasattr(A, "get") else A) for A in (model.U_, model.V_))
    user = int(ratings.user_ids[0]) if args.user is None else args.user
    row = int(np.searchsorted(ratings.user_ids, user))
    if row >= len(ratings.user_ids) or ratings.user_ids[row] != user:
        raise SystemExit(f"user {user} has no ratings in {args.ratings}")
    scores = model.mean_ + U[row] @ V.T
    scores[train[row].indices] = -np.inf  # what the user rated already
    best = np.argsort(-scores, kind="stable")[: args.top]
    recs = [{"item": int(ratings.item_ids[j]), "score": float(scores[j])} for j in best]
    print(f"test RMSE {model.history_[-1]['test_rmse']:.4f} after {args.iters} steps; "
          f"for user {user}:")
    for r in recs:
        print(f"  item {r['item']}: predicted {r['score']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"history": model.history_, "user": user, "recommendations": recs}, indent=1))


if __name__ == "__main__":  # cluster workers start with spawn: nothing runs on import
    main()
