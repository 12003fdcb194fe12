"""The shape of the code: imports go one way (DESIGN.md's layers), no import cycles, no
module too long to read, and a thin command line.

Read from the source with ``ast`` (function-level imports count as much as top-level ones),
so the test needs neither a GPU nor an import of the package.
"""
from __future__ import annotations

import ast
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mgpu"

# DESIGN.md's layers, top to bottom. A module may import its own layer and the layers below
# it, never one above. The package itself (``mgpu/__init__.py``, the public functions) sits
# below the models, which are built on those functions, and above what it re-exports. The
# benchmarks, the loaders and the deploy helpers are not in DESIGN's list: the benchmarks (and
# the drivers of ``mgpu run``) sit just below the command line, the loaders beside partition,
# and the deploy helpers (the batch script of an ``mgpu run`` job) with the command line.
LAYERS: list[tuple[str, ...]] = [
    ("mgpu.cli", "mgpu.__main__", "mgpu.deploy"),
    ("mgpu.bench",),
    ("mgpu.models",),
    ("mgpu",),
    ("mgpu.mf",),
    ("mgpu.sched",),
    ("mgpu.distributed",),
    ("mgpu.ops",),
    ("mgpu.partition", "mgpu.io", "mgpu.synthetic"),
    ("mgpu.backends",),
    ("mgpu.config",),
]

MAX_MODULE_LINES = 700
MAX_CLI_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str:
    # "mgpu.ops.distances.knn" -> "mgpu.ops.distances": the module an imported name lives in
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: Path) -> set[str]:
    """The mgpu modules that ``module`` imports, anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "mgpu")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "mgpu":
                continue
            for alias in node.names:
                # "from mgpu import config" imports the module mgpu.config, not the facade
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in MODULES else source)
    return {_resolve(name) for name in found} - {module}


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} is in no layer of LAYERS (and of DESIGN.md): add it"
    return rank


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_cycles_and_resolves_imports():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _resolve("mgpu.ops.distances.pairwise_distances") == "mgpu.ops.distances"
    assert "mgpu.config" in GRAPH["mgpu"]  # "from mgpu import config" is the module


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_cycle():
    cycles = _cycles(GRAPH)
    assert not cycles, "modules that import each other round:\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_imports_go_down_the_layers_only():
    upward = sorted(f"{a} imports {b}" for a, targets in GRAPH.items() for b in targets
                    if _layer(b) < _layer(a))
    assert not upward, "imports of a layer above (DESIGN.md, Layers):\n" + "\n".join(upward)


def test_no_module_over_700_lines():
    long = {m: n for m, p in MODULES.items()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_cli_functions_are_short():
    long = {}
    for module, path in MODULES.items():
        if not module.startswith("mgpu.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # from ``def``, decorators apart
                if lines > MAX_CLI_FUNCTION_LINES:
                    long[f"{module}.{node.name}"] = lines
    assert long == {}


@pytest.mark.parametrize("script", sorted((ROOT / "workflows").glob("*.py")),
                         ids=lambda p: p.name)
def test_workflows_use_the_public_api_only(script):
    private = []
    for node in ast.walk(ast.parse(script.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mgpu"):
            names = [node.module] + [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("mgpu")]
        private += [n for n in names if any(part.startswith("_") for part in n.split("."))]
    assert private == []


# ``hasattr(x, "get")``: a device test written by hand (CuPy data has .get())
_HAND_DEVICE_TEST = re.compile(r"""hasattr\([^,()]+,\s*["']get["']\)""")


def test_outside_the_backends_a_type_branch_says_why():
    # Ops choose a backend by a dispatch lookup. Where code outside mgpu/backends still asks
    # whether data is CuPy's (to word a refusal, to place a GPU task), a comment on that line
    # or on the two lines above it says why. Asking by hand (hasattr(x, "get")) counts too:
    # mgpu.backends has the helpers for it (is_gpu_array, to_host, on_device_of).
    bare = []
    for module, path in MODULES.items():
        if module.startswith("mgpu.backends"):
            continue
        text = path.read_text()
        with open(path, "rb") as f:
            commented = {tok.start[0] for tok in tokenize.tokenize(f.readline)
                         if tok.type == tokenize.COMMENT}
        for i, line in enumerate(text.splitlines(), start=1):
            if line.lstrip().startswith(("def ", "#")):
                continue
            if "is_gpu_array(" in line or _HAND_DEVICE_TEST.search(line):
                if not commented & {i - 2, i - 1, i}:
                    bare.append(f"{module}:{i}: {line.strip()}")
    assert not bare, "type branches without a reason:\n" + "\n".join(bare)


def test_a_device_test_by_hand_is_caught():
    assert _HAND_DEVICE_TEST.search('gpu = hasattr(R, "get")')
    assert _HAND_DEVICE_TEST.search("host = S.get() if hasattr(S, 'get') else S")
    assert not _HAND_DEVICE_TEST.search('getattr(self, "get_x", None)')
