"""What ``mgpu run mf`` and ``mgpu bench mf`` share: the training options, and training
every mode from one start with a progress bar each and a line as each mode finishes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from mgpu.cli import _options as opt
from mgpu.cli import _plots
from mgpu.cli._output import bar, block_placement, describe, plotted


def _modes_help() -> str:
    from mgpu.mf import MODES

    return f"Comma-separated modes of mgpu.MatrixFactorization ({', '.join(MODES)})."


mf_options = opt.stack(
    click.option("--modes", default="sequential,cpu", show_default=True, help=_modes_help()),
    opt.k(128),
    click.option("--lr", default=0.005, show_default=True,
                 type=click.FloatRange(min=0, min_open=True), help="Learning rate γ."),
    click.option("--reg", default=0.05, show_default=True, type=click.FloatRange(min=0),
                 help="Regularisation λ."),
    click.option("--epochs", default=80, show_default=True, type=click.IntRange(min=1)),
    click.option("--target-rmse", default=None, type=float,
                 help="Stop a mode once its test RMSE reaches this (default: 0.98 for a "
                 "ratings file, 1.2 × the noise for --synthetic; 0 runs every epoch)."),
    click.option("--test-fraction", default=0.1, show_default=True, type=float,
                 help="Share of the ratings held out at random for the test RMSE."),
    opt.seed,
    opt.address,
    opt.cpu_threads,
    opt.plot("test RMSE against time for every mode"),
    click.option("--one-cluster", is_flag=True, default=False,
                 help="Run every mode on one embedded cluster (default: a fresh one per mode, "
                 "so that no mode runs on what an earlier one left; with --address, always "
                 "the one given)."),
)
"""The training options shared by run mf and bench mf."""


def _reached(h: list[dict[str, Any]], target: float) -> str:
    hit = next((e for e in h if target and e["test_rmse"] <= target), None)
    if hit:
        return f"; reached {target} at epoch {hit['epoch']} after {hit['seconds']:.1f} s"
    return f"; did not reach {target}" if target else ""


def train(R: Any, label: str, *, modes: str, k: int, lr: float, reg: float, epochs: int,
          target: float, test_fraction: float, seed: int, address: str | None,
          cpu_threads: int | None, plot: str | None, one_cluster: bool) -> dict[str, Any]:
    """Train every mode with :func:`mgpu.bench.mf_modes.compare_modes`, report, plot."""
    from mgpu.bench.mf_modes import compare_modes

    bars: list[Any] = []

    def split(train: Any, test: Any) -> None:
        click.echo(f"{label}: {R.shape[0]:,} users x {R.shape[1]:,} items, {train.nnz:,} "
                   f"training and {test.nnz:,} test ratings; k={k}, lr={lr}, reg={reg}")

    def on_cluster(mode: str | None, client: Any) -> None:
        click.echo(f"cluster: {describe(client)}" if mode is None
                   else f"{mode}: on a fresh cluster, {describe(client)}")

    def progress(mode: str) -> Callable[[dict[str, Any]], None]:
        bars.append(bar(total=epochs, unit="epoch", desc=mode))

        def tick(entry: dict[str, Any], b: Any = bars[-1]) -> None:
            b.set_postfix(test_rmse=f"{entry['test_rmse']:.4f}")
            b.update(1)
        return tick

    def done(mode: str, mf: Any) -> None:
        bars[-1].close()
        h = mf.history_
        if getattr(mf, "schedule_events_", None):
            click.echo(f"{mode}: {block_placement(mf.schedule_events_)}")
        click.echo(f"{mode}: {len(h)} epochs in {h[-1]['seconds']:.1f} s, test RMSE "
                   f"{h[-1]['test_rmse']:.4f}" + _reached(h, target))

    try:
        mfs = compare_modes(R, modes, k=k, lr=lr, reg=reg, epochs=epochs, target_rmse=target,
                            test_fraction=test_fraction, seed=seed, address=address,
                            cpu_threads=cpu_threads, one_cluster=one_cluster, split=split,
                            on_cluster=on_cluster, callback=progress, done=done)
    except FloatingPointError as exc:  # diverged
        raise click.ClickException(str(exc)) from None
    finally:
        for b in bars:
            b.close()
    if plot is not None:
        _plots.rmse({m: mf.history_ for m, mf in mfs.items()}, target, f"{label}, k={k}", plot)
    plotted(plot)
    return mfs
