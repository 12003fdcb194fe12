"""Matrix factorisation by SGD: the block kernel, the sequential reference and the blocked
CPU mode over the block scheduler (the HSGD* GPU modes follow)."""
from __future__ import annotations

from mgpu.mf.model import MODES, MatrixFactorization
from mgpu.mf.sgd import rmse, sgd_block, split_ratings

__all__ = ["MODES", "MatrixFactorization", "rmse", "sgd_block", "split_ratings"]
