"""``mgpu bench spgemm``: mgpu's SpGEMM against cuSPARSE and torch (GPU) or scipy (CPU)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from mgpu.cli import _options as opt
from mgpu.cli import _plots
from mgpu.cli._errors import Command
from mgpu.cli._inputs import load_matrix
from mgpu.cli._output import plotted, write_json


@click.command("spgemm", cls=Command)
@click.argument("inputs", nargs=-1, type=click.Path(exists=True))
@opt.powerlaw_specs
@click.option("--form", type=click.Choice(["auto", "AA", "AAt"]), default="auto",
              show_default=True,
              help="The product of each input A: AA (A·A, square inputs only), AAt (A·Aᵀ), or "
              "auto: A·A of a square Matrix Market file (.mtx, .mtx.gz), A·Aᵀ of the rest "
              "(graphs, corpora, power-law matrices, any matrix that is not square). Each "
              "row says which it took.")
@opt.device(("auto", "cpu", "gpu"), "auto", "Where to run (auto: the GPU when one is visible).")
@opt.dtype("The operands' values.")
@opt.repeats(5, "Timed calls of each method (median); on the GPU in rounds, one call of each "
             "a round.")
@opt.json_out()
@opt.plot("GFLOP/s of each method per input (log scale)")
def bench_spgemm_cmd(inputs: tuple[str, ...], powerlaw: list[Any], form: str, device: str,
                     dtype: str, repeats: int, json_path: str | None,
                     plot: str | None) -> None:
    """SpGEMM (A·A or A·Aᵀ of each input) of mgpu against cuSPARSE through cupyx and torch
    (GPU) or scipy (CPU), on real and power-law matrices, in one run.

    Every peer is tried once first: one that raises is recorded as failed with its error,
    one whose result differs from mgpu's as a wrong result, and neither stops the run.
    Reports the intermediate products, nnz(C), ms and GFLOP/s (2 per product) of each
    method, the ratio peer ms / mgpu ms, mgpu's largest relative error against a float64
    scipy product (up to 2e8 products) and, on the GPU, the peak device memory of each
    call.
    """
    from mgpu.bench import spgemm as b
    from mgpu.bench.spmv import synthetic_matrices

    if not (inputs or powerlaw):
        raise click.UsageError("give matrix files (INPUTS) and/or --powerlaw ROWSxCOLS:NNZ")
    mats = [(Path(path).name, load_matrix(path).tocsr()) for path in inputs]
    mats += synthetic_matrices(powerlaw)
    rows = b.bench_spgemm(mats, repeats, form=form, device=device, dtype=dtype,
                          progress=click.echo)
    click.echo(b.markdown(rows))
    write_json(json_path, {"rows": rows, "summary": b.summarize(rows)})
    if plot is not None:
        _plots.spgemm(rows, plot)
    plotted(plot)
