"""``mgpu bench sgd`` (the GPU SGD kernel's updates per second, per scheme) and ``mgpu bench
sgd-seeds`` (the gpu mode's MovieLens fit over several seeds)."""
from __future__ import annotations

from pathlib import Path

import click
import dask.config
import numpy as np

from mgpu.cli import _options as opt
from mgpu.cli._inputs import load_ratings
from mgpu.cli._output import write_json
from mgpu.backends.instances import WAVE_DEPTHS
from mgpu.mf.schedule import MAX_GROUPS


def _need_gpu(what: str) -> None:
    from mgpu.distributed import visible_gpus

    if visible_gpus() == 0:
        raise click.UsageError(what)


def _depths(text: str) -> tuple[int | None, ...]:
    """--depths as a tuple (None: the kernel's default), or BadParameter."""
    try:
        ring = tuple(None if d.strip() == "auto" else int(d) for d in text.split(","))
    except ValueError:
        ring = ()
    if not ring or any(d is not None and d not in WAVE_DEPTHS for d in ring):
        raise click.BadParameter(f"expected some of {', '.join(map(str, WAVE_DEPTHS))} or "
                                 f"'auto', comma-separated, got {text!r}", param_hint="--depths")
    return ring


@click.command("sgd")
@click.option("--shape", default="480189x17770", show_default=True, type=opt.Shape(),
              metavar="USERSxITEMS", help="Users × items of the synthetic ratings (default: "
              "Netflix's).")
@click.option("--ratings", "n_ratings", default=100_000_000, show_default=True,
              type=click.IntRange(min=1))
@opt.ks("32,128,256", "Comma-separated numbers of factors.")
@click.option("--conflicts", default="none,1,4", show_default=True,
              help="Comma-separated bounds of the lock-free (hogwild) scheme on the updates in "
              "flight on the busiest row ('none': every warp the GPU holds; "
              "mgpu.mf.gpu-conflicts is what MF uses with gpu-scheme hogwild; '' for none of "
              "these rows).")
@click.option("--wavefront/--no-wavefront", default=True, show_default=True,
              help="Time the wavefront scheme too (mgpu.mf.gpu-scheme's default).")
@click.option("--groups", default="auto", show_default=True,
              help="Comma-separated grid sizes G of the wavefront scheme ('auto': the one the "
              "data's shape gives, as a fit chooses it).")
@click.option("--depths", default="auto", show_default=True,
              help="Comma-separated ratings in flight per warp of the wavefront kernel, of "
              f"{', '.join(map(str, WAVE_DEPTHS))} ('auto': the kernel's default, 8, or the "
              "deepest a k has below it; a depth a k lacks is skipped).")
@opt.dtype()
@opt.repeats(5)
@opt.json_out()
def bench_sgd(shape: tuple[int, int], n_ratings: int, ks: tuple[int, ...], conflicts: str,
              wavefront: bool, groups: str, depths: str, dtype: str, repeats: int,
              json_path: str | None) -> None:
    """Updates/s of the GPU SGD block kernel of matrix factorisation, the wavefront scheme
    beside the lock-free one's bounds (one pass = every rating once, power-law user and
    item degrees, drawn on the GPU)."""
    from mgpu.bench import sgd as b

    if max(ks) > 256:
        raise click.BadParameter("every k must be <= 256", param_hint="--k")
    try:
        bounds = tuple(None if c.strip() == "none" else float(c)
                       for c in conflicts.split(",") if c.strip())
    except ValueError:
        raise click.BadParameter(f"expected numbers or 'none', got {conflicts!r}",
                                 param_hint="--conflicts") from None
    try:
        sizes = tuple(None if g.strip() == "auto" else int(g) for g in groups.split(","))
    except ValueError:
        raise click.BadParameter(f"expected integers or 'auto', got {groups!r}",
                                 param_hint="--groups") from None
    if any(g is not None and not 1 <= g <= MAX_GROUPS for g in sizes):
        raise click.BadParameter(f"every G must be in [1, {MAX_GROUPS}], got {groups!r}",
                                 param_hint="--groups")
    ring = _depths(depths)
    if not bounds and not wavefront:
        raise click.UsageError("nothing to time: give --conflicts or --wavefront")
    _need_gpu("bench sgd times the GPU kernel; no GPU is visible.")
    rows = b.bench_gpu(*shape, n_ratings, ks, conflicts=bounds, wavefront=wavefront,
                       groups=sizes, depths=ring, dtype=np.dtype(dtype), repeats=repeats)
    click.echo(b.markdown(rows))
    write_json(json_path, rows)


@click.command("sgd-seeds")
@opt.ratings
@click.option("--seeds", default=10, show_default=True, type=click.IntRange(min=1),
              help="Fits, with seeds 0, 1, …")
@opt.k(128)
@click.option("--epochs", default=80, show_default=True, type=click.IntRange(min=1))
@click.option("--scheme", type=click.Choice(["wavefront", "hogwild"]), default=None,
              help="mgpu.mf.gpu-scheme for these fits (default: as configured).")
@opt.json_out("every seed's row")
def bench_sgd_seeds(ratings: str, seeds: int, k: int, epochs: int, scheme: str | None,
                    json_path: str | None) -> None:
    """The gpu mode's MovieLens fit (lr 0.005, reg 0.05; 90/10 split drawn with seed 0) once
    per seed on a one-GPU embedded cluster: epochs to test RMSE 0.98 and 0.91, the final
    RMSE, and in how many seeds each target was reached."""
    from mgpu.bench import sgd as b
    from mgpu.distributed import connect
    from mgpu.mf import split_ratings

    _need_gpu("bench sgd-seeds fits on a GPU; no GPU is visible.")
    train, test = split_ratings(load_ratings(ratings).matrix, 0.1, seed=0)
    targets = (0.98, 0.91)
    click.echo(f"{Path(ratings).name}: {train.nnz:,} training, {test.nnz:,} test ratings; "
               f"k={k}, gpu mode, scheme {scheme or dask.config.get('mgpu.mf.gpu-scheme')}")

    def said(row: dict) -> None:
        click.echo(f"seed {row['seed']}: {row['epochs']} epochs, test RMSE "
                   f"{row['final_rmse']:.4f}, to 0.98 in {row['epochs_to_0.98']}")

    with dask.config.set({"mgpu.mf.gpu-scheme": scheme} if scheme else {}):
        with connect(gpus=True, n_workers=1):
            rows = b.movielens_seeds(train, test, tuple(range(seeds)), k=k, epochs=epochs,
                                     targets=targets, progress=said)
    click.echo(b.seeds_markdown(rows, targets))
    write_json(json_path, rows)
