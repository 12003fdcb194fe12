"""Options shared by the ``mgpu`` commands, each declared once.

A command stacks the decorators it takes; an option whose help depends on the command (what a
``--plot`` draws, what a ``--json`` holds) is made by a function of that one word. Values are
checked and converted here, while click parses, so a command body gets a shape as a tuple, a
``--workers`` list as ints and an ``--out`` file as a checked :class:`~pathlib.Path`.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
import dask.config

from mgpu.distributed.protocol import PROTOCOLS

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def stack(*decorators: Decorator) -> Decorator:
    """One decorator applying ``decorators`` in the order they would be written above a
    function (the first is the outermost, so it comes first in ``--help``)."""
    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        for deco in reversed(decorators):
            f = deco(f)
        return f

    return wrap


# ------------------------------------------------------------------ value types


class Shape(click.ParamType):
    """``ROWSxCOLS`` (also ``,`` or ``×`` between, ``_`` within numbers) as two ints."""

    name = "ROWSxCOLS"

    def __init__(self, skippable: bool = False) -> None:
        self.skippable = skippable  # 'none' means no such matrix

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, int] | None:
        if isinstance(value, tuple):
            return value
        if self.skippable and value.strip().lower() == "none":
            return None
        try:
            return parse_shape(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def parse_shape(text: str) -> tuple[int, int]:
    """``"300000x100000"`` -> ``(300000, 100000)``; a ValueError naming the form otherwise, or
    the bound for a zero side."""
    m = re.fullmatch(r"\s*(\d[\d_]*)\s*[xX×,]\s*(\d[\d_]*)\s*", text)
    if not m:
        raise ValueError(f"expected ROWSxCOLS such as 300000x100000, got {text!r}")
    shape = int(m.group(1).replace("_", "")), int(m.group(2).replace("_", ""))
    if min(shape) < 1:
        raise ValueError(f"rows and columns must be >= 1, got {text!r}")
    return shape


def parse_ints(text: str, hint: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers (``1,2,4``), or a usage error naming it."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected positive integers such as 1,2,4, got {text!r}",
                                 param_hint=hint) from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"every value must be >= 1, got {text!r}", param_hint=hint)
    return values


def _ints(ctx: click.Context, param: click.Parameter, value: str | None
          ) -> tuple[int, ...] | None:
    return None if value is None else parse_ints(value, param.opts[0])


def _need_matplotlib(ctx: click.Context, param: click.Parameter, value: str | None
                     ) -> str | None:
    if value is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise click.ClickException("--plot needs matplotlib: pip install 'mgpu[plot]'") \
                from exc
        writable_parent(Path(value), "--plot")
    return value


def writable_parent(path: Path, hint: str) -> Path:
    """``path`` unchanged when the folder it goes in exists and may be written to; a usage
    error naming the option otherwise (checked while click parses: before any work, not after
    a whole run)."""
    parent = path.parent
    if not parent.is_dir():
        raise click.BadParameter(f"folder {parent} does not exist (create it first, or write "
                                 "somewhere else)", param_hint=hint)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise click.BadParameter(f"folder {parent} may not be written to", param_hint=hint)
    if path.is_dir():
        raise click.BadParameter(f"{path} is a folder: give a file name", param_hint=hint)
    return path


def _output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --json (or other file) output, its folder checked before any work."""
    if value is not None:
        writable_parent(Path(value), param.opts[0])
    return value


