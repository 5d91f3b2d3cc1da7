"""Every file path and dotted Python name that the docs (docs/*.md, README.md) or the product
code's docstrings, comments and messages cite still exists: a rename that leaves a citation
behind fails here, naming the citation and where it is.

A citation is a path with a folder and a file suffix (`store/jobs.py`, docs/hardening.md), a
folder in backticks (`tests/support/`), a bare file name in backticks (`server.py`: some
file of that name exists), a dotted name under one of this repository's packages
(`trainer.tasks.isolated.check_config`, `cli.main:app`), or a test in backticks
(`test_runner.py::test_x`, `test_x`: a test, or a product function, of that name exists).
Paths resolve against the repository root, the citing file's folder or any folder above it.
A dotted name resolves when its longest module prefix is a module here and the rest are
attributes, read from the module's source (assignments, definitions, imports, class bodies)
and, failing that, by importing it.
"""
from __future__ import annotations

import ast
import functools
import importlib
import io
import os
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "store", "worker", "trainer", "cli", "bench", "migrations", "tests")
CODE_ROOTS = ("api", "store", "worker", "trainer", "cli", "bench", "migrations")
SKIP_DIRS = {".git", ".venv", "__pycache__", "node_modules", "vendor", "brorl.egg-info"}
SUFFIXES = ("py", "md", "yaml", "yml", "json", "jsonl", "toml", "ini", "txt", "html", "js",
            "css", "sh", "cfg", "mako", "png", "svg", "csv", "safetensors", "log", "db")

# Citations that name no file of this repository, by how they start, each with the reason.
NOT_OURS: dict[str, str] = {
    "bench/out/": "the benchmarks' output folder: git-ignored, written when a benchmark runs",
    "trainer_state/": "a folder inside each checkpoint of a job's artifacts",
    "runs/": "the git-ignored folder the docs' example commands write their output to",
    "OUT/": "`brorl train`'s output folder, named by the user on the command line",
    "vllm/": "vLLM's own source tree (an installed package)",
    ".venv/": "the virtual environment `make install` creates",
    "worker.reload_weights": "a method of vLLM's worker object (trainer/engines/vllm_engine.py)",
}

# A path with at least one folder and a known suffix, not inside a URL or an absolute path.
PATH = re.compile(r"(?<![\w./~:@$<{-])((?:[\w.-]+/)+[\w.-]+\.(?:%s))(?![\w/])" % "|".join(SUFFIXES))
# A dotted name under one of our packages (module:attribute allowed, as entry points write it).
DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?)(?![\w/-])"
                    % "|".join(PACKAGES))
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[<>{}*$~\[\]]|\.\.\.")
TEST_DEF = re.compile(r"^\s*(?:async )?def (test_\w+)", re.M)
TEST_SPAN = re.compile(r"(?:[\w-]+\.py::)?(test_\w+)")


def repo_files() -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        found += [Path(root) / f for f in files]
    return found


@functools.lru_cache(maxsize=1)
def file_names() -> frozenset[str]:
    return frozenset(p.name for p in repo_files())


# ------------------------------------------------------------------- where citations are


def doc_texts() -> list[tuple[Path, int, str]]:
    """(file, line, text) of every line of the docs, fenced commands and examples included."""
    out = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        out += [(doc, no, line) for no, line in enumerate(doc.read_text().splitlines(), 1)]
    return out


def code_texts() -> list[tuple[Path, int, str]]:
    """(file, line, text) of every comment and string line (docstrings, messages) of the
    product code."""
    out = []
    for root in CODE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if SKIP_DIRS & set(path.relative_to(REPO).parts):
                continue
            source = path.read_text()
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.COMMENT:
                    out.append((path, tok.start[0], tok.string))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for k, line in enumerate(node.value.splitlines()):
                        out.append((path, node.lineno + k, line))
    return out


@functools.lru_cache(maxsize=1)
def defined_tests() -> frozenset[str]:
    """Every `def test_...` here: the tests, and product functions so named (a client's
    `test_webhook`)."""
    names: set[str] = set()
    for root in ("tests", *CODE_ROOTS):
        for path in (REPO / root).rglob("*.py"):
            names |= set(TEST_DEF.findall(path.read_text()))
    return frozenset(names)


def citations(text: str) -> set[str]:
    """The paths and dotted names one line cites."""
    cited = set(PATH.findall(text)) | set(DOTTED.findall(text))
    for span in CODE_SPAN.findall(text):
        span = span.strip()
        if PLACEHOLDER.search(span) or " " in span:
            continue
        if span.endswith("/") and "/" in span[:-1] and not span.startswith(("/", ".")) \
                and "://" not in span:
            cited.add(span)  # a folder
        elif re.fullmatch(r"[\w-]+\.py", span):
            cited.add(span)  # a bare module file name
        elif test := TEST_SPAN.fullmatch(span):
            cited.add(test.group(1))  # a test, by name
    return {c for c in cited if not PLACEHOLDER.search(c)}


