"""The errors of the loaders: a file that does not follow its format, and one whose format
cannot be told.

:class:`MalformedFileError` names the file, the line (or byte offset) at fault, what the
format expects there and what the file holds instead; :class:`AmbiguousFormatError` names
the formats a file's lines read as and how to choose one. Both survive pickling so that they
cross from a Dask worker to the client intact.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

StrPath = str | os.PathLike[str]

__all__ = ["AmbiguousFormatError", "MalformedFileError", "StrPath"]


class MalformedFileError(ValueError):
    """A file that does not follow its format.

    The message reads ``"<file name> line <n>: expected <what>, found <what>"`` (``line``
    becomes ``byte <offset>`` for binary formats, and is left out when no single line is
    at fault). The parts are also kept as attributes.

    Parameters
    ----------
    path : str or os.PathLike
        The file at fault; the message shows its name, ``path`` keeps it whole.
    line : int or None
        1-based line number, counting every line of the (decompressed) file.
    expected : str
        What the format requires there.
    found : str
        What the file holds instead.
    byte : int or None, default=None
        Byte offset (decompressed) for binary formats, used when ``line`` is None.

    Examples
    --------
    >>> str(MalformedFileError("data/ap.dat", 17, "'N id:count ...' with N=12 pairs", "11"))
    "ap.dat line 17: expected 'N id:count ...' with N=12 pairs, found 11"
    """

    def __init__(
        self,
        path: StrPath,
        line: int | None,
        expected: str,
        found: str,
        *,
        byte: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.line = line
        self.byte = byte
        self.expected = expected
        self.found = found
        where = self.path.name
        if line is not None:
            where += f" line {line}"
        elif byte is not None:
            where += f" byte {byte}"
        super().__init__(f"{where}: expected {expected}, found {found}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its parts, so that it crosses a process boundary (a Dask worker).
        return (
            functools.partial(type(self), byte=self.byte),
            (self.path, self.line, self.expected, self.found),
        )


class AmbiguousFormatError(ValueError):
    """A file whose lines read as more than one format, each giving another matrix.

    Raised by :func:`~mgpu.io.detect_format` and :func:`~mgpu.io.load` instead of a guess
    (``u v w`` lines are a weighted edge list to a graph and user, item, rating to a ratings
    matrix, whose rows and columns are numbered apart). The message names the candidates and
    how to choose: ``fmt=`` in :func:`~mgpu.io.load`, ``--format`` on the command line.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    candidates : sequence of str
        The keys of ``FORMATS`` its lines read as.
    why : str
        What the lines look like, for the message.
    hint : str, default=""
        A sentence added to the message.

    Examples
    --------
    >>> e = AmbiguousFormatError("g.txt", ["ratings", "weighted-edges"], "3 numbers a line")
    >>> e.candidates
    ('ratings', 'weighted-edges')
    """

    def __init__(self, path: StrPath, candidates: Any, why: str, hint: str = "") -> None:
        self.path = Path(path)
        self.candidates = tuple(candidates)
        self.why = why
        self.hint = hint
        choices = " or ".join(repr(c) for c in self.candidates)
        super().__init__(
            f"{self.path.name}: cannot tell its format: {why}, which read as "
            f"{' or '.join(self.candidates)}, each giving another matrix. Choose one with "
            f"fmt={choices} (mgpu.io.load) or --format on the command line."
            + (f" {hint}" if hint else "")
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.candidates, self.why, self.hint))
