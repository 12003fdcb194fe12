"""The shape of the mgpu command: options declared once, library refusals as usage errors,
and the ways in (`mgpu`, `python -m mgpu`)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import mgpu
from mgpu.cli import main

CLI = Path(mgpu.__file__).parent / "cli"


def _option_names(path: Path) -> list[str]:
    """The option names given to every click.option call in a module."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "option"):
            names += [a.value for a in node.args
                      if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
    return names


@pytest.mark.parametrize("name", ["--json", "--plot", "--device", "--repeats", "--seed",
                                  "--gpus/--no-gpus", "--workers", "--out", "--powerlaw",
                                  "--nnz", "--parts", "--dtype"])
def test_shared_options_are_declared_once(name):
    where = {p.name: _option_names(p).count(name) for p in CLI.glob("*.py")}
    assert where.pop("_options.py") >= 1
    assert not any(where.values()), where


def test_every_command_takes_its_options_from_one_place():
    # --json, --plot and --device appear on many commands, each from _options
    def walk(group):
        for cmd in group.commands.values():
            yield from walk(cmd) if hasattr(cmd, "commands") else [cmd]

    opts = [o for cmd in walk(main) for p in cmd.params for o in p.opts]
    assert opts.count("--json") >= 8 and opts.count("--plot") >= 8
    assert opts.count("--device") >= 8


def test_no_function_or_module_of_the_cli_is_long():
    for path in CLI.glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 700, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                assert node.end_lineno - first < 80, f"{path.name}: {node.name}"


def test_a_library_refusal_is_a_usage_error_in_its_words(tmp_path):
    r = CliRunner().invoke(main, ["run", "knn-graph", "--powerlaw", "50x20", "--nnz", "300",
                                  "--out", str(tmp_path / "g.npz"), "--metric", "foo"])
    assert r.exit_code == 2, r.output
    assert "The 'metric' parameter of knn-graph must be a str among" in r.output
    assert not (tmp_path / "g.npz").exists()


def test_an_unknown_mode_is_refused_by_the_library():
    from mgpu.bench.mf_modes import parse_modes

    with pytest.raises(ValueError, match="modes must be among sequential, cpu, gpu"):
        parse_modes("cpu,fast")
    assert parse_modes(["gpu", " cpu "]) == ["gpu", "cpu"]


def test_python_dash_m_mgpu_is_the_mgpu_command():
    out = subprocess.run([sys.executable, "-m", "mgpu", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert mgpu.__version__ in out.stdout