# ------------------------------------------------------------------- does it resolve


def path_resolves(cited: str, where: Path) -> bool:
    if "/" not in cited:
        return cited in file_names()
    folder = where.parent
    while True:
        if (folder / cited).exists():
            return True
        if folder == REPO or REPO not in folder.parents:
            return False
        folder = folder.parent


def module_file(dotted: str) -> Path | None:
    base = REPO / dotted.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def names_in(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds, at any depth of if/try blocks."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names[n.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            inner = node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                inner += handler.body
            names.update(names_in(inner))
    return names


def attributes_resolve(module: Path, dotted_module: str, attrs: list[str]) -> bool:
    """From the source (definitions, assignments, imports, class bodies, submodules of a
    package); by importing where the source alone cannot tell (inherited attributes, names
    made at run time)."""
    scope: list[ast.stmt] | None = parsed(module).body
    walked: list[str] = []  # attributes of dotted_module found so far
    for i, attr in enumerate(attrs):
        node = names_in(scope).get(attr) if scope is not None else None
        if node is not None:
            scope = node.body if isinstance(node, ast.ClassDef) else None
            walked.append(attr)
            continue
        sub = module_file(f"{dotted_module}.{attr}") if not walked else None
        if sub is None:
            return imports_with(dotted_module, walked + attrs[i:])
        module, dotted_module, scope = sub, f"{dotted_module}.{attr}", parsed(sub).body
    return True


def imports_with(dotted_module: str, attrs: list[str]) -> bool:
    try:
        obj = importlib.import_module(dotted_module)
    except Exception:  # a module that does not import does not resolve
        return False
    for attr in attrs:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def name_resolves(cited: str) -> bool:
    if re.search(r"\.(%s)$" % "|".join(SUFFIXES), cited) and module_file(cited.rsplit(".", 1)[0]):
        return True  # `trainer.loop.py`-style: the file
    module_part, _, entry = cited.partition(":")
    parts = module_part.split(".")
    for cut in range(len(parts), 0, -1):
        dotted = ".".join(parts[:cut])
        module = module_file(dotted)
        if module is not None:
            attrs = parts[cut:] + ([entry] if entry else [])
            return attributes_resolve(module, dotted, attrs) if attrs else True
    return False


def stale_citations() -> list[str]:
    stale = []
    for path, line, text in doc_texts() + code_texts():
        for cited in sorted(citations(text)):
            if not resolves(cited, path):
                stale.append(f"{path.relative_to(REPO)}:{line}: {cited}")
    return stale


def resolves(cited: str, where: Path) -> bool:
    if cited.startswith(tuple(NOT_OURS)):
        return True
    if cited.startswith("test_") and "." not in cited:
        return cited in defined_tests()
    if "/" in cited or re.fullmatch(r"[\w-]+\.py", cited):
        return path_resolves(cited, where)
    return name_resolves(cited)


def test_every_cited_path_and_name_exists():
    stale = stale_citations()
    assert not stale, "stale citations (rename them, or say in NOT_OURS why one is not ours):\n" \
        + "\n".join(stale)


def test_citations_are_found_in_prose_and_code_spans():
    line = ("see store/jobs.py, `tests/support/`, `server.py`, `trainer.spec.JobSpec` and "
            "cli.main:app, `test_docs.py::test_links_in_the_docs_resolve`; not "
            "https://example.com/a/b.py, `runs/<id>/x.json`, `postgres://` or `torch.nn.Module`.")
    assert citations(line) == {"store/jobs.py", "tests/support/", "server.py",
                               "trainer.spec.JobSpec", "cli.main:app",
                               "test_links_in_the_docs_resolve"}


def test_a_stale_citation_does_not_resolve():
    here = REPO / "docs" / "api.md"
    for good in ("store/jobs.py", "tests/support/", "layer.py", "trainer.spec.JobSpec",
                 "trainer.spec.JobSpec.model_fields", "store.tables.Job", "cli.main:app",
                 "trainer.graders.sandbox.detect.sandbox_layer", "img/", "bench/out/x.json",
                 "test_links_in_the_docs_resolve", "trainer.graders.sandbox_layer",
                 "store.tables.Job.status", "trainer.spec.JobSpec.model_validate"):
        assert resolves(good, here), good
    for stale in ("store/models.py", "runner_gone.py", "trainer.spec.NoSuchSpec",
                  "trainer.step.update", "api.task_probe", "cli.main:no_app", "docs/nothing/",
                 "test_no_such_test", "trainer.graders.no_such_name", "store.tables.Job.no_column"):
        assert not resolves(stale, here), stale
