"""The Examples sections of the public docstrings run and print what they say."""
from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules_with_examples() -> list[str]:
    """Every mgpu module whose source holds an example that runs (a ``>>>`` line not marked
    ``+SKIP``), so that a new one joins without a list to keep."""
    found = []
    for path in sorted((ROOT / "mgpu").rglob("*.py")):
        text = path.read_text()
        if any(line.lstrip().startswith(">>>") and "+SKIP" not in line
               for line in text.splitlines()):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules_with_examples()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
