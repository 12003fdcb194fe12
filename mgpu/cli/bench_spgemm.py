"""``mgpu bench spgemm``: mgpu's SpGEMM against cuSPARSE and torch (GPU) or scipy (CPU);
``mgpu bench spgemm-scaling``: the SpGEMM spread over 1, 2, 4, … workers against one device."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from mgpu.cli import _options as opt
from mgpu.cli import _plots
from mgpu.cli._errors import Command
from mgpu.cli._inputs import load_matrix
from mgpu.cli._output import plotted, write_json
from mgpu.cli.bench_comm import _GPUS, _check_gpu_workers


@click.command("spgemm", cls=Command)
@click.argument("inputs", nargs=-1, type=click.Path(exists=True))
@opt.powerlaw_specs
@opt.spgemm_form("each input A", "Each row says which it took.")
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


@click.command("spgemm-scaling", cls=Command)
@click.argument("input", required=False, type=click.Path(exists=True))
@opt.powerlaw_spec
@opt.spgemm_form("the input A", "The run says which it took.")
@opt.worker_counts()
@opt.tiles_per_worker
@opt.worker_kind
@opt.protocol
@opt.repeats(3, "Timed calls (median), after a warm-up call.")
@opt.json_out()
@opt.plot("speedup against workers")
def bench_spgemm_scaling_cmd(input: str | None, powerlaw: list[Any], form: str,
                             workers: tuple[int, ...], tiles_per_worker: int, device: str,
                             repeats: int, json_path: str | None, plot: str | None) -> None:
    """SpGEMM (A·A or A·Aᵀ of one input, float32) on one device and spread over 1, 2, 4, …
    workers, in one run.

    INPUT is a matrix file as bench spgemm takes, or give one --powerlaw matrix. Three
    cluster calls are timed: mgpu.spgemm(A, B, parts=N), which starts from A and B on this
    host (cutting A by work, sending the tiles and B, the products and the wait for the last
    tile), and mgpu.spgemm of A and B held on the workers (placed before the timing), SPMD,
    once gathered on every worker and once with B's tiles passed round the workers
    (mgpu.spgemm.held-operands: ring). Reports GFLOP/s (2 per intermediate
    product), the speedup against one device and against one worker, the work imbalance of
    the tiles and whether every worker count's C equals the one device's (each tile's nnz,
    and a few of its rows compared on the workers that hold them).
    """
    from mgpu.bench import spgemm_scaling as b
    from mgpu.bench.spgemm import FORMS
    from mgpu.bench.spmv import synthetic_matrices

    n_given = (input is not None) + len(powerlaw)
    if n_given != 1:
        got = f" (got {'INPUT and ' * (input is not None)}{len(powerlaw)} --powerlaw)"
        raise click.UsageError("give one matrix: INPUT or one --powerlaw ROWSxCOLS:NNZ"
                               + (got if n_given else ""))
    counts = _check_gpu_workers(workers, device)
    t0 = time.perf_counter()
    name, M = ((Path(input).name, load_matrix(input)) if input is not None
               else synthetic_matrices(powerlaw)[0])
    A, B, how = b.operands(M, form, name)
    label = f"{FORMS[how]} of {name}"
    click.echo(f"{label}: A {A.shape[0]:,}×{A.shape[1]:,} with {A.nnz:,} nonzeros, float32 "
               f"(ready in {time.perf_counter() - t0:.0f} s)")
    rows = b.bench_scaling(A, B, counts, tiles_per_worker=tiles_per_worker, repeats=repeats,
                           gpus=_GPUS[device], progress=click.echo)
    for r in rows:
        r.update(input=name, form=how)
    click.echo(b.scaling_markdown(rows, label))
    write_json(json_path, rows)
    if plot is not None:
        one = rows[0]["median_s"]
        _plots.scaling([dict(r, speedup=one / r["median_s"], series=r["call"])
                        for r in rows if isinstance(r["workers"], int)],
                       f"SpGEMM, {label}", plot, lambda r: f"{r['gflops']:.2f} GFLOP/s",
                       against="one device")
    plotted(plot)
