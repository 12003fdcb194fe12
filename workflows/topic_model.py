"""Topics of a bag-of-words corpus with the GaP topic model (mgpu.models.GaP).

Shows: an estimator fitted on an embedded cluster, the documents cut into row tiles of
equal nonzeros that stay on the workers, the fit one SPMD job (each worker runs every
iteration on its tiles; only the sums behind the topics' update are all-reduced between
them), with the log-likelihood per token after every iteration as it arrives (the time is
the first worker's own time of the iteration) and each topic's heaviest words.

Run (the AP corpus of ../shared/data, two CPU workers):

    python workflows/topic_model.py ../shared/data/bow/ap.dat.gz \
        --vocab ../shared/data/bow/ap_vocab.txt.gz --topics 20 --iters 50 --workers 2 --cpu

``--workers 0`` fits in this process on one device (a GPU when ``--gpu``); ``--out FILE``
writes the history, the top words and the tiles' placement as JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import scipy.sparse as sp

import mgpu
from mgpu import io
from mgpu.models import GaP


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", help="bag-of-words file (LDA-C or UCI docword, plain or gzip)")
    ap.add_argument("--vocab", help="one word per line (plain or gzip)")
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=8, help="words listed per topic")
    ap.add_argument("--workers", type=int, default=None,
                    help="embedded cluster size (default: mgpu.connect's); 0: this process")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--cpu", action="store_true", help="CPU workers only")
    where.add_argument("--gpu", action="store_true", help="GPU workers (or this GPU)")
    ap.add_argument("--out", help="write the results to this JSON file")
    args = ap.parse_args()

    S = sp.csr_matrix(io.load(args.corpus))
    vocab = None
    if args.vocab:
        opener = gzip.open if args.vocab.endswith(".gz") else open
        with opener(args.vocab, "rt") as f:
            vocab = [w.strip() for w in f if w.strip()]
    print(f"{Path(args.corpus).name}: {S.shape[0]:,} documents x {S.shape[1]:,} words, "
          f"{S.nnz:,} nonzero counts")

    def report(rec: dict) -> None:
        print(f"iteration {rec['iteration']:3d}: log-likelihood per token "
              f"{rec['loglik_per_token']:.6f} ({rec['step_s'] * 1e3:.1f} ms)")

    model = GaP(args.topics, iters=args.iters, seed=args.seed)
    if args.workers == 0:
        data = S
        if args.gpu:
            import cupyx.scipy.sparse as csp

            data = csp.csr_matrix(S)
        model.fit(data, progress=report)
    else:
        gpus = True if args.gpu else False if args.cpu else None
        with mgpu.connect(gpus=gpus, n_workers=args.workers) as client:
            model.fit(S, client=client, progress=report)
        for i, t in enumerate(model.tiles_):
            print(f"tile {i}: {t['rows']:,} documents, {t['nnz']:,} nonzeros on {t['worker']}")
    words = model.top_words(vocab, args.top)
    for t, ws in enumerate(words):
        print(f"topic {t:2d}: {' '.join(ws)}")
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"history": model.history_, "top_words": words, "tiles": model.tiles_}, indent=1))


if __name__ == "__main__":  # cluster workers start with spawn: nothing runs on import
    main()
