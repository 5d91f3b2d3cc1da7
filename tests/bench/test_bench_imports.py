"""Every name a benchmark imports from the project exists: benchmarks import the trainer's
internals inside functions, so a rename there (`trainer.step.update`, `_token_logp`) broke two
of them without any test noticing. Resolves the imports without running the scripts."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
ROOMS = ("trainer", "store", "api", "worker", "cli")


def _project_imports(path: Path) -> list[tuple[str, str]]:
    return [(node.module, alias.name) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ROOMS
            for alias in node.names]


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_project_names_a_benchmark_imports_exist(script: Path):
    missing = []
    for module, name in _project_imports(script):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script.name} imports names that no longer exist: {missing}"


def test_the_scan_sees_the_internals():
    assert ("trainer.optim.update", "_chunks") in _project_imports(BENCH / "lora_update.py")
