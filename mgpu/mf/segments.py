"""A job's factor segments: where each one's latest version is (:class:`SegmentMap`, kept by
the block scheduler's side) and the shared-memory file in which the block hosts of one node
keep them (:class:`SegmentStore`, :func:`store_supported`).

A segment is a user stratum's rows of P (``("p", row)``) or an item stratum's rows of Q
(``("q", column)``); its version counts the calls that updated it. The hosts that use
these are in :mod:`mgpu.mf.hosts`.
"""
from __future__ import annotations

import logging
import os
import platform
from collections.abc import Sequence

import numpy as np

__all__ = ["Key", "SegmentMap", "SegmentStore", "store_supported"]

logger = logging.getLogger(__name__)

Key = tuple[str, int]  # ("p", row stratum) or ("q", column stratum), or a probe's own keys


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class SegmentStore:
    """A job's factor segments in one shared-memory file of a node, mapped by every block
    host of the node (:func:`share_segments`): a host reads a segment another host of the
    node made where it lies, at the version it needs, with no message, no serialisation
    and no wait on the maker's event loop; a CPU host runs its blocks on it in place, and
    a GPU host copies it to the device and its results back (the mapping pinned for the
    device's copies). Each segment's version is a counter at the head of the file, written
    after the segment's rows; x86-64's store order makes a reader that sees the counter
    see the rows (:func:`store_supported`).

    ``layout`` lists (key, rows) in one order on every host; the segments are ``rows × k``
    of ``dtype``.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "segs")
    >>> a = SegmentStore(path, [(("p", 0), 3), (("q", 0), 2)], 4, "float64", create=True)
    >>> b = SegmentStore(path, [(("p", 0), 3), (("q", 0), 2)], 4, "float64", create=False)
    >>> a.views[("q", 0)][:] = 7.0; a.publish(("q", 0), 1)
    >>> b.version(("q", 0)), float(b.views[("q", 0)].sum()), b.version(("p", 0))
    (1, 56.0, -1)
    """

    def __init__(self, path: str, layout: Sequence[tuple[Key, int]], k: int, dtype: str,
                 create: bool):
        self.path = path
        offsets, self.nbytes = self.offsets(layout, k, dtype)
        self._map = np.memmap(path, dtype=np.uint8, mode="w+" if create else "r+",
                              shape=(self.nbytes,))
        self._versions = np.ndarray((len(layout),), np.int64, buffer=self._map)
        if create:
            self._versions[:] = -1
        self.index = {tuple(key): j for j, (key, _) in enumerate(layout)}
        self.views = {tuple(key): np.ndarray((int(rows), k), dtype, buffer=self._map, offset=o)
                      for (key, rows), o in zip(layout, offsets)}
        self.pinned = False

    @staticmethod
    def offsets(layout: Sequence[tuple[Key, int]], k: int, dtype: str
                ) -> tuple[list[int], int]:
        """Each segment's byte offset in the file, and the file's size."""
        itemsize = np.dtype(dtype).itemsize
        off = _round_up(8 * len(layout), 64)
        out = []
        for _, rows in layout:
            out.append(off)
            off += _round_up(int(rows) * k * itemsize, 64)
        return out, max(off, 64)

    def version(self, key: Key) -> int:
        return int(self._versions[self.index[key]])

    def publish(self, key: Key, version: int) -> None:
        """The segment's rows are written: readers waiting for ``version`` may go on."""
        self._versions[self.index[key]] = version

    def pin(self) -> None:
        """Page-lock the mapping for the device's copies (a GPU host's); left pageable,
        with a warning, where the driver refuses."""
        import cupy

        try:
            cupy.cuda.runtime.hostRegister(self._map.ctypes.data, self.nbytes, 0)
            self.pinned = True
        except cupy.cuda.runtime.CUDARuntimeError as e:
            logger.warning("shared segments not page-locked (%s): device copies go through "
                           "a staging buffer", e)

    def close(self) -> None:
        if self.pinned:
            import cupy

            cupy.cuda.runtime.hostUnregister(self._map.ctypes.data)
            self.pinned = False


def store_supported(nbytes: int, folder: str = "/dev/shm") -> str | None:
    """Why a node cannot hold ``nbytes`` of shared segments, or None where it can: an
    x86-64 machine (whose store order the version counters rely on) with a shared-memory
    folder that has room (twice the size free)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} is not x86-64"
    try:
        st = os.statvfs(folder)
    except OSError:
        return f"no {folder}"
    if st.f_bavail * st.f_frsize < 2 * nbytes:
        return f"{folder} has {st.f_bavail * st.f_frsize:,} bytes free, {2 * nbytes:,} wanted"
    return None


class SegmentMap:
    """Where each segment's latest version is, and which it is, as the client has sent the
    calls (a segment's version counts the calls that updated it)."""

    def __init__(self, holders: dict[Key, str]):
        self.at = {key: (w, 0) for key, w in holders.items()}

    def use(self, key: Key, worker: str) -> tuple[tuple[Key, int, str | None, bool],
                                                   tuple[Key, int]]:
        """A call on ``worker`` updates ``key``: its input (key, version, holder or None for
        the same worker, keep) and its output (key, next version)."""
        holder, v = self.at[key]
        self.at[key] = (worker, v + 1)
        return (key, v, None if holder == worker else holder, False), (key, v + 1)

    def latest(self) -> dict[str, dict[Key, int]]:
        """Each holder's segments and their latest versions."""
        out: dict[str, dict[Key, int]] = {}
        for key, (w, v) in self.at.items():
            out.setdefault(w, {})[key] = v
        return out
