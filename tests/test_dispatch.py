"""The backends layer: one dispatch table per primitive, its modules importing neither the
package itself (no cycle) nor anything above it (no upward import)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
import mgpu.backends
from mgpu.backends import dispatch

BACKENDS = Path(mgpu.backends.__file__).parent
# the layers above the backends (DESIGN.md): a backend imports none of them
ABOVE = ("mgpu.ops", "mgpu.distributed", "mgpu.mf", "mgpu.sched", "mgpu.models", "mgpu.cli",
         "mgpu.bench", "mgpu.partition", "mgpu.io", "mgpu.deploy", "mgpu.synthetic")


def _imports(path: Path) -> list[str]:
    """Every module a file imports, at any depth of its code: ``from a import b`` as ``a``,
    or as ``mgpu.b`` for the top package (``from mgpu import config``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module in ("mgpu", "mgpu.backends"):
            names += [f"{node.module}.{a.name}" for a in node.names]  # a module, or a name
            names += [node.module] if node.module == "mgpu.backends" else []
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", sorted(BACKENDS.glob("*.py")), ids=lambda p: p.name)
def test_backend_modules_import_neither_the_package_nor_the_layers_above(path):
    for name in _imports(path):
        assert name != "mgpu.backends" or path.name == "__init__.py", \
            f"{path.name} imports the package mgpu.backends (a cycle with its __init__)"
        assert not name.startswith(ABOVE), f"{path.name} imports {name} from a layer above"


def test_dispatch_holds_only_the_tables():
    tables = {n for n, v in vars(dispatch).items() if isinstance(v, type(dispatch.knn_lookup))}
    assert tables == {n for n in dispatch.__all__ if n.endswith("_lookup")}
    for name in tables:  # the package re-exports every table
        assert getattr(mgpu.backends, name) is getattr(dispatch, name)


# tables only the GPU fills: the products that check their operands on the device, with the
# kernels (the host checks them first: mgpu.ops.spmv.spmv_checked, mgpu.ops.sddmm.sddmm),
# and SDDMM's prepared calls of repeated calls without a plan (mgpu.ops.sddmm.sddmm asks
# them for GPU data only: a host call has no launch to prepare)
DEVICE_ONLY = {"sddmm_flagged_lookup", "spmv_flagged_lookup", "sddmm_repeat_lookup",
               "sddmm_remember_lookup"}


@pytest.mark.parametrize("name", sorted(n for n in dispatch.__all__
                                        if n.endswith("_lookup") and n not in DEVICE_ONLY))
def test_every_table_has_a_host_side(name):
    lookup = getattr(dispatch, name)
    if name == "sgd_lookup":
        import mgpu.mf.sgd  # noqa: F401  (the CPU block kernel registers itself)
    host = (np.ndarray, sp.csr_matrix)
    assert any(_has(lookup, t) for t in host), f"{name} has no numpy/scipy implementation"


def _has(lookup, typ) -> bool:
    try:
        lookup.dispatch(typ)
    except TypeError:
        return False
    return True


def test_the_backends_import_without_a_cycle_from_any_entry():
    # each host backend module imported first into a clean slate: a cycle shows as an
    # ImportError (a name asked of a module still half imported)
    first = [p.stem for p in sorted(BACKENDS.glob("*.py"))
             if p.stem != "__init__" and "\nimport cupy" not in p.read_text()]
    code = (
        "import sys, importlib\n"
        f"for name in {first!r}:\n"
        "    for m in [m for m in sys.modules if m == 'mgpu' or m.startswith('mgpu.')]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module('mgpu.backends.' + name)\n"
        "    import mgpu\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert {"dispatch", "finite", "numpy", "register"} <= set(first)


def test_is_gpu_array_and_array_module_on_host_data():
    assert not mgpu.backends.is_gpu_array(np.zeros(2))
    assert not mgpu.backends.is_gpu_array(sp.identity(2, format="csr"))
    assert mgpu.backends.array_module(np.zeros(2)) is np
    assert mgpu.backends.array_module(sp.identity(2, format="csr")) is np


# ------------------------------------------------ the options of the public ops, refused
# Every option of every public op, given a bad value, is refused before any work, in one
# sentence: "The '<param>' parameter of <func> must be <constraint>. Got <value> instead."
# (sddmm_plan's K says "Got 0." without "instead", as its tests assert.) The options are
# checked before the lookup, so CPU and GPU data get the same refusal.

def _operands():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((6, 4))
    S = sp.random(6, 5, density=0.5, format="csr", random_state=rng)
    G = sp.csr_matrix(np.ones((4, 4)) - np.eye(4))
    return X, S, rng.standard_normal((6, 3)), rng.standard_normal((5, 3)), G


def _nn(**kw):
    import mgpu.ops

    X = _operands()[0]
    return mgpu.ops.NearestNeighbors(**kw).fit(X)


_BAD = [  # (func, param, bad value, call with it, exception, how the message shows it)
    *[("row_norms", "norm", v, lambda v: mgpu.row_norms(_operands()[0], norm=v), ValueError,
       None) for v in ("l3", None, 2)],
    *[("pairwise_distances", "metric", v,
       lambda v: mgpu.pairwise_distances(_operands()[0], metric=v), ValueError, None)
      for v in ("braycurtis", None, 3)],
    *[("pairwise_distances", "p", v,
       lambda v: mgpu.pairwise_distances(_operands()[0], metric="minkowski", p=v),
       ValueError, None) for v in (0, -1.5, float("nan"), "2", True)],
    *[("knn", "metric", v, lambda v: mgpu.knn(*_operands()[:1] * 2, 2, metric=v), ValueError,
       None) for v in ("nope", None)],
    *[("knn", "p", v, lambda v: mgpu.knn(*_operands()[:1] * 2, 2, metric="minkowski", p=v),
       ValueError, None) for v in (0, float("nan"))],
    *[("knn", "k", v, lambda v: mgpu.knn(*_operands()[:1] * 2, v), ValueError, None)
      for v in (0, 7, 1.5, True, "3")],
    *[("NearestNeighbors", "n_neighbors", v, lambda v: _nn(n_neighbors=v), ValueError, None)
      for v in (0, "3", True)],
    ("NearestNeighbors", "metric", "nope", lambda v: _nn(metric=v), ValueError, None),
    ("NearestNeighbors", "p", 0, lambda v: _nn(p=v), ValueError, None),
    ("kneighbors_graph", "mode", "weights", lambda v: _nn(n_neighbors=2).kneighbors_graph(
        mode=v), ValueError, None),
    *[("jaccard", "parts", v, lambda v: mgpu.jaccard(_operands()[4], parts=v), ValueError,
       None) for v in (0, 1.5, True)],
    *[("spgemm", "parts", v, lambda v: mgpu.spgemm(_operands()[1], _operands()[1].T, parts=v),
       ValueError, None) for v in (0, 1.5, True)],
    ("sddmm", "device", "tpu", lambda v: mgpu.sddmm(*_operands()[1:4], device=v), ValueError,
     None),
    *[("sddmm_plan", "K", v, lambda v: mgpu.sddmm_plan(_operands()[1], v), ValueError, None)
      for v in (0, 1.5, True)],
    ("sddmm_plan", "scheme", "dense",
     lambda v: mgpu.sddmm_plan(_operands()[1], 3, scheme=v), ValueError, None),
    ("sddmm_plan", "dtype", "int8",
     lambda v: mgpu.sddmm_plan(_operands()[1], 3, dtype=v), ValueError, "int8"),
    ("spmv", "plan", "cut", lambda v: mgpu.spmv(_operands()[1], np.ones(5), plan=v),
     TypeError, "str"),
]


@pytest.mark.parametrize(("func", "param", "bad", "call", "exc", "shown"), _BAD,
                         ids=[f"{f}-{p}-{b!r}" for f, p, b, *_ in _BAD])
def test_every_option_of_a_public_op_refuses_a_bad_value_by_name(func, param, bad, call, exc,
                                                                   shown):
    got = re.escape(repr(bad) if shown is None else shown)
    with pytest.raises(exc, match=rf"^The '{param}' parameter of {func} must .+\. Got {got}"
                                  rf"( instead)?\.$"):
        call(bad)


def test_every_cupy_registration_is_found_lazily():
    """Each table a CuPy module registers on is listed with that module in
    mgpu.backends.register, so the first CuPy data to reach the table imports it: else the
    lookup fails with "No dispatch" in a process that has not imported the module yet."""
    from mgpu.backends.register import CUPY_MODULES

    names = {id(v): k for k, v in vars(dispatch).items()
             if isinstance(v, type(dispatch.spgemm_lookup))}
    listed = {module: {names[id(lookup)] for lookup in lookups}
              for module, lookups in CUPY_MODULES.items()}
    for path in sorted(BACKENDS.glob("cupy*.py")):
        module = f"mgpu.backends.{path.stem}"
        tree = ast.parse(path.read_text(), str(path))
        registered = {dec.func.value.id for node in ast.walk(tree)
                      if isinstance(node, ast.FunctionDef) for dec in node.decorator_list
                      if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                      and dec.func.attr == "register" and isinstance(dec.func.value, ast.Name)
                      and dec.func.value.id.endswith("_lookup")}
        # knn_prepared_lookup dispatches on the index type knn_prepare_lookup returns, made
        # by that module itself: nothing reaches it before the module is imported
        missing = registered - listed.get(module, set()) - {"knn_prepared_lookup"}
        assert not missing, (module, missing)
