"""The docs say what the code does: the generated pages match the code they come from."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mgpu
from conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("_docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_current():
    stale = _generator().stale()
    assert not stale, (
        f"{', '.join(str(p.relative_to(REPO_ROOT)) for p in stale)} no longer match the code "
        "they are generated from: run `python docs/generate.py` from the repository root "
        "and commit the result")


def test_api_page_has_a_section_for_every_public_name():
    text = (DOCS / "api.md").read_text()
    for name in mgpu.__all__:
        assert f"\n## mgpu.{name}\n" in text, f"docs/api.md has no section for mgpu.{name}"


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_configuration_page_lists_every_setting_with_its_default():
    defaults = _leaves(yaml.safe_load((REPO_ROOT / "mgpu" / "mgpu.yaml").read_text()))
    rows = [line for line in (DOCS / "configuration.md").read_text().splitlines()
            if line.startswith("| `mgpu.")]
    listed = {}
    for row in rows:
        keys, values = (cell.strip() for cell in row.split(" | ")[:2])
        for key, value in zip(keys.strip("| ").split("<br>"), values.split("<br>")):
            listed[key.strip("`")] = yaml.safe_load(value.strip("`"))
    assert listed == defaults


def test_readme_keeps_the_test_command_where_ci_reads_it():
    # .ci/run runs the line two below the marker, exactly as written
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    at = lines.index("<!-- test-command -->")
    assert lines[at + 1] == "```bash"
    assert lines[at + 2].startswith("python3 -m pip install") and "pytest" in lines[at + 2]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_readme_example_runs(data_dir):
    text = (REPO_ROOT / "README.md").read_text()
    example = _python_blocks(text[text.index("<!-- readme-example -->"):])[0]
    assert len(example.strip().splitlines()) <= 20
    out = _run(example, data_dir / "bow")
    assert out.returncode == 0, out.stderr[-3000:]
    first, same_pattern = out.stdout.strip().rsplit(" ", 1)
    assert first.startswith("[   0 ") and same_pattern == "True"  # an article's nearest is itself


@pytest.mark.slow
def test_quickstart_examples_run(data_dir):
    blocks = _python_blocks((DOCS / "quickstart.md").read_text())
    assert blocks
    for code in blocks:
        out = _run(code, data_dir / "bow")
        assert out.returncode == 0, f"{code}\n{out.stderr[-3000:]}"


@pytest.mark.parametrize("page", ["README.md", *sorted(
    str(p.relative_to(REPO_ROOT)) for p in DOCS.glob("*.md"))])
def test_links_between_pages_resolve(page):
    path = REPO_ROOT / page
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{page} links to {target}, which is not there"


def test_reliability_names_tests_that_exist():
    text = (DOCS / "reliability.md").read_text()
    named = 0
    for row in text.splitlines():
        if not row.startswith("| ") or row.startswith("| promise"):
            continue
        module = None
        for path, name in re.findall(r"`(?:(tests/\w+\.py))?(?:::(\w+))?`", row):
            if path:
                module = REPO_ROOT / path
                assert module.exists(), f"docs/reliability.md names {path}, which is not there"
            if name:
                assert module is not None, f"docs/reliability.md: ::{name} follows no test file"
                assert re.search(rf"^(?:async )?def {name}\(", module.read_text(), re.M), (
                    f"docs/reliability.md names {module.name}::{name}, which is not a test there")
                named += 1
    assert named >= 30
