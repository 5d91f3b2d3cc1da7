"""/v1/chat/completions and /v1/completions in the API process: parameters honoured or refused by
name, the model resolved among the tenant's checkpoints only, an unreachable inference server
named, the per-tenant cap on generations at once and the daily token quota (with a stand-in inference server; the
real one, with the openai SDK, is tests/e2e/test_chat_e2e.py)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select

from api.app import create_app
from api.openai import sampling
from api.openai.errors import OpenAIError
from store.completion_usage import CompletionUsage
from store.db import session_scope
from store.settings import Settings
from store.tables import Checkpoint
from tests.api.helpers import make_spec

CHAT = [{"role": "user", "content": "hi"}]


def _refused(body: dict, chat: bool = True) -> str | None:
    try:
        sampling.parse({"model": "j", **body}, Settings(inference_max_tokens=100), chat)
    except OpenAIError as exc:
        assert exc.status_code == 400
        return exc.param
    return None


def test_each_parameter_is_honoured_or_refused_by_name() -> None:
    parsed = sampling.parse({"model": "j", "temperature": 0, "top_p": 0.5, "n": 2, "stop": "x",
                             "seed": 3, "stream": True, "stream_options": {"include_usage": True},
                             "user": "u", "logprobs": False}, Settings(), chat=True)
    assert parsed.sampling == {"max_tokens": 256, "temperature": 0.0, "top_p": 0.5, "n": 2,
                               "stop": ["x"], "seed": 3}
    assert parsed.stream and parsed.include_usage
    assert sampling.parse({"model": "j"}, Settings(), chat=False).sampling["max_tokens"] == 16
    assert _refused({"max_completion_tokens": 7}) is None
    for body, param in (({"max_tokens": 101}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"),
                        ({"max_completion_tokens": 500}, "max_completion_tokens"),
                        ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                        ({"temperature": float("nan")}, "temperature"),
                        ({"n": True}, "n"), ({"n": 5}, "n"), ({"stop": ["a"] * 5}, "stop"),
                        ({"stop": [""]}, "stop"), ({"seed": "1"}, "seed"),
                        ({"logprobs": True}, "logprobs"), ({"tools": [{"type": "function"}]}, "tools"),
                        ({"frequency_penalty": 0.5}, "frequency_penalty"),
                        ({"stream_options": {"include_usage": True}}, "stream_options"),
                        ({"temprature": 1}, "temprature"), ({"model": ""}, "model")):
        assert _refused(body) == param, body
    assert _refused({"messages": CHAT}, chat=False) == "messages"  # a chat field on completions


def _checkpoint(settings: Settings, job_id: str, step: int) -> None:
    with session_scope(settings.database_url) as s:
        s.add(Checkpoint(job_id=job_id, step=step, uri=str(settings.artifact_dir / f"step-{step:08d}"),
                         bytes=1, sha256="0" * 64))


def test_models_resolve_among_the_tenants_checkpoints_only(client, settings, auth, other_auth) -> None:
    settings.inference_urls = f"http://127.0.0.1:{_free_port()}"  # nobody listens there
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]

    def chat(model: str, headers: dict) -> httpx.Response:
        return client.post("/v1/chat/completions", json={"model": model, "messages": CHAT}, headers=headers)

    empty = chat(job_id, auth)
    assert empty.status_code == 404 and "has no checkpoint yet" in empty.json()["error"]["message"]
    _checkpoint(settings, job_id, 2)
    _checkpoint(settings, job_id, 4)
    for model in (job_id, f"{job_id}:2", f"ft:{job_id}:step-4"):
        answer = chat(model, auth)  # resolved: it gets as far as the (absent) inference server
        assert answer.status_code == 503, answer.text
        assert settings.inference_urls in answer.json()["error"]["message"]
        other = chat(model, other_auth)
        assert other.status_code == 404, other.text
        assert other.json()["error"]["code"] == "model_not_found"
        assert other.json()["error"]["param"] == "model"
    for model in (f"{job_id}:3", "job_nope", "a:b:c"):
        assert chat(model, auth).status_code == 404
    bad = client.post("/v1/completions", json={"model": job_id, "prompt": ["a", "b"]}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(app) -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _slow_inference(release: threading.Event) -> FastAPI:
    """Streams one piece, then waits for `release` before the last one."""
    app = FastAPI()

    @app.post("/generate")
    async def generate(body: dict) -> StreamingResponse:
        async def lines():
            yield json.dumps({"index": 0, "text": "he", "finish_reason": None,
                              "prompt_tokens": 0, "completion_tokens": 0}) + "\n"
            while not release.is_set():
                await asyncio.sleep(0.02)
            yield json.dumps({"index": 0, "text": "", "finish_reason": "stop",
                              "prompt_tokens": 2, "completion_tokens": 1}) + "\n"
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    return app


@pytest.fixture
def slow_stack(settings: Settings, enqueued, key) -> Iterator[tuple[str, dict, threading.Event]]:
    release = threading.Event()
    servers = _serve(_slow_inference(release))
    inference = next(servers)
    api_settings = settings.model_copy(update={"inference_urls": inference, "max_generations_per_tenant": 1})
    apis = _serve(create_app(api_settings, enqueue=enqueued))
    url = next(apis)
    yield url, {"Authorization": f"Bearer {key}"}, release
    release.set()
    for gen in (apis, servers):
        next(gen, None)


def test_a_tenant_has_at_most_its_generations_at_once(slow_stack, settings) -> None:
    url, auth, release = slow_stack
    with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
        job_id = http.post("/v1/jobs", json=make_spec()).json()["id"]
        _checkpoint(settings, job_id, 1)
        body = {"model": job_id, "messages": CHAT, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as first:
            lines = first.iter_lines()
            assert '"role": "assistant"' in next(line for line in lines if line)
            assert '"content": "he"' in next(line for line in lines if line)  # before the end
            second = http.post("/v1/chat/completions", json={**body, "stream": False})
            assert second.status_code == 429, second.text
            assert "generations in progress" in second.json()["error"]["message"]
            release.set()
            assert [line for line in lines if line][-1] == "data: [DONE]"
        release.clear()  # the stand-in holds its last piece again
        with http.stream("POST", "/v1/chat/completions", json=body) as hung_up:
            assert hung_up.status_code == 200
        # That client hung up mid-answer: its slot comes back although the answer never ended.
        deadline = time.monotonic() + 10
        while True:
            with http.stream("POST", "/v1/chat/completions", json=body) as again:
                if again.status_code == 200:
                    break
                assert again.status_code == 429 and time.monotonic() < deadline
            time.sleep(0.1)
        release.set()
        done = http.post("/v1/chat/completions", json={**body, "stream": False})
        assert done.status_code == 200, done.text
        answer = done.json()
        assert answer["choices"][0]["message"]["content"] == "he"
        assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}


def test_a_tenant_over_its_daily_completion_tokens_is_refused(client, settings, auth, other_auth) -> None:
    """Each call of the stand-in uses 2 + 1 tokens; at 5 a day the third call is refused before
    it generates (the second, streamed, crossed the line and finished), another tenant is not,
    and a call that leaves the 24-hour window frees its tokens. Counted in the database."""
    release = threading.Event()
    release.set()  # the stand-in answers at once
    servers = _serve(_slow_inference(release))
    settings.inference_urls = next(servers)
    settings.completion_tokens_per_day = 5
    try:
        jobs_of = {}
        for name, headers in (("mine", auth), ("other", other_auth)):
            jobs_of[name] = client.post("/v1/jobs", json=make_spec(), headers=headers).json()["id"]
            _checkpoint(settings, jobs_of[name], 1)

        def call(who: str, headers: dict, stream: bool = False) -> httpx.Response:
            return client.post("/v1/chat/completions", headers=headers, json={
                "model": jobs_of[who], "messages": CHAT, "stream": stream})

        assert call("mine", auth).status_code == 200
        streamed = call("mine", auth, stream=True)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        refused = call("mine", auth)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded" and error["type"] == "rate_limit_error"
        assert "at most 5 completion tokens" in error["message"] and "6 used" in error["message"]
        assert call("mine", auth, stream=True).status_code == 429  # refused before a stream starts
        assert call("other", other_auth).status_code == 200  # another tenant's count is its own
        with session_scope(settings.database_url) as s:
            oldest = s.scalars(select(CompletionUsage).order_by(CompletionUsage.id)).first()
            oldest.created_at -= timedelta(days=1)  # a day on, the first call no longer counts
        assert call("mine", auth).status_code == 200
        with session_scope(settings.database_url) as s:
            assert s.scalar(select(func.count()).select_from(CompletionUsage)) == 3  # the old row pruned
    finally:
        next(servers, None)
