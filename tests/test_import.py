"""`import mgpu` stays light: no CuPy, no CUDA context, config registered."""
from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_mgpu_does_not_import_cupy():
    code = (
        "import sys, mgpu, mgpu.ops, mgpu.distributed, mgpu.cli, mgpu.partition, mgpu.io, "
        "mgpu.backends.loader\n"
        "import scipy.sparse as sp\n"
        "mgpu.row_norms(sp.identity(3, format='csr'))\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupyx', 'dask_cuda'))\n"
        "assert not bad, bad\n"
        "import dask\n"
        "assert dask.config.get('mgpu.connect.host') == '127.0.0.1'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_config_from_environment():
    code = "import mgpu, mgpu.config as c; print(c.get('connect.timeout'))"
    env = {"DASK_MGPU__CONNECT__TIMEOUT": "7"}
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "7"


def test_public_names_and_the_old_distributed_name():
    import warnings

    import mgpu
    import mgpu.distributed

    for name in mgpu.__all__:
        assert hasattr(mgpu, name), name
    assert mgpu.from_scipy is mgpu.distributed.from_scipy
    assert mgpu.gather is mgpu.distributed.gather
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert mgpu.dist is mgpu.distributed
    assert any("mgpu.distributed" in str(w.message) for w in caught)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mgpu.nope  # noqa: B018


def test_the_old_distributed_name_imports_as_a_module_with_a_warning():
    """``from mgpu.dist import ...`` and ``import mgpu.dist[.<module>]`` give the modules of
    mgpu.distributed themselves (no second copy), each with a DeprecationWarning."""
    code = (
        "import sys, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from mgpu.dist import from_scipy\n"
        "    import mgpu.dist.cluster as cluster\n"
        "    from mgpu.dist.knn import knn_distributed\n"
        "import mgpu.distributed, mgpu.distributed.cluster, mgpu.distributed.knn\n"
        "assert from_scipy is mgpu.distributed.from_scipy\n"
        "assert cluster is mgpu.distributed.cluster\n"
        "assert knn_distributed is mgpu.distributed.knn.knn_distributed\n"
        "assert mgpu.distributed.cluster.__spec__.name == 'mgpu.distributed.cluster'\n"
        "words = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        "assert words == ['mgpu.dist is now mgpu.distributed (mgpu.from_scipy and mgpu.gather "
        "are at the top level too)', 'mgpu.dist.cluster is now mgpu.distributed.cluster', "
        "'mgpu.dist.knn is now mgpu.distributed.knn'], words\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupyx'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
