"""The modes of :class:`mgpu.mf.MatrixFactorization`, one table.

Each mode is a :class:`ModeSpec`: where it runs, which cost model splits the ratings,
whether slots steal and whether rows are handed over between epochs. The fit reads these
fields, never the mode's name; the parameter check, the ``--modes`` help of the command
line and its error are generated from :data:`MODES`.

>>> MODES["hsgd-static"].stealing, MODES["hsgd-linear"].cost
(False, 'linear')
>>> parse_modes("cpu, hsgd*")
['cpu', 'hsgd*']
"""
from __future__ import annotations

from dataclasses import dataclass

from mgpu.ops.validation import check_option

__all__ = ["COST_MODELS", "MODES", "ModeSpec", "check_mode", "modes_help", "parse_modes"]

COST_MODELS = ("none", "hsgd*", "linear")


@dataclass(frozen=True)
class ModeSpec:
    """One mode of matrix factorisation.

    Attributes
    ----------
    name : str
    gpu : bool
        Runs blocks on the cluster's GPU workers, one slot per GPU.
    cpu : bool
        Runs on CPU threads: in this process (not ``cluster``), on every thread of every
        worker (without ``gpu``), or on the threads of the CPU workers beside the GPUs.
    cost : {'none', 'hsgd*', 'linear'}
        The cost model that gives the GPUs their share of the ratings
        (:meth:`mgpu.mf.calibration.Calibration.curves`'s models); 'none': a uniform grid.
    stealing : bool
        A slot that runs dry steals a free block (else every slot runs its own blocks, in
        a fixed order).
    replan : bool
        Rows of blocks are handed between the GPUs and the CPU slots after each epoch, by
        the rates it measured (``mgpu.mf.replan``).
    help : str
        One line for people.
    cluster : bool, default=True
        Runs blocks on a cluster (False: one sequential pass in this process).
    """

    name: str
    gpu: bool
    cpu: bool
    cost: str
    stealing: bool
    replan: bool
    help: str
    cluster: bool = True

    def __post_init__(self) -> None:
        if self.cost not in COST_MODELS:
            raise ValueError(f"The 'cost' of mode {self.name!r} must be one of {COST_MODELS}. "
                             f"Got {self.cost!r} instead.")


MODES: dict[str, ModeSpec] = {m.name: m for m in (
    ModeSpec("sequential", gpu=False, cpu=True, cost="none", stealing=False, replan=False,
             help="one pass over the shuffled ratings an epoch, in this process (the "
                  "quality reference)", cluster=False),
    ModeSpec("cpu", gpu=False, cpu=True, cost="none", stealing=True, replan=False,
             help="FPSGD blocks on every thread of the cluster's workers"),
    ModeSpec("gpu", gpu=True, cpu=False, cost="none", stealing=True, replan=False,
             help="the same grid on the GPU workers only, one slot per GPU"),
    ModeSpec("hsgd", gpu=True, cpu=True, cost="none", stealing=True, replan=False,
             help="GPUs and CPU threads on a uniform grid, with work stealing"),
    ModeSpec("hsgd-linear", gpu=True, cpu=True, cost="linear", stealing=True, replan=False,
             help="hsgd* with the GPUs' share from Qilin's linear model"),
    ModeSpec("hsgd-static", gpu=True, cpu=True, cost="hsgd*", stealing=False, replan=True,
             help="hsgd* without stealing: every slot runs its own blocks"),
    ModeSpec("hsgd*", gpu=True, cpu=True, cost="hsgd*", stealing=True, replan=True,
             help="the GPUs' share from the calibrated cost model, HSGD*'s division, "
                  "stealing, rows handed over between epochs"),
)}

# The names by what they need, for callers that filter a list of names.
GPU_MODES = tuple(n for n, m in MODES.items() if m.gpu)
MIXED_MODES = tuple(n for n, m in MODES.items() if m.gpu and m.cpu)
COST_MODES = tuple(n for n, m in MODES.items() if m.cost != "none")


def check_mode(mode: object, func: str = "MatrixFactorization") -> ModeSpec:
    """The spec of a mode, or the parameter error that names every mode.

    Parameters
    ----------
    mode : str
    func : str, default='MatrixFactorization'
        What the error names as taking the 'mode' parameter.

    Returns
    -------
    ModeSpec

    Raises
    ------
    ValueError
        ``mode`` is not a name in :data:`MODES`.

    Examples
    --------
    >>> check_mode("hsgd*").cost
    'hsgd*'
    >>> check_mode("als")
    Traceback (most recent call last):
    ...
    ValueError: The 'mode' parameter of MatrixFactorization must be a str among {'cpu', \
'gpu', 'hsgd', 'hsgd*', 'hsgd-linear', 'hsgd-static', 'sequential'}. Got 'als' instead.
    """
    check_option("mode", func, mode, MODES)
    return MODES[mode]  # type: ignore[index]


def modes_help(sep: str = "; ") -> str:
    """Every mode's name and its line of help, in the table's order.

    Examples
    --------
    >>> modes_help().split("; ")[1]
    "cpu: FPSGD blocks on every thread of the cluster's workers"
    """
    return sep.join(f"{m.name}: {m.help}" for m in MODES.values())


def parse_modes(text: str) -> list[str]:
    """Comma-separated mode names (the command line's ``--modes``), checked.

    Returns
    -------
    list of str
        The names, stripped, in the order given.

    Raises
    ------
    ValueError
        No name given, or one not in :data:`MODES`; the message names them all.
    """
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names or any(m not in MODES for m in names):
        raise ValueError(f"modes must be among {', '.join(MODES)}; got {text!r}")
    return names
