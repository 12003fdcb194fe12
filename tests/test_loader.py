"""The kernel loader: finds kernels/ in a checkout and in an installed wheel, inlines headers."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mgpu.backends import loader

REPO = Path(__file__).resolve().parent.parent


def test_kernel_dir_in_source_checkout():
    d = loader.kernel_dir()
    assert d == REPO / "kernels" or d == REPO / "mgpu" / "_kernels"
    assert (d / "rows.cu").is_file()


def test_header_inlining(tmp_path):
    (tmp_path / "a.cuh").write_text('#pragma once\n#include "b.cuh"\nint a_defined;\n')
    (tmp_path / "b.cuh").write_text("#pragma once\nint b_defined;\n")
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include "b.cuh"\n#include <cstdint>\n'
                                   "int k_defined;\n")
    src = loader.read_source("k.cu", str(tmp_path))
    assert src.count("int a_defined;") == 1
    assert src.count("int b_defined;") == 1  # included twice, inlined once
    assert "#include <cstdint>" in src  # system headers are left to NVRTC
    assert '#include "' not in src and "pragma once" not in src


def test_missing_header_names_the_includer(tmp_path):
    (tmp_path / "k.cu").write_text('#include "nope.cuh"\n')
    with pytest.raises(FileNotFoundError, match=r"nope.cuh not found \(included from k.cu\)"):
        loader.read_source("k.cu", str(tmp_path))


def test_real_kernel_source_is_self_contained():
    src = loader.read_source("rows.cu")
    assert "mgpu_row_norms_warp" in src and "warp_sum" in src
    assert not re.search(r'^\s*#\s*include\s+"', src, re.MULTILINE)


def test_c_type_table():
    import numpy as np

    assert loader.c_type(np.float32) == "float"
    assert loader.c_type("int64") == "long long"
    with pytest.raises(TypeError, match="No kernel instantiation for dtype float16"):
        loader.c_type(np.float16)


def test_get_function_refuses_undeclared_instantiation():
    with pytest.raises(ValueError, match="not among the instantiations"):
        loader.get_function("rows.cu", "mgpu_row_norms_warp<half, int, 0>", ("x",))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_every_instantiation_compiles_with_nvcc(tmp_path):
    """A syntax and template check of every declared instantiation (nothing runs here)."""
    from mgpu.backends.instances import INSTANCES

    for fname, exprs in INSTANCES.items():
        body = loader.read_source(fname)
        body += "\n" + "\n".join(
            f"void* mgpu_take_{i}() {{ return (void*)&{e}; }}" for i, e in enumerate(exprs)
        )
        src = tmp_path / fname
        src.write_text(body)
        out = subprocess.run(
            ["nvcc", "-std=c++17", "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "k.o")],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_wheel_carries_kernels_and_loader_finds_them(tmp_path):
    """Build the wheel, install it apart from the checkout, and load the kernel sources."""
    wheel_dir = tmp_path / "wheel"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheel_dir), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    (whl,) = wheel_dir.glob("mgpu-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    kernels = sorted(p.name for p in (REPO / "kernels").iterdir() if p.suffix in (".cu", ".cuh"))
    for k in kernels:
        assert f"mgpu/_kernels/{k}" in names, names
    assert "mgpu/mgpu.yaml" in names
    assert "mgpu/models/jaccard.py" in names  # `mgpu run jaccard` summarises with it
    assert not any(n.startswith("workflows/") for n in names)  # scripts, not a package
    assert "mgpu/_deploy/slurm/mgpu.sbatch" in names  # `mgpu slurm script` fills it
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
         str(whl)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    code = (
        "import mgpu.backends.loader as L, mgpu\n"
        "print(mgpu.__file__)\nprint(L.kernel_dir())\n"
        "assert 'mgpu_row_norms_warp' in L.read_source('rows.cu')\n"
        "import mgpu.models.jaccard\n"
        "import mgpu.deploy as D\n"
        "assert str(D.deploy_dir()).endswith('_deploy'), D.deploy_dir()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    pkg, kdir = run.stdout.split()
    assert Path(pkg).is_relative_to(site)
    assert Path(kdir) == site / "mgpu" / "_kernels"
    assert re.search(r"mgpu_row_norms_warp", (Path(kdir) / "rows.cu").read_text())
