"""The ``mgpu`` command: info, run, bench, calibrate, slurm.

Each group lives in its own module; options shared between commands are declared once in
:mod:`mgpu.cli._options`. A command parses its options, calls one library function and
reports; the library's refusals become usage errors in :mod:`mgpu.cli._errors`.
"""
from __future__ import annotations

import logging
import os

import click
import dask.config

import mgpu
from mgpu.cli._errors import Group
from mgpu.cli.bench import bench
from mgpu.cli.calibrate import calibrate_cmd
from mgpu.cli.info import info
from mgpu.cli.run import run
from mgpu.cli.slurm import cluster_jobs, slurm

__all__ = ["cluster_jobs", "main"]


@click.group(cls=Group)
@click.version_option(mgpu.__version__, prog_name="mgpu")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """mgpu: sparse machine-learning primitives on many GPUs and CPUs through Dask."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Dask's cluster chatter (worker start/stop) only with -v; worker processes inherit this.
    dask_level = "info" if verbose else "warning"
    dask_level = os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", dask_level)
    dask.config.set({"logging.distributed": dask_level})
    logging.getLogger("distributed").setLevel(dask_level.upper())


for _command in (info, run, calibrate_cmd, slurm, bench):
    main.add_command(_command)
