"""The shipped examples work: every grader under examples/graders/ validates, and every
problem of examples/data/code_problems.jsonl scores 1 with its reference solution and 0
with an empty program, through the real sandbox."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.graders import GraderRuntime, validate_grader
from trainer.tasks.dataset_task import count_valid_rows
from tests.support.services import bubblewrap_missing, needs_service

ROOT = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize("path", sorted((ROOT / "graders").glob("*.json")), ids=lambda p: p.name)
def test_example_graders_validate(path, monkeypatch):
    # The judge examples name a judge an operator would configure.
    monkeypatch.setenv("BRORL_JUDGES", '{"judge-small": {"base_url": "http://127.0.0.1:9/v1"}}')
    grader = validate_grader(json.loads(path.read_text()))
    assert grader.type == path.stem


@needs_service("bubblewrap", bubblewrap_missing())
@pytest.mark.timeout(120)
def test_code_dataset_reference_solutions_pass():
    path = ROOT / "data" / "code_problems.jsonl"
    rows = [json.loads(line) for line in path.open()]
    assert len(rows) >= 30
    with path.open("rb") as fh:  # it uploads as a dataset as it is
        assert count_valid_rows(fh, 1 << 20) == len(rows)
    answers = [f"```python\n{row['answer']}```" for row in rows]
    grader = json.loads((ROOT / "graders" / "code.json").read_text())
    with GraderRuntime() as runtime:
        good = runtime.grade(grader, answers, rows)
        empty = runtime.grade(grader, ["```python\npass\n```"] * len(rows), rows)
    assert [r.reward for r in good] == [1.0] * len(rows), [r.details for r in good]
    assert [r.reward for r in empty] == [0.0] * len(rows)


def test_the_code_job_example_validates_with_its_grader():
    from trainer.spec import load_spec
    from trainer.graders.dataset_check import check_rows_for

    spec = load_spec(Path(__file__).parents[3] / "examples" / "graders" / "code_spec.yaml")
    assert spec.task.grader["type"] == "code"
    data = Path(__file__).parents[3] / "examples" / "data" / "code_problems.jsonl"
    with open(data, "rb") as fh:
        check_rows_for(fh, spec.task, 1 << 20)  # every row has the `tests` the grader reads
