"""kiln's layers, as import-linter checks them (the contracts are in pyproject.toml, [tool.importlinter]).

The tree must keep them, and the check must be able to fail: a copy of the package with one import that breaks a
layer, or one that closes a cycle, is refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is installed by make (the [test] extra)")


def _lint(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's contracts over the kiln package found in ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT), str(ROOT / "pyproject.toml"), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_its_layers_and_has_no_cycles(tmp_path):
    result = _lint(ROOT / "src", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


def _planted(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of src/kiln with ``line`` added to ``module`` (a path under kiln/)."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "kiln", copy / "kiln",
                    ignore=shutil.ignore_patterns("__pycache__", "*.txt", "*.jsonl", "*.onnx"))
    target = copy / "kiln" / module
    target.write_text(target.read_text() + f"\n\n{line}\n")
    return copy


@pytest.mark.parametrize(("module", "line", "broken"), [
    # a leaf reaching up to the server: a layer violation (and a cycle through serve's imports of errors)
    ("errors.py", "def _up():\n    import kiln.serving.app  # noqa: F401", "kiln's packages form layers BROKEN"),
    # two modules of one package importing each other: a cycle inside a layer
    ("tasks/wire/http.py", "import kiln.tasks.wire.tei  # noqa: F401",
     "no import cycles between sibling packages or modules BROKEN"),
    # a task's compute reaching for its wire part (or pydantic): HTTP models would load wherever the task does
    ("tasks/rerank/task.py", "import kiln.tasks.rerank.wire  # noqa: F401",
     "only the servers and integrations load wire parts and HTTP models BROKEN"),
    ("runtime/features.py", "import pydantic  # noqa: F401",
     "only the servers and integrations load wire parts and HTTP models BROKEN"),
    # an export part reaching into the runtime: loading a model would load the task's per-call machinery
    ("tasks/rerank/export.py", "import kiln.runtime.features  # noqa: F401",
     "a task's export part knows nothing of its runtime or validation BROKEN"),
    ("tasks/text_classification/validation.py", "import kiln.tasks.text_classification.task  # noqa: F401",
     "a task's validation part knows nothing of its runtime BROKEN"),
])
def test_a_planted_violation_is_refused(tmp_path, module, line, broken):
    result = _lint(_planted(tmp_path, module, line), tmp_path)
    assert result.returncode != 0
    assert broken in result.stdout, result.stdout


def test_tests_and_benchmarks_do_not_import_each_other():
    """Shared helpers live in kiln (kiln.testing): a benchmark that imported a test module, or a test that imported
    a benchmark script, would tie the suite's speed to the tests' internals and the other way round."""
    import re

    pattern = {"tests": re.compile(r"^\s*(from|import)\s+benchmarks\b", re.M),
               "benchmarks": re.compile(r"^\s*(from|import)\s+tests\b", re.M)}
    # The repository's own files: the peers' venvs the benchmarks create inside benchmarks/ (.peers-venv, ...) are
    # not kiln's, and hold files that are not UTF-8.
    offenders = [str(path.relative_to(ROOT)) for folder, rx in pattern.items()
                 for path in (ROOT / folder).rglob("*.py")
                 if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
                 and rx.search(path.read_text())]
    assert not offenders, offenders
