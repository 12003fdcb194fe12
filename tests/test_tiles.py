"""mgpu.distributed.tiles.RowTiles: row tiles of a matrix kept on the workers with state beside
them, as the models use them, on a CPU LocalCluster."""
from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from distributed import wait

from mgpu.distributed import from_scipy
from mgpu.distributed.tiles import RowTiles, check_scipy_or_tiles
from mgpu.synthetic import powerlaw_csr
from mgpu.distributed import workers_now


def _row_sums(tile, factor, scale):
    return np.asarray(tile.sum(axis=1)).ravel() * scale + factor[:, 0]


def test_tiles_cover_the_rows_in_order_with_their_nonzeros(client):
    S = powerlaw_csr(2000, 300, 40_000, seed=3)
    tiles = RowTiles.place(S, name="test", parts=3, client=client)
    assert len(tiles) == 3 and not tiles.gpu
    assert tiles.bounds[0] == 0 and tiles.bounds[-1] == S.shape[0]
    assert tiles.nnz == [S[tiles.rows(i)].nnz for i in range(3)]
    assert sum(tiles.nnz) == S.nnz
    assert max(tiles.nnz) - min(tiles.nnz) <= np.diff(S.indptr).max()  # cut at nnz
    workers = set(workers_now(client))
    assert all(w in workers for w in tiles.workers)
    assert [d["rows"] for d in tiles.describe()] == np.diff(tiles.bounds).tolist()
    # per-tile state held where the tile is, a shared value, one task per tile
    U = np.arange(S.shape[0], dtype=np.float64)[:, None]
    held = tiles.hold("U", [U[tiles.rows(i)] for i in range(3)])
    wait(held)
    where = client.who_has(held)
    assert [list(where[f.key]) for f in held] == [[w] for w in tiles.workers]
    scale = tiles.share("scale", 2.0)
    parts = tiles.map(_row_sums, tiles.blocks, held, args=(scale,))
    got = np.concatenate([tiles.result(f, "row sums") for f in parts])
    np.testing.assert_array_equal(got, np.asarray(S.sum(axis=1)).ravel() * 2.0 + U[:, 0])


def test_a_dask_array_of_row_tiles_is_taken_as_it_is(client):
    S = powerlaw_csr(900, 200, 9_000, seed=4)
    Sd = from_scipy(S, 2, axis=0, client=client)
    tiles = RowTiles.place(Sd, name="test", client=client)
    assert len(tiles) == 2 and tiles.bounds.tolist() == [0, Sd.chunks[0][0], 900]
    assert sum(tiles.nnz) == S.nnz


def test_a_coo_matrix_is_placed_as_its_csr(client):
    """Any scipy format is taken; duplicates count once, as from_scipy places them."""
    S = powerlaw_csr(900, 200, 9_000, seed=5)
    C = S.tocoo()
    dup = sp.coo_matrix((np.append(C.data, 1.0), (np.append(C.row, C.row[0]),
                                                  np.append(C.col, C.col[0]))), shape=S.shape)
    for M in (C, dup):
        tiles = RowTiles.place(M, name="test", parts=2, client=client)
        assert tiles.nnz == [S[tiles.rows(i)].nnz for i in range(2)]
        assert sum(tiles.nnz) == S.nnz
        zeros = [np.zeros((int(np.diff(tiles.bounds)[i]), 1)) for i in range(2)]
        parts = tiles.map(_row_sums, tiles.blocks, zeros, args=(1.0,))
        got = np.concatenate([tiles.result(f, "row sums") for f in parts])
        np.testing.assert_allclose(got, np.asarray(M.tocsr().sum(axis=1)).ravel())


def test_column_tiles_are_recut_into_row_tiles(client):
    """Once refused; issue 35 asks for column tiles to be re-cut at nnz prefix sums."""
    S = sp.random(50, 40, density=0.1, format="csr", random_state=0)
    tiles = RowTiles.place(from_scipy(S, 2, axis=1, client=client), name="GaP.fit",
                           client=client)
    assert len(tiles) == 2 and tiles.bounds[-1] == 50
    assert tiles.nnz == [S[tiles.rows(i)].nnz for i in range(2)]
    got = sp.vstack([tiles.result(b, "tile") for b in tiles.blocks])
    assert (got != S).nnz == 0


def test_refusals(client):
    S = sp.random(50, 40, density=0.1, format="csr", random_state=0)
    with pytest.raises(ValueError, match="'S' parameter of GaP.fit must be 2-D"):
        RowTiles.place(da.ones(5), name="GaP.fit", client=client)
    with pytest.raises(TypeError, match="'S' parameter of GaP.fit must be a scipy sparse"):
        check_scipy_or_tiles(S.toarray(), "S", "GaP.fit")
    check_scipy_or_tiles(S, "S", "GaP.fit")  # taken


def test_without_a_cluster_it_says_how_to_get_one(monkeypatch):
    import mgpu.distributed.tiles as tiles_module

    monkeypatch.setattr(tiles_module, "current_client", lambda: None)
    with pytest.raises(ValueError, match=r"no cluster to place GaP's row tiles on: call "
                                         r"mgpu.connect\(\) first"):
        RowTiles.place(sp.identity(4, format="csr"), name="GaP")
