"""`brorl chat` against a stand-in service: it prints the streamed text as it comes and sends
what the options say; a refusal is one red line naming the parameter, exit 1. `brorl worker
--inference` starts an inference server beside the Celery worker. (The real service:
tests/e2e/test_chat_e2e.py.)"""
from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from typer.testing import CliRunner

from cli import server
from cli.main import app
from tests.api.test_completions import _serve


def _service(seen: list[dict]) -> FastAPI:
    service = FastAPI()

    @service.post("/v1/{kind:path}")
    async def complete(kind: str, request: Request):
        body = await request.json()
        seen.append({"path": kind, "auth": request.headers.get("authorization"), **body})
        if body["model"] == "job_other":
            return JSONResponse({"error": {"message": "The model `job_other` does not exist",
                                           "type": "invalid_request_error", "param": "model",
                                           "code": "model_not_found"}}, status_code=404)
        chunks = [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in ("4", "2")]
        if kind == "completions":
            chunks = [{"choices": [{"index": 0, "text": t}]} for t in ("4", "2")]
        lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
        return StreamingResponse(iter(lines), media_type="text/event-stream")
    return service


@pytest.fixture
def service(monkeypatch) -> tuple[list[dict], str]:
    seen: list[dict] = []
    servers = _serve(_service(seen))
    url = next(servers)
    monkeypatch.setenv("BRORL_URL", url)
    monkeypatch.setenv("BRORL_API_KEY", "brorl_test")
    yield seen, url
    next(servers, None)


def test_chat_streams_the_answer_and_sends_the_options(service) -> None:
    seen, _ = service
    result = CliRunner().invoke(app, ["chat", "job_x:4", "6 x 7?", "--system", "be brief",
                                      "--max-tokens", "9", "--temperature", "0", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert result.output == "42\n"
    (sent,) = seen
    assert sent["path"] == "chat/completions" and sent["auth"] == "Bearer brorl_test"
    assert sent["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "6 x 7?"}]
    assert (sent["model"], sent["max_tokens"], sent["temperature"], sent["seed"], sent["stream"]) \
        == ("job_x:4", 9, 0.0, 3, True)
    done = CliRunner().invoke(app, ["chat", "job_x", "6 x 7 =", "--completion"])
    assert done.output == "42\n" and seen[-1]["path"] == "completions" and seen[-1]["prompt"] == "6 x 7 ="


def test_chat_names_a_refusal_and_exits_1(service) -> None:
    result = CliRunner().invoke(app, ["chat", "job_other", "hi"])
    assert result.exit_code == 1
    assert "404: The model `job_other` does not exist (model)" in result.output


def test_worker_inference_starts_a_server_beside_the_celery_worker(data_dir, monkeypatch) -> None:
    spawned: list[list[str]] = []
    monkeypatch.setattr(server, "_spawn", lambda argv, **_: spawned.append(argv))
    from worker.celery_app import app as celery_app

    monkeypatch.setattr(celery_app, "worker_main", lambda argv: None)
    assert CliRunner().invoke(app, ["worker", "--inference"]).exit_code == 0
    assert spawned == [server.INFERENCE_SERVER]
    assert CliRunner().invoke(app, ["worker"]).exit_code == 0
    assert len(spawned) == 1
