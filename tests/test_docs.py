"""The documentation tells the truth about the code: the generated spec reference is current,
every job spec field and every BRORL_* setting is documented, links resolve, and nothing
cites a file this repository does not have."""
import re
import subprocess
from pathlib import Path

import pytest

from cli.spec_doc import REGENERATE, spec_markdown
from trainer.spec import json_schema

REPO = Path(__file__).resolve().parents[1]


def test_committed_jobspec_reference_is_current():
    committed = (REPO / "docs" / "jobspec.md").read_text()
    assert committed == spec_markdown(), f"docs/jobspec.md is stale: run `make docs` or `{REGENERATE}`"


def test_reference_walks_nested_objects_with_their_defaults_and_bounds():
    text = spec_markdown()
    for section in ("model", "task.reasoning_gym", "task.dataset", "rollout.schedule[]", "rollout.broaden",
                    "optim", "algo", "eval", "checkpoint", "limits", "resources"):
        assert f"## `{section}`" in text, section
    # a default made by a factory (not in pydantic's schema), bounds, required fields, enums
    schedule = '[{"n": 16, "prompts_per_step": 64, "steps": 200}, {"n": 512, "prompts_per_step": 16, "steps": 100}]'
    assert f"`{schedule}`" in text
    assert "| `n` | int | **required** | 2 .. 4096 |" in text
    assert "| `temperature` | number | `1.0` | > 0, ≤ 2 |" in text
    assert '`"reinforce_pp_baseline"`, `"grpo"`' in text


def test_every_job_spec_field_has_a_description():
    schema = json_schema()
    objects = {"JobSpec": schema, **schema["$defs"]}
    missing = [f"{name}.{field}" for name, obj in objects.items()
               for field, node in obj.get("properties", {}).items() if not node.get("description")]
    assert not missing, f"give these fields a description= in trainer/spec.py: {missing}"


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def variables_the_code_reads() -> set[str]:
    from store.settings import Settings

    names = {f"BRORL_{field.upper()}" for field in Settings.model_fields}
    for path in tracked_files():
        top = path.relative_to(REPO).parts[0]
        if top in {"api", "cli", "store", "trainer", "worker"} and path.suffix == ".py" or \
                path.name == "docker-compose.yml":
            names |= set(re.findall(r"\bBRORL_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return names


def test_every_brorl_variable_is_in_the_configuration_reference():
    table = (REPO / "docs" / "configuration.md").read_text()
    missing = sorted(v for v in variables_the_code_reads() if f"`{v}`" not in table)
    assert not missing, f"add these to docs/configuration.md: {missing}"


FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of `markdown` (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", markdown).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
    anchors = set()
    for slug, count in seen.items():
        anchors |= {slug, *(f"{slug}-{i}" for i in range(1, count))}
    return anchors


def test_links_in_the_docs_resolve():
    broken = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = FENCE.sub("", doc.read_text())
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


# Design notes that lived outside this repository; facts from them are stated where they are
# used, or in docs/ (the paper's rules: docs/algorithm.md).
OUTSIDE = re.compile(r"\b(PAPER|JOBSPEC|ARCHITECTURE|ENVIRONMENT|GRADERS)\.md\b|(?<![\w/.])shared/")
# Readers do not know the tracker's numbers: say what a thing does, not which ticket made it.
TICKET = re.compile(r"\bissues? ?#?[0-9]+", re.I)
TEXT = {".py", ".md", ".yaml", ".yml", ".html", ".js", ".toml", ".txt", ".cfg", ".ini", ".sh"}


def test_no_file_cites_notes_outside_the_repository_or_issue_numbers():
    hits = []
    for path in tracked_files():
        if path.suffix not in TEXT and path.name not in {"Makefile", "Dockerfile"} or "vendor" in path.parts:
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if path.name != "test_docs.py" and (OUTSIDE.search(line) or TICKET.search(line)):
                hits.append(f"{path.relative_to(REPO)}:{no}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)
