"""``mgpu calibrate``: HSGD*'s cost model measured on this cluster, and cached."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from mgpu.cli import _options as opt
from mgpu.cli import _plots
from mgpu.cli._errors import Command
from mgpu.cli._inputs import load_ratings
from mgpu.cli._output import plotted


def _show() -> None:
    from mgpu.mf.calibration import cache_path, cached_all

    entries = cached_all()
    if not entries:
        raise click.ClickException(f"no calibration cached yet ({cache_path()}); run "
                                   "mgpu calibrate")
    for cal in entries.values():
        click.echo(cal.describe() + "\n")


@click.command("calibrate", cls=Command)
@opt.optional_ratings
@opt.k(128)
@click.option("--max-ratings", default=4_000_000, show_default=True, type=click.IntRange(min=2),
              help="Ratings of the shuffled sample whose prefixes are timed.")
@opt.repeats(3, help="Timed calls of each block size.")
@opt.address
@click.option("--show", is_flag=True, help="Print the cached calibrations and measure nothing.")
@opt.plot("the measurements and both models' curves")
@click.option("--cpu-threads", default=1, show_default=True, type=click.IntRange(min=1),
              help="CPU blocks timed at once: the CPU slots the training runs will use "
                   "(mgpu bench mf --cpu-threads).")
def calibrate_cmd(ratings: str | None, k: int, max_ratings: int, repeats: int,
                  address: str | None, show: bool, plot: str | None, cpu_threads: int) -> None:
    """Calibrate HSGD*'s cost model on this cluster's CPU and GPU workers, and cache it.

    Times block calls on growing prefixes of a shuffled sample of RATINGS (default: planted
    ratings of Netflix's shape) on --cpu-threads CPU threads at once and on one GPU, fits the
    thesis's curves and Qilin's lines, and caches them (mgpu.mf.calibration-cache) for this
    GPU model, CPU model and thread count, k, GPU options and block size, where
    MatrixFactorization's cost-model modes find them. The sample is one column stratum of
    the division HSGD* makes of RATINGS on these slots, so a fit on these ratings (or a
    split of them) on the same slots finds it.
    """
    from mgpu.bench.calibrate import calibrate_on_cluster, netflix_sample
    from mgpu.mf.calibration import store

    if show:
        return _show()
    if ratings is not None:
        C, label = load_ratings(ratings).matrix.tocoo(), Path(ratings).name
    else:
        C, label = netflix_sample(max_ratings)

    def started(window: Any, cpu: str | None, gpu: str | None) -> None:
        click.echo(f"{label}: {C.nnz:,} ratings; timing blocks of {window.n_items:,} items, "
                   f"{window.per_user:.3g} ratings per user on CPU worker {cpu or '(none)'} "
                   f"and GPU worker {gpu or '(none)'}")

    cal = calibrate_on_cluster(C, k, address=address, max_ratings=max_ratings, repeats=repeats,
                               cpu_threads=cpu_threads, started=started)
    click.echo(cal.describe())
    click.echo(f"cached in {store(cal)}")
    if plot is not None:
        _plots.calibration(cal, plot)
    plotted(plot)
