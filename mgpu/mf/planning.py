"""HSGD*'s planning maths on its division: pure functions, no Dask, no GPU.

Before a fit: what each side of the division costs (:func:`side_costs`), an epoch's
predicted seconds (:func:`epoch_time`) and the plan, how many CPU slots and which share α
of the ratings for the GPUs (:func:`plan`), from the cost model's functions
(:meth:`mgpu.mf.calibration.Calibration.predictor`, or :func:`alone_block_time` for the
GPUs alone as measured). After each epoch: each kind of slot's busy seconds, ratings and
predicted seconds read off the block scheduler's events (:func:`side_times`), where its
calls spent their time (:func:`call_times`), and the share at which the measured rates
balance the two sides (:func:`measured_rates`, :func:`measured_alpha`), by which rows are
handed over between epochs (:func:`mgpu.mf.division.move_rows`).

A cost function here is ``f(n, per_task=1, load=1.0)``: seconds of a block of ``n``
ratings on a slot, with its share of its call's overhead when ``per_task`` blocks run in
one call; ``load`` is the share of the CPU slots at work beside a GPU.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mgpu.mf.division import columns
from mgpu.sched.cost import split

__all__ = ["Ownership", "alone_block_time", "call_times", "epoch_time", "gpu_batch",
           "gpu_share", "measured_alpha", "measured_rates", "plan", "side_costs", "side_times"]

Predict = dict[str, Callable[..., float]]


@dataclasses.dataclass(frozen=True)
class Ownership:
    """A fit's blocks (each with its owner, an index into ``slots``) and slots.

    Attributes
    ----------
    blocks : tuple of mgpu.sched.Block
    slots : tuple of mgpu.sched.Slot
    """

    blocks: tuple[Any, ...]
    slots: tuple[Any, ...]


def gpu_batch(n_g: int, n_c: int) -> int:
    """Blocks a GPU runs in one call under HSGD*'s division: its sub-rows of one column.

    Parameters
    ----------
    n_g, n_c : int
        GPU slots and CPU slots.

    Returns
    -------
    int
        ⌈(n_g + n_c) / n_g⌉, or 1 without GPUs.

    Examples
    --------
    >>> gpu_batch(1, 12), gpu_batch(2, 3), gpu_batch(0, 4)
    (13, 3, 1)
    """
    return -(-(n_g + n_c) // n_g) if n_g else 1


def side_costs(predict: Predict, n_g: int, n_c: int, load: float = 1.0
               ) -> tuple[Callable[[float], float], Callable[[float], float]]:
    """Predicted seconds of each side of HSGD*'s division for the ratings it is given,
    summed over its slots.

    A GPU runs ⌈(n_g+n_c)/n_g⌉ sub-rows × (n_c+2n_g+1) columns of blocks, its sub-rows of a
    column in one call; a CPU slot (n_c+n_g)/n_c rows × as many columns, a block a call.
    Every block costs the predicted time of its share of the ratings plus its share of its
    call's overhead (a GPU's at ``load``).

    Parameters
    ----------
    predict : dict
        ``"gpu"`` and ``"cpu"``: cost functions (see the module's docstring).
    n_g, n_c : int
        GPU slots and CPU slots.
    load : float, default=1.0
        The share of the CPU slots at work beside a GPU.

    Returns
    -------
    gpu_side, cpu_side : callable
        Seconds of all the GPU slots (all the CPU slots) for a number of ratings; the CPU
        side is 0 without CPU slots.
    """
    cols = columns(n_g, n_c)
    sub = gpu_batch(n_g, n_c)
    per_gpu = sub * cols
    per_cpu = (n_c + n_g) * cols / n_c if n_c else 0.0

    def gpu_side(n: float) -> float:
        return n_g * per_gpu * predict["gpu"](n / (n_g * per_gpu), sub, load=load)

    def cpu_side(n: float) -> float:
        return n_c * per_cpu * predict["cpu"](n / (n_c * per_cpu)) if n_c else 0.0

    return gpu_side, cpu_side


def epoch_time(n_ratings: int, predict: Predict, n_g: int, n_c: int, alpha: float,
               load: float = 1.0) -> float:
    """Predicted seconds of an epoch of HSGD*'s division: its slower side's slots.

    Parameters
    ----------
    n_ratings : int
    predict : dict
        ``"gpu"`` and ``"cpu"`` cost functions.
    n_g, n_c : int
        GPU slots and CPU slots.
    alpha : float
        The GPUs' share of the ratings.
    load : float, default=1.0
        The share of the CPU slots at work beside a GPU.

    Returns
    -------
    float

    Examples
    --------
    >>> predict = {"gpu": lambda n, per_task=1, load=1.0: n / 3e6,
    ...            "cpu": lambda n, per_task=1, load=1.0: n / 1e6}
    >>> round(epoch_time(7_000_000, predict, 1, 4, 3 / 7), 6)
    1.0
    """
    gpu_side, cpu_side = side_costs(predict, n_g, n_c, load)
    t = gpu_side(alpha * n_ratings) / n_g
    return max(t, cpu_side((1 - alpha) * n_ratings) / n_c) if n_c else t


def plan(n_ratings: int, predict: Predict, n_g: int, n_c: int, alone: float | None = None
         ) -> tuple[int, float]:
    """How many of the CPU slots to use, and the GPUs' share α, for the shortest predicted
    epoch.

    For a given number of CPU slots, α is the thesis's argmin |T_g(α)/n_g − T_c(1−α)/n_c|
    (:func:`mgpu.sched.cost.split`) on the division's blocks (:func:`side_costs`). Every
    call pays a round trip, and the division has more blocks the more slots it serves, so
    on small data fewer CPU slots (down to none) can finish an epoch sooner: the number is
    chosen too, which the thesis, on data far larger than a block's overhead, fixes.

    Parameters
    ----------
    n_ratings : int
    predict : dict
        ``"gpu"`` and ``"cpu"`` cost functions; a GPU's overhead is taken at the load of
        each option's CPU slots.
    n_g, n_c : int
        GPU slots and the CPU slots there are.
    alone : float, optional
        Seconds of an epoch of the GPUs alone, measured on one of their blocks, for that
        option instead of the curves.

    Returns
    -------
    used : int
        CPU slots to use (0: the GPUs alone).
    alpha : float
        The GPUs' share of the ratings (1.0 for the GPUs alone).

    Examples
    --------
    >>> predict = {"gpu": lambda n, per_task=1, load=1.0: n / 3e6,
    ...            "cpu": lambda n, per_task=1, load=1.0: n / 1e6}
    >>> used, alpha = plan(7_000_000, predict, 1, 4)
    >>> used, round(alpha, 4)
    (4, 0.4286)
    """
    best = (math.inf, 0, 1.0)
    for c in range(n_c + 1):
        load = c / n_c if n_c else 0.0
        alpha = split(float(n_ratings), *side_costs(predict, n_g, c, load), n_g, c) if c \
            else 1.0
        t = epoch_time(n_ratings, predict, n_g, c, alpha, load) if c or alone is None \
            else alone
        if t < best[0]:
            best = (t, c, alpha)
    return best[1], best[2]


def alone_block_time(alone: dict[str, float], n: float, per_task: int = 1,
                     load: float = 1.0) -> float:
    """A block's predicted seconds on a GPU alone, from a measurement of the GPUs alone.

    A cost function (the signature of
    :meth:`mgpu.mf.calibration.Calibration.predictor`'s; ``load`` is not used).

    Parameters
    ----------
    alone : dict
        ``per_rating_s``, ``copy_s`` and ``overhead_s``, as
        :class:`mgpu.mf.MatrixFactorization` measures them (``gpus_alone_``).
    n : float
        The block's ratings.
    per_task : int, default=1
        Blocks that share one call's copies and overhead.
    load : float, default=1.0

    Returns
    -------
    float
        0 for an empty block.

    Examples
    --------
    >>> got = {"per_rating_s": 1e-7, "copy_s": 0.002, "overhead_s": 0.004}
    >>> round(alone_block_time(got, 1e6, 2), 6), alone_block_time(got, 0)
    (0.103, 0.0)
    """
    return 0.0 if n <= 0 else (alone["per_rating_s"] * n
                               + (alone["copy_s"] + alone["overhead_s"]) / per_task)


def side_times(events: Sequence[Any], kinds: dict[str, str], sizes: dict[int, float],
               predict: Predict) -> dict[str, float]:
    """Per kind of slot in one epoch: busy seconds, ratings updated and predicted seconds.

    A slot is busy from a call's submission to its end, a call queued behind another of
    the same slot counted from the end of that one; busy seconds are summed over the
    slots. The prediction counts each block's run and its call's overhead once, shared by
    the blocks the call ran (a GPU's sub-rows of a column; a block stolen from another slot
    runs alone in its call and pays the whole overhead).

    A steal from another worker is priced as any call: the calibration's overhead already
    holds a segment that crosses between workers in every call (:mod:`mgpu.mf.calibration`),
    so adding the block scheduler's guess at the move (``mf.steal-bandwidth``, both
    segments both ways) would count that cost twice and price the GPU side above its
    measured time.

    Parameters
    ----------
    events : sequence of mgpu.sched.Event
        The block scheduler's events of the epoch.
    kinds : dict
        Slot name -> ``"gpu"`` or ``"cpu"``.
    sizes : dict
        Block id -> its ratings.
    predict : dict
        Cost functions by kind; a kind without one gets no predicted seconds.

    Returns
    -------
    dict
        ``{kind}_busy_s``, ``{kind}_ratings`` and, where predicted, ``{kind}_predicted_s``.
    """
    spans: dict[int, list[float]] = {}  # task -> [start, end]
    out: dict[str, float] = {}
    for kind in sorted(set(kinds.values())):
        out[f"{kind}_busy_s"] = 0.0
        out[f"{kind}_ratings"] = 0.0
        if kind in predict:
            out[f"{kind}_predicted_s"] = 0.0
    slot_of: dict[int, str] = {}
    ran: dict[int, list[int]] = {}  # task -> its blocks that finished
    for ev in events:
        if ev.kind in ("assign", "steal"):
            spans.setdefault(ev.task, [ev.t, ev.t])
            slot_of[ev.task] = ev.slot
        elif ev.kind == "finish":
            if ev.task in spans:
                spans[ev.task][1] = ev.t
            out[f"{kinds[ev.slot]}_ratings"] += sizes[ev.block]
            ran.setdefault(ev.task, []).append(ev.block)
            slot_of.setdefault(ev.task, ev.slot)
    for task, got in ran.items():
        slot = slot_of[task]
        kind = kinds[slot]
        if kind in predict:
            out[f"{kind}_predicted_s"] += sum(predict[kind](sizes[b], len(got)) for b in got)
    by_slot: dict[str, list[list[float]]] = {}
    for task, span in spans.items():
        by_slot.setdefault(slot_of[task], []).append(span)
    for slot, got in by_slot.items():
        end = -np.inf
        for a, b in sorted(got):  # the union of the slot's spans
            out[f"{kinds[slot]}_busy_s"] += max(0.0, b - max(a, end))
            end = max(end, b)
    return out


def call_times(calls: dict[str, list[dict[str, float]]], owned: Ownership
               ) -> dict[str, float]:
    """Per kind of slot in one epoch: its calls and the seconds they spent on their hosts.

    Parameters
    ----------
    calls : dict
        Worker address -> its host's calls' times
        (:meth:`mgpu.mf.hosts.BlockHost.call_times`).
    owned : Ownership
        The fit's slots (their workers and kinds).

    Returns
    -------
    dict
        ``{kind}_calls`` and ``{kind}_call_{part}_s``, summed over the kind's calls.
    """
    kinds = {s.worker: s.kind for s in owned.slots}
    out: dict[str, float] = {}
    for w, got in calls.items():
        kind = kinds[w]
        out[f"{kind}_calls"] = out.get(f"{kind}_calls", 0) + len(got)
        for t in got:
            for part, sec in t.items():
                out[f"{kind}_call_{part}_s"] = out.get(f"{kind}_call_{part}_s", 0.0) + sec
    return out


def gpu_share(owned: Ownership) -> float:
    """The share of the ratings in blocks that GPU slots own.

    Parameters
    ----------
    owned : Ownership

    Returns
    -------
    float
        0.0 where the blocks hold no ratings.

    Examples
    --------
    >>> from mgpu.sched import Block, Slot
    >>> gpu_share(Ownership((Block(0, 0, 0, 3.0, 0), Block(1, 0, 1, 1.0, 1)),
    ...                     (Slot("g#gpu", "g", "gpu"), Slot("c#0", "c", "cpu"))))
    0.75
    """
    total = sum(b.size for b in owned.blocks)
    gpu = sum(b.size for b in owned.blocks if owned.slots[b.owner].kind == "gpu")
    return float(gpu / total) if total else 0.0


def measured_rates(times: dict[str, float]) -> tuple[float, float] | None:
    """Ratings per busy second of one GPU slot and of one CPU slot in an epoch.

    Parameters
    ----------
    times : dict
        An epoch's side times (:func:`side_times`): ``gpu_ratings``, ``gpu_busy_s``,
        ``cpu_ratings``, ``cpu_busy_s``.

    Returns
    -------
    (float, float) or None
        The GPU's and the CPU's rate; None without both, or where one is not positive and
        finite.
    """
    try:
        gpu = times["gpu_ratings"] / times["gpu_busy_s"]
        cpu = times["cpu_ratings"] / times["cpu_busy_s"]
    except (KeyError, ZeroDivisionError):
        return None
    if not (np.isfinite(gpu) and np.isfinite(cpu) and gpu > 0 and cpu > 0):
        return None
    return float(gpu), float(cpu)


def measured_alpha(times: dict[str, float], n_g: int, n_c: int) -> float | None:
    """The GPUs' share α that balances the two sides at the rates an epoch measured.

    Parameters
    ----------
    times : dict
        An epoch's side times (:func:`side_times`).
    n_g, n_c : int
        GPU slots and CPU slots.

    Returns
    -------
    float or None
        None without both rates (:func:`measured_rates`).

    Examples
    --------
    >>> measured_alpha({"gpu_ratings": 600.0, "gpu_busy_s": 1.0,
    ...                 "cpu_ratings": 400.0, "cpu_busy_s": 4.0}, 1, 4)
    0.6
    """
    rates = measured_rates(times)
    if rates is None:
        return None
    return n_g * rates[0] / (n_g * rates[0] + n_c * rates[1])
