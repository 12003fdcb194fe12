"""What the commands print and write: worker descriptions, progress bars, JSON files and
files written whole (under a temporary name first, so nothing half written carries the
final one)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click


def fmt_bytes(n: float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def bar(**kw: Any) -> Any:
    """A tqdm progress bar on stderr (off where stderr is not a terminal)."""
    from tqdm import tqdm

    return tqdm(file=sys.stderr, disable=None, **kw)


def write_json(path: str | None, payload: Any, what: str = "measurements") -> None:
    """``--json``: write ``payload`` and say so."""
    if path:
        Path(path).write_text(json.dumps(payload, indent=1))
        click.echo(f"{what} written to {path}")


def replace_json(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def save_npz(path: Path, **arrays: Any) -> None:
    """numpy .npz of ``arrays``, written whole."""
    import numpy as np

    tmp = path.with_name(f".{path.stem}.partial.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def save_table(path: Path, **columns: Any) -> None:
    """Equal-length 1-D ``columns`` as a table, written whole: CSV with a header of their
    names for a ``.csv`` path, else a numpy structured array (``np.load(path)["name"]``)."""
    import numpy as np

    arrays = {k: np.asarray(v) for k, v in columns.items()}
    tmp = path.with_name(f".{path.name}.partial")
    if path.suffix.lower() == ".csv":
        with open(tmp, "w") as f:
            f.write(",".join(arrays) + "\n")
            for row in zip(*(a.tolist() for a in arrays.values())):
                f.write(",".join(map(str, row)) + "\n")
    else:
        table = np.empty(len(next(iter(arrays.values()))),
                         dtype=[(k, a.dtype) for k, a in arrays.items()])
        for k, a in arrays.items():
            table[k] = a
        with open(tmp, "wb") as f:  # a file object: np.save would add .npy to the name
            np.save(f, table, allow_pickle=False)
    tmp.replace(path)


def save_sparse(path: Path, M: Any, **ids: Any) -> None:
    """scipy .npz of a sparse matrix, written whole, with ``ids`` (``node_ids=...``) beside
    scipy's arrays: ``scipy.sparse.load_npz`` reads the matrix and ignores them, ``np.load``
    gives them back."""
    import io

    import numpy as np
    import scipy.sparse as sp

    buf = io.BytesIO()
    sp.save_npz(buf, M, compressed=True)
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as f:
        arrays = dict(f)
    tmp = path.with_name(path.name + ".partial.npz")
    np.savez_compressed(tmp, **arrays, **{k: np.asarray(v) for k, v in ids.items()})
    tmp.replace(path)


def plotted(path: str | None) -> None:
    if path is not None:
        click.echo(f"plot written to {path}")


def describe(client: Any) -> str:
    """'2 GPU worker(s)' or '4 CPU worker(s)' (or both) for a client's cluster."""
    from mgpu.distributed import describe_workers

    infos = describe_workers(client).values()
    n_gpu = sum(1 for i in infos if i.get("gpu"))
    kinds = [f"{n} {kind} worker(s)" for n, kind in ((n_gpu, "GPU"), (len(infos) - n_gpu, "CPU"))
             if n]
    return ", ".join(kinds) or "no workers"


def worker_device(info: dict[str, Any]) -> str:
    """A worker's GPU (name, memory, UUID) or its CPU cores, for ``mgpu info``."""
    gpu = info.get("gpu")
    if gpu and "error" not in gpu:
        return f"GPU {gpu['index']}: {gpu['name']}, {fmt_bytes(gpu['memory'])}, {gpu['uuid']}"
    if gpu:
        return f"GPU {gpu['index']}: unreadable ({gpu['error']})"
    return f"CPU: {info.get('cpus')} core(s)"


def tile_placement(client: Any, tiles: list[dict[str, Any]]) -> str:
    """Lines saying which worker (and which GPU, by UUID) holds each row tile, so that a job
    that left a GPU idle, or two workers on one GPU, shows it."""
    from mgpu.distributed import describe_workers

    infos = describe_workers(client)
    lines = []
    for i, t in enumerate(tiles):
        info = infos.get(t["worker"])
        gpu = info and info.get("gpu")
        on = ("worker gone" if info is None else "CPU" if not gpu
              else gpu.get("uuid", f"GPU {gpu.get('index')}"))
        lines.append(f"  tile {i}: {t['rows']:,} rows, {t['nnz']:,} nonzeros on {t['worker']} "
                     f"({on})")
    return "row tiles:\n" + "\n".join(lines)


def block_placement(events: list[Any]) -> str:
    """Where the block scheduler ran the blocks: runs and steals per worker and kind of slot
    (a worker's GPU, or its CPU threads), so that an idle GPU worker shows."""
    runs: dict[tuple[str, str], list[int]] = {}
    for ev in events:
        if ev.kind in ("assign", "steal"):
            worker, _, slot = ev.slot.rpartition("#")
            kind = "GPU" if slot == "gpu" else "CPU"
            runs.setdefault((kind, worker), [0, 0])[ev.kind == "steal"] += 1
    return "; ".join(f"{n + st} block runs on the {kind} slot(s) of {worker} ({st} stolen)"
                     for (kind, worker), (n, st) in sorted(runs.items()))
