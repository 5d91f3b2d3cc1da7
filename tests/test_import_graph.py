"""No import cycle anywhere, lazy imports included, and the rooms depend on each other one way.

The graph is read from the source with `ast`: every `import` and `from ... import`, at module
level or inside a function. A function-level import still is a dependency (it only runs
later), so a cycle hidden behind one is still a cycle. The graphs that must be acyclic:
- the rooms: api, store, worker, trainer, cli, bench, migrations;
- inside trainer/: each sub-package (trainer/algo, trainer/engines, ...) and each top-level
  module (trainer/spec.py, trainer/loop.py, ...) one node;
- inside each of trainer's sub-packages: each module its own node, nested packages' modules
  included (trainer/graders/sandbox/layer.py, ...); the package's __init__ is left out, since
  it re-exports its modules' names;
- inside api/, store/, worker/ and cli/: each module its own node.
A failure names the cycle and, for each of its edges, the import that makes it.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("api", "store", "worker", "trainer", "cli", "bench", "migrations")
TRAINER_PACKAGES = sorted(p.name for p in (ROOT / "trainer").iterdir()
                          if p.is_dir() and any(p.rglob("*.py")))
# The grader sandbox, one way (trainer/graders/sandbox/): how a server is started (layer),
# one server process (process), which layer works here (detect), the pool of servers (pool).
SANDBOX_ORDER = ("layer", "process", "detect", "pool")

# Which rooms each room may import (docs/architecture.md): data flows api -> store -> database
# <- worker -> trainer, and the trainer imports nothing of the service. store reads the spec
# types and the checkpoint format from trainer (one definition of each shared concept).
ALLOWED = {
    "trainer": set(),
    "store": {"trainer"},
    "worker": {"store", "trainer"},
    "api": {"store", "trainer", "worker"},
    "migrations": {"store"},
    "cli": {"api", "store", "worker", "trainer"},
    "bench": {"api", "store", "trainer"},
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported product module
    where: str   # path:line of the import statement


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for room in ROOMS for p in sorted((ROOT / room).rglob("*.py"))}


def _imported_names(module: str, path: Path, tree: ast.AST) -> list[tuple[str, int]]:
    """(dotted name, line) of every import in the file; `from a import b` gives `a.b` (b may
    be a module or a name in a)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, `level - 1` packages up
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names += [(f"{origin}.{alias.name}", node.lineno) for alias in node.names]
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The product module `name` refers to: itself, or its longest prefix that is a module."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    modules = _modules()
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, line in _imported_names(module, path, tree):
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.append(Import(module, target, f"{path.relative_to(ROOT)}:{line}"))
    return found


def _graph(imports: list[Import], node: Callable[[str], str | None]) -> dict[str, dict[str, Import]]:
    """Collapse modules to nodes (None: not in this graph); node -> node -> one import making it."""
    graph: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in imports:
        a, b = node(imp.source), node(imp.target)
        if a is not None and b is not None and a != b:
            graph[a].setdefault(b, imp)
    return graph


def find_cycle(graph: dict[str, dict[str, Import]]) -> list[str] | None:
    """One cycle as [n0, n1, ..., n0], or None (iterative DFS, colours white/grey/black)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, {}))))
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, Import]]) -> str:
    edges = [f"  {a} -> {b}  ({graph[a][b].where}: {graph[a][b].source} imports {graph[a][b].target})"
             for a, b in zip(cycle, cycle[1:])]
    return "import cycle " + " -> ".join(cycle) + ":\n" + "\n".join(edges)


def room_of(module: str) -> str:
    return module.split(".")[0]


def trainer_node(module: str) -> str | None:
    """trainer/<package>/... -> `trainer.<package>`; trainer/<module>.py -> `trainer.<module>`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "trainer" and len(parts) > 1 else None


def test_find_cycle_finds_one_and_names_it():
    imp = Import("a", "b", "a.py:1")
    graph = {"a": {"b": imp}, "b": {"c": imp}, "c": {"a": imp, "d": imp}, "d": {}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": imp}, "b": {"c": imp}, "c": {}}) is None
    assert trainer_node("trainer.engines.hf_engine") == "trainer.engines"
    assert trainer_node("trainer.spec") == "trainer.spec" and trainer_node("trainer") is None


def test_lazy_imports_count(tmp_path):
    tree = ast.parse("def f():\n    from trainer.models import lora\n    import trainer.spec\n")
    names = _imported_names("trainer.engines.x", tmp_path / "x.py", tree)
    assert names == [("trainer.models.lora", 2), ("trainer.spec", 3)]
    rel = ast.parse("from . import base\nfrom ..models.lora import ADAPTER\n")
    assert [n for n, _ in _imported_names("trainer.engines.x", tmp_path / "x.py", rel)] == [
        "trainer.engines.base", "trainer.models.lora.ADAPTER"]


def test_the_rooms_have_no_cycle_and_import_only_downstream(imports):
    graph = _graph(imports, room_of)
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph)
    wrong = [f"{a} -> {b} ({imp.where})" for a, targets in graph.items() for b, imp in targets.items()
             if b not in ALLOWED[a]]
    assert not wrong, "imports against the rooms' direction: " + "; ".join(wrong)


def test_the_api_reaches_the_worker_only_through_the_celery_app(imports):
    # The API enqueues by task name; the worker's runner, torch and the trainer's internals
    # stay out of its process (tests/worker/test_celery_app.py checks the same at run time).
    wrong = [f"{i.source} imports {i.target} ({i.where})" for i in imports
             if room_of(i.source) == "api" and room_of(i.target) == "worker"
             and i.target != "worker.celery_app"]
    assert not wrong, wrong


def test_the_trainers_rooms_have_no_cycle(imports):
    graph = _graph(imports, trainer_node)
    assert "trainer.engines" in graph and "trainer.models" in graph  # the graph is really built
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph)


@pytest.mark.parametrize("package", TRAINER_PACKAGES)
def test_a_trainer_packages_modules_have_no_cycle(imports, package):
    prefix = f"trainer.{package}."
    graph = _graph(imports, lambda m: m if m.startswith(prefix) else None)
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph)


def test_the_sandbox_modules_import_one_way(imports):
    rank = {f"trainer.graders.sandbox.{name}": i for i, name in enumerate(SANDBOX_ORDER)}
    assert "graders" in TRAINER_PACKAGES and set(rank) - {"trainer.graders.sandbox.layer"} <= {
        i.source for i in imports}  # the modules are really in the graph
    wrong = [f"{i.source} imports {i.target} ({i.where})" for i in imports
             if i.source in rank and i.target in rank and rank[i.target] > rank[i.source]]
    assert not wrong, "the sandbox imports against layer <- process <- detect <- pool: " + \
        "; ".join(wrong)


@pytest.mark.parametrize("room", ["api", "store", "worker", "cli"])
def test_a_rooms_modules_have_no_cycle(imports, room):
    graph = _graph(imports, lambda m: m if room_of(m) == room else None)
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph)
