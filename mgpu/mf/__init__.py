"""Matrix factorisation by SGD: the block kernel, the sequential reference, and the blocked
CPU, GPU and HSGD* modes over the block scheduler (one table of them: :data:`MODES`)."""
from __future__ import annotations

from mgpu.mf.model import MatrixFactorization
from mgpu.mf.modes import MODES, ModeSpec, check_mode, modes_help, parse_modes
from mgpu.mf.sgd import rmse, sgd_block, split_ratings

__all__ = ["MODES", "MatrixFactorization", "ModeSpec", "check_mode", "modes_help", "parse_modes",
           "rmse", "sgd_block", "split_ratings"]
