"""One meaning per name: the words that once meant several things in this tree keep one.

- "probe" is the pass@k probe: the weight-sync check, the submission check of a task config,
  the sandbox's self-test, the warm start's hold-out and the health checks are named for what
  they are, so no identifier in their modules says "probe".
- "runner" is the worker's job runner (worker/runner.py); the sandbox's process is its server.
- "models" is the policies (trainer/models/); the tables are store/tables.py, the grader
  schemas trainer/graders/schemas.py.
- "tasks" is RL problem sets (trainer/tasks/); Celery's entry points are worker/entrypoints.py.
- a LoRA adapter is asked about with one name per subject: `has_an_adapter(model)`,
  `holds_an_adapter(folder)`, a job's `_trains_an_adapter`; never `is_lora`.
"""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("api", "store", "worker", "trainer", "cli", "bench", "migrations")
# Modules whose subject is not the pass@k probe: no identifier of theirs says "probe".
NOT_THE_PROBE = ("trainer/engines", "trainer/graders", "trainer/tasks", "trainer/models",
                 "api/task_check.py", "api/routes/health.py")
RETIRED = {"is_lora", "probe_tokens", "probe_runner", "task_probe", "warm_start_probe", "TaskProbe",
           "max_concurrent_task_probes", "task_probe_timeout_s", "task_probe_memory_mb"}


def _files(*roots: str) -> list[Path]:
    out = []
    for root in roots:
        path = REPO / root
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return out


def _identifiers(path: Path) -> set[str]:
    """Every name a module defines, binds or reads (not its strings and comments)."""
    names = set()
    with io.open(path, "rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            if tok.type == tokenize.NAME:
                names.add(tok.string)
    return names


def test_retired_names_are_gone():
    found = {f"{p.relative_to(REPO)}: {n}" for p in _files(*PRODUCT) for n in _identifiers(p) & RETIRED}
    assert not found, sorted(found)


def test_probe_means_the_pass_at_k_probe():
    found = {f"{p.relative_to(REPO)}: {n}" for p in _files(*NOT_THE_PROBE)
             for n in _identifiers(p) if "probe" in n.lower()}
    assert not found, sorted(found)


def test_one_module_per_word():
    names = {p.relative_to(REPO).as_posix() for p in _files(*PRODUCT)}
    assert not [n for n in names if n.endswith("/models.py")], "tables: store/tables.py; schemas: graders/schemas.py"
    assert [n for n in names if "runner" in Path(n).name] == ["worker/runner.py"]
    assert not [n for n in names if n.endswith("/tasks.py")], "Celery's entry points: worker/entrypoints.py"


def test_runner_is_the_workers_job_runner():
    """Outside worker/, no identifier says "runner" (vLLM's own `model_runner` attribute aside)."""
    found = set()
    for p in _files("api", "store", "trainer", "cli"):
        for node in ast.walk(ast.parse(p.read_text())):
            name = getattr(node, "id", None) or getattr(node, "name", None) or getattr(node, "arg", None)
            if isinstance(name, str) and "runner" in name.lower():
                found.add(f"{p.relative_to(REPO)}: {name}")
    assert not found, sorted(found)
