"""`brorl evaluate` against a stand-in service: the request body its options make (checkpoints
comma-separated or repeated, a reasoning-gym task by name and config or as the API's whole task
object, an uploaded dataset), and the options it refuses before sending anything. (The real
service: tests/e2e/test_evaluation_e2e.py.)"""
from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from typer.testing import CliRunner

from cli.main import app
from tests.api.test_completions import _serve


def _service(seen: list[dict]) -> FastAPI:
    service = FastAPI()

    @service.post("/v1/jobs/{job_id}/evaluations")
    async def create(job_id: str, request: Request):
        body = await request.json()
        seen.append({"job": job_id, **body})
        return {"id": "evl_1", "status": "queued", "checkpoints": [3], "base": body.get("base", True)}
    return service


@pytest.fixture
def seen(monkeypatch) -> list[dict]:
    sent: list[dict] = []
    servers = _serve(_service(sent))
    monkeypatch.setenv("BRORL_URL", next(servers))
    monkeypatch.setenv("BRORL_API_KEY", "brorl_test")
    yield sent
    next(servers, None)


def _evaluate(*args: str):
    return CliRunner().invoke(app, ["evaluate", "job_x", "--no-wait", *args])


@pytest.mark.parametrize("args, body", [
    ([], {"checkpoints": ["latest"], "base": True, "seed": 0}),
    (["--checkpoints", "40,latest,best", "--no-base", "--n", "4", "--k", "2"],
     {"checkpoints": [40, "latest", "best"], "base": False, "seed": 0, "n": 4, "k": [2]}),
    (["-c", "3", "-c", "best,3", "--prompts", "5"],
     {"checkpoints": [3, "best"], "base": True, "seed": 0, "prompts": 5}),
    (["--task", "chain_sum", "--task-config", '{"min_terms": 3}'],
     {"checkpoints": ["latest"], "base": True, "seed": 0,
      "task": {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 3}}}}),
    (["--task", '{"reasoning_gym": {"name": "leg_counting", "eval_size": 50}}'],
     {"checkpoints": ["latest"], "base": True, "seed": 0,
      "task": {"reasoning_gym": {"name": "leg_counting", "eval_size": 50}}}),
    (["--dataset", "ds_01ABC", "--checkpoints", "best"],
     {"checkpoints": ["best"], "base": True, "seed": 0, "task": {"dataset": {"id": "ds_01ABC"}}}),
])
def test_the_options_make_the_request_body(seen, args, body) -> None:
    result = _evaluate(*args)
    assert result.exit_code == 0, result.output
    assert seen == [{"job": "job_x", **body}]
    assert "evaluation evl_1 queued" in result.output


@pytest.mark.parametrize("args, named", [
    (["--checkpoints", "latest,newest"], "--checkpoints"),
    (["--checkpoints", "-3"], "--checkpoints"),
    (["--task", "chain_sum", "--dataset", "ds_1"], "--dataset"),
    (["--task-config", '{"a": 1}'], "--task-config"),
    (["--task", "chain_sum", "--task-config", "[1]"], "--task-config"),
    (["--task", "{not json"], "--task"),
])
def test_bad_options_are_refused_before_anything_is_sent(seen, args, named) -> None:
    result = _evaluate(*args)
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert seen == []