def _output_dir(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An --out folder: made by the job if missing, in a folder that exists and may be
    written to; refused before any work otherwise."""
    out = Path(value)
    if out.exists():
        if not out.is_dir():
            raise click.BadParameter(f"{out} exists and is not a folder", param_hint="--out")
        if not os.access(out, os.W_OK | os.X_OK):
            raise click.BadParameter(f"folder {out} may not be written to", param_hint="--out")
    else:
        writable_parent(out, "--out")
    return value


def _table_file(what: str) -> Callable[[click.Context, click.Parameter, str | None],
                                        Path | None]:
    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
        """The optional --out path of a job that writes a table (.csv or .npy), checked
        before any work."""
        if value is None:
            return None
        out = Path(value)
        if out.suffix.lower() not in (".csv", ".npy"):
            raise click.BadParameter(f"{what} are written as CSV or numpy .npy: give a path "
                                     "ending in .csv or .npy", param_hint="--out")
        return writable_parent(out, "--out")

    return check


def _npz_file(what: str) -> Callable[[click.Context, click.Parameter, str], Path]:
    def check(ctx: click.Context, param: click.Parameter, value: str) -> Path:
        """The --out path of a job that writes a scipy .npz, checked before any work."""
        out = Path(value)
        if out.suffix != ".npz":
            raise click.BadParameter(f"{what} is written as scipy .npz: give a path ending in "
                                     ".npz", param_hint="--out")
        return writable_parent(out, "--out")

    return check


# ------------------------------------------------------------------ the cluster

def _protocol(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--protocol: ``mgpu.connect.protocol`` for the command's duration, so every cluster it
    starts or joins goes through :func:`mgpu.connect`'s checks; UCX without distributed-ucxx
    is refused here, before any work."""
    from mgpu.distributed.protocol import UCX_INSTALL, ucx_available

    if value is None:
        return
    if value == "ucx" and not ucx_available():
        raise click.BadParameter(f"ucx needs distributed-ucxx: {UCX_INSTALL}", ctx, param)
    ctx.with_resource(dask.config.set({"mgpu.connect.protocol": value}))


protocol = click.option(
    "--protocol", type=click.Choice(sorted(PROTOCOLS)), default=None, expose_value=False,
    callback=_protocol, help="How the workers talk: tcp, or ucx (NVLink/InfiniBand, needs "
    "mgpu[ucx]); with --address it must be the scheduler's scheme. Default: "
    "mgpu.connect.protocol, else tcp.")
address = stack(click.option("--address", default=None,
                             help="Scheduler to join (default: embedded cluster)."), protocol)
gpus = click.option("--gpus/--no-gpus", default=None, help="Force or forbid GPU workers "
                    "(default: GPU workers when GPUs are visible).")
cpu_threads = click.option("--cpu-threads", default=None, type=click.IntRange(min=1),
                           help="Threads of the CPU worker started beside the GPU workers for "
                           "the hsgd modes (default: the cores not driving a GPU).")


def parts(help: str) -> Decorator:
    return click.option("--parts", default=None, type=click.IntRange(min=1), help=help)


def int_list(name: str, default: str, help: str) -> Decorator:
    """A comma-separated list of positive integers, as a tuple of ints."""
    return click.option(name, default=default, show_default=True, callback=_ints, help=help)


def worker_counts(default: str = "1,2,4") -> Decorator:
    """``--workers 1,2,4``: the worker counts of a scaling benchmark, as ints."""
    return click.option("--workers", default=default, show_default=True, callback=_ints,
                        help="Comma-separated worker counts (GPUs, on a GPU machine).")


def worker_count(default: int = 4) -> Decorator:
    """``--workers 4``: the workers of a benchmark's embedded cluster, one number."""
    return click.option("--workers", default=default, show_default=True,
                        type=click.IntRange(1),
                        help="Workers of the embedded cluster (GPUs, with --gpu).")


def device(choices: Sequence[str], default: str, help: str | None = None) -> Decorator:
    return click.option("--device", type=click.Choice(list(choices)), default=default,
                        show_default=True, help=help)


worker_kind = device(("auto", "cpu", "gpu"), "auto",
                     "Worker kind (auto: GPU workers when GPUs are visible).")
tiles_per_worker = click.option("--tiles-per-worker", default=1, show_default=True,
                                type=click.IntRange(min=1), help="Row tiles per worker.")


def placement(what: str, rows: str, data: str, both: str) -> Decorator:
    """--device/--parts/--workers/--address of the SDDMM + SpMM jobs (``run gradient-mf``,
    ``run gap``): the embedded cluster by default, or one device in this process."""
    return stack(
        device(("cluster", "auto", "cpu", "gpu", "both"), "cluster",
               f"Where the SDDMM + SpMM {what} run: 'cluster', {rows} in row tiles of equal "
               "nnz on the workers of the embedded cluster (GPU workers when GPUs are visible) "
               "or of --address; or one device in this process, without a cluster: auto (the "
               f"GPU when one is visible), cpu, gpu, or both{both}."),
        click.option("--parts", default=None, type=click.IntRange(min=1),
                     help=f"--device cluster: row tiles of {data} (default: one per worker)."),
        click.option("--workers", "n_workers", default=None, type=click.IntRange(min=1),
                     help="--device cluster: workers of the embedded cluster (default: every "
                     "GPU, or Dask's sizing on CPUs)."),
        click.option("--address", default=None, help="--device cluster: scheduler to join."),
        protocol,
    )


# ------------------------------------------------------------------ inputs

seed = click.option("--seed", default=0, show_default=True)


def k(default: int, help: str | None = None) -> Decorator:
    return click.option("-k", "--k", "k", default=default, show_default=True,
                        type=click.IntRange(min=1), help=help)


def ks(default: str, help: str = "Values of K, comma-separated.") -> Decorator:
    """``--k 32,128``: several K, as ints."""
    return click.option("--k", "ks", default=default, show_default=True, callback=_ints,
                        help=help)


def powerlaw(default: str | None = None, help: str = "Generate a power-law matrix of this "
             "shape instead of reading INPUT.", skippable: bool = False) -> Decorator:
    return click.option("--powerlaw", default=default, show_default=default is not None,
                        type=Shape(skippable), metavar="ROWSxCOLS", help=help)


def _count(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A number of nonzeros: finite and >= 1 (1e6 and 2_000_000 alike)."""
    if not (math.isfinite(value) and value >= 1):
        raise click.BadParameter(f"must be a number >= 1, got {value!r}", ctx, param)
    return value


def nnz(default: float = 2e6, help: str = "Nonzeros drawn for --powerlaw.") -> Decorator:
    return click.option("--nnz", default=default, show_default=True, type=float,
                        callback=_count, help=help)


matrix_input = stack(
    click.argument("input", required=False, type=click.Path(exists=True)),
    powerlaw(),
    nnz(),
    seed,
)
"""The INPUT argument and the --powerlaw/--nnz/--seed options of the run jobs."""


def _powerlaw_specs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
                    ) -> list[tuple[int, int, int, tuple[float, ...]]]:
    """--powerlaw ROWSxCOLS:NNZ[:REXP[:CEXP]] (repeatable) as (rows, cols, nnz, exponents)."""
    specs = []
    for spec in values:
        try:
            shape, nnz, *exps = spec.split(":")
            if len(exps) > 2:
                raise ValueError("expected ROWSxCOLS:NNZ[:REXP[:CEXP]]")
            count = float(nnz)
            if not (math.isfinite(count) and count >= 1):
                raise ValueError(f"NNZ must be a number >= 1, got {nnz!r}")
            specs.append((*parse_shape(shape), int(count), tuple(float(e) for e in exps)))
        except ValueError as exc:
            raise click.BadParameter(f"{spec!r}: {exc}", ctx, param) from None
    return specs


_EXPONENTS = ("REXP and CEXP are the row and column degree exponents (default 0.6 and 0.8; "
              "0:0 gives uniform rows, REXP above 1 a few rows with most of the nonzeros).")

powerlaw_specs = click.option(
    "--powerlaw", "powerlaw", multiple=True, metavar="ROWSxCOLS:NNZ[:REXP[:CEXP]]",
    callback=_powerlaw_specs,
    help=f"Add a synthetic power-law matrix (repeatable), e.g. 1000000x1000000:2e7; {_EXPONENTS}")
"""--powerlaw specs of the SpMV benchmark, each as (rows, cols, nnz, exponents)."""

powerlaw_spec = click.option(
    "--powerlaw", "powerlaw", multiple=True, metavar="ROWSxCOLS:NNZ[:REXP[:CEXP]]",
    callback=_powerlaw_specs,
    help=f"A synthetic power-law matrix instead of INPUT (one), e.g. 1000000x1000000:2e7; "
    f"{_EXPONENTS}")
"""One --powerlaw spec in place of INPUT, as a list of (rows, cols, nnz, exponents) that the
command refuses unless it holds one (click would keep the last of several silently)."""


def spgemm_form(of: str, tail: str) -> Decorator:
    """``--form auto|AA|AAt``: the product the SpGEMM benchmarks take ``of`` their input(s);
    ``tail`` ends the help (where the choice is reported)."""
    return click.option(
        "--form", type=click.Choice(["auto", "AA", "AAt"]), default="auto", show_default=True,
        help=f"The product of {of}: AA (A·A, square inputs only), AAt (A·Aᵀ), or auto: "
        "A·A of a square Matrix Market file (.mtx, .mtx.gz), A·Aᵀ of the rest (graphs, "
        f"corpora, power-law matrices, any matrix that is not square). {tail}")


def corpus_shape(default: str, name: str = "--corpus", dest: str = "corpus") -> Decorator:
    return click.option(name, dest, default=default, show_default=True, type=Shape(),
                        metavar="DOCSxTERMS", help="Shape of the synthetic power-law corpus "
                        "(without INPUT).")


density = click.option("--density", default=0.002, show_default=True, type=float,
                       help="Density of the synthetic corpus.")


def data_dir(exists: bool) -> Decorator:
    return click.option("--data", "data_dir", type=click.Path(exists=exists, file_okay=False),
                        default=None, help="Folder of the real datasets (default: "
                        "../shared/data or $MGPU_DATA)" + ("." if exists else "; missing ones "
                                                           "are skipped."))


def _input_formats() -> list[str]:
    from mgpu.io import FORMATS

    return list(FORMATS)


input_format = click.option("--format", "fmt", type=click.Choice(_input_formats()),
                            default=None, help="How to read the input file (a format of "
                            "mgpu.io.FORMATS). Default: told from the content; a file whose "
                            "lines read as several formats ('u v w' lines: ratings, or an edge "
                            "list with weights) is refused without it.")
"""--format: how to read a job's input file (a key of mgpu.io.FORMATS), as ``fmt``."""


ratings = click.argument("ratings", type=click.Path(exists=True, dir_okay=False))
optional_ratings = click.argument("ratings", required=False,
                                  type=click.Path(exists=True, dir_okay=False))


# ------------------------------------------------------------------ outputs

def repeats(default: int | None, help: str = "Timed runs (median).") -> Decorator:
    return click.option("--repeats", default=default, show_default=default is not None,
                        type=click.IntRange(min=1), help=help)


def dtype(help: str | None = None) -> Decorator:
    """``--dtype float32|float64`` (default float32), as the name."""
    return click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
                        show_default=True, help=help)


def json_out(what: str = "every measurement") -> Decorator:
    return click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                        callback=_output_file, help=f"Write {what} to this JSON file.")


def plot(what: str) -> Decorator:
    """``--plot PNG``, refused while click parses when matplotlib is missing."""
    return click.option("--plot", type=click.Path(dir_okay=False), default=None,
                        callback=_need_matplotlib, help=f"Write {what} to this PNG.")


def out_npz(what: str, help: str) -> Decorator:
    """``--out FILE.npz``, checked (suffix, folder) before any work."""
    return click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
                        callback=_npz_file(what), help=help)


def out_table(what: str, help: str) -> Decorator:
    """``--out FILE.csv`` or ``FILE.npy``, optional, checked (suffix, folder) before any
    work."""
    return click.option("--out", "out", default=None, type=click.Path(dir_okay=False),
                        callback=_table_file(what), help=help)


def top(help: str) -> Decorator:
    """``--top N``: how many of the largest results a job prints."""
    return click.option("--top", default=10, show_default=True, type=click.IntRange(min=0),
                        help=help)


def out_dir(help: str) -> Decorator:
    """``--out DIR``, made by the job if missing; its folder checked before any work."""
    return click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
                        callback=_output_dir, help=help)
