"""Matrix factorisation in several modes from one start: ``mgpu run mf`` and ``mgpu bench mf``.

Every mode trains on the same split from the same initial factors (the same seed), stops at
the target test RMSE or after the epochs, and is summarised: epochs and training seconds to
the target (setup and the RMSE evaluations excluded; the setup is its own column),
the GPUs' share of the updates, steals, and how well the cost model predicted each side's
busy time (cost-model modes).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import scipy.sparse as sp


def train_modes(train: sp.spmatrix, test: sp.spmatrix, modes: list[str], *, k: int,
                lr: float, reg: float, epochs: int, target_rmse: float | None, seed: int,
                callback: Callable[[str], Callable[[dict[str, Any]], None]] | None = None,
                done: Callable[[str, Any], None] | None = None,
                cluster: Callable[[str], AbstractContextManager[Any]] | None = None
                ) -> dict[str, Any]:
    """Fit ``MatrixFactorization`` in each mode (on the current cluster where the mode needs
    one, or inside ``cluster(mode)``, which may start one for it); ``callback(mode)`` gives
    each fit's per-epoch callback (a progress bar), and ``done(mode, model)`` hears of each
    mode as it finishes."""
    from mgpu.mf import MatrixFactorization

    out = {}
    for mode in modes:
        mf = MatrixFactorization(k, lr=lr, reg=reg, epochs=epochs, mode=mode, seed=seed,
                                 target_rmse=target_rmse)
        with cluster(mode) if cluster is not None else contextlib.nullcontext():
            mf.fit(train, test, callback=callback(mode) if callback else None)
        out[mode] = mf
        if done is not None:
            done(mode, mf)
    return out


def summary(mf: Any, target: float | None) -> dict[str, Any]:
    """One mode's row: time to the target, speed per epoch, the GPU share, steals and the
    cost model's predicted against measured busy seconds per side (medians over the epochs
    after the first, which also compiles kernels), and in the cost-model modes the
    calibration they planned from."""
    h = mf.history_
    reached = next((e for e in h if target and e["test_rmse"] <= target), None)
    later = h[1:] or h
    row: dict[str, Any] = {
        "mode": mf.mode, "epochs": len(h), "final_rmse": h[-1]["test_rmse"],
        "best_rmse": min(e["test_rmse"] for e in h),
        "epochs_to_target": reached["epoch"] if reached else None,
        "seconds_to_target": reached["seconds"] if reached else None,
    }
    per_epoch = np.diff([0.0] + [e["seconds"] for e in h])
    row["seconds_per_epoch"] = float(np.median(per_epoch[1:] if len(h) > 1 else per_epoch))
    row["setup_s"] = float(getattr(mf, "setup_s_", 0.0))
    if "gpu_ratings" in h[-1]:
        total = [e.get("gpu_ratings", 0.0) + e.get("cpu_ratings", 0.0) for e in later]
        row["gpu_share"] = float(np.median([e["gpu_ratings"] / t for e, t in zip(later, total)
                                            if t]))
    events = getattr(mf, "schedule_events_", None)
    if events:
        row["steals_per_epoch"] = sum(ev.kind == "steal" for ev in events) / len(h)
    if getattr(mf, "calibration_", None) is not None:  # the curves the plan was made from
        row["calibration"] = mf.calibration_.to_json()
    if getattr(mf, "division_", None):
        row["alpha"] = mf.division_["alpha"]
        row["alpha_planned"] = mf.division_.get("alpha_planned")
        row["blocks"] = mf.division_["blocks"]
    for side in ("gpu", "cpu"):
        if f"{side}_predicted_s" in h[-1]:
            pred = [e[f"{side}_predicted_s"] for e in later]
            meas = [e[f"{side}_busy_s"] for e in later]
            row[f"{side}_predicted_s"] = float(np.median(pred))
            row[f"{side}_measured_s"] = float(np.median(meas))
            row[f"{side}_model_error"] = float(np.median(
                [abs(p - m) / m for p, m in zip(pred, meas) if m > 0] or [np.nan]))
        if f"{side}_calls" in h[-1]:
            row[f"{side}_call_ms"] = _call_ms(later, side)
    return row


CALL_PARTS = ("inputs", "queued", "run", "h2d", "kernel", "copy")


def _call_ms(epochs: list[dict[str, Any]], side: str) -> dict[str, float]:
    """A side's milliseconds per call, medians over the epochs: ``busy`` (the block
    scheduler's, send to end, :func:`mgpu.mf.planning.side_times`, per slot) and the parts
    spent on the call's host (:meth:`mgpu.mf.hosts.BlockHost.call_times`). For a slot
    that runs one call at a time (a CPU slot), what ``busy`` has beyond ``inputs + queued +
    run`` is the call's way to and from its host; a GPU's call queued behind the one it
    runs waits for its inputs while that one runs."""
    out: dict[str, float] = {}
    per = [e for e in epochs if e.get(f"{side}_calls")]
    if not per:
        return out
    out["calls"] = float(np.median([e[f"{side}_calls"] for e in per]))
    out["busy"] = float(np.median([1e3 * e[f"{side}_busy_s"] / e[f"{side}_calls"]
                                   for e in per]))
    for part in CALL_PARTS:
        if f"{side}_call_{part}_s" in per[0]:
            out[part] = float(np.median([1e3 * e[f"{side}_call_{part}_s"] / e[f"{side}_calls"]
                                         for e in per]))
    return out


def calls_markdown(rows: list[dict[str, Any]]) -> str:
    """Where a call's time went, per mode and side (:func:`_call_ms`), or "" where no row
    has block calls."""
    head = ("| mode | side | calls per epoch | busy ms per call | inputs | queued | run | "
            "of run: to device | kernel | host copies |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        for side in ("gpu", "cpu"):
            c = r.get(f"{side}_call_ms")
            if not c:
                continue
            cells = [f"{c[p]:.2f}" if p in c else "–" for p in CALL_PARTS]
            lines.append(f"| {r['mode']} | {side} | {c['calls']:.0f} | {c['busy']:.2f} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def markdown(rows: list[dict[str, Any]], target: float | None) -> str:
    def fmt(v: Any, spec: str = ".3f") -> str:
        return "–" if v is None or (isinstance(v, float) and not np.isfinite(v)) else \
            format(v, spec)

    def share(r: dict[str, Any]) -> str:
        """α, as planned → after rows changed hands where they did."""
        got, planned = r.get("alpha"), r.get("alpha_planned")
        if got is None or planned is None or abs(got - planned) < 5e-4:
            return fmt(got)
        return f"{planned:.3f} → {got:.3f}"

    head = ("| mode | epochs | epochs to target | s to target | s per epoch | setup s | "
            "final test RMSE | "
            "α (planned → last) | blocks | GPU share of updates | steals per epoch | "
            "GPU busy s: predicted / measured | CPU busy s: predicted / measured |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        sides = []
        for side in ("gpu", "cpu"):
            if f"{side}_predicted_s" in r:
                sides.append(f"{r[f'{side}_predicted_s']:.3f} / {r[f'{side}_measured_s']:.3f} "
                             f"({100 * r[f'{side}_model_error']:.0f}% off)")
            else:
                sides.append("–")
        lines.append(
            f"| {r['mode']} | {r['epochs']} | {fmt(r['epochs_to_target'], 'd')} | "
            f"{fmt(r['seconds_to_target'], '.2f')} | {r['seconds_per_epoch']:.3f} | "
            f"{fmt(r.get('setup_s'), '.2f')} | {r['final_rmse']:.4f} | {share(r)} | "
            f"{fmt(r.get('blocks'), 'd')} | "
            f"{fmt(r.get('gpu_share'))} | {fmt(r.get('steals_per_epoch'), '.1f')} | "
            f"{sides[0]} | {sides[1]} |")
    if target:
        lines.append(f"\ntarget test RMSE: {target}")
    return "\n".join(lines)
