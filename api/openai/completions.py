"""`/v1/chat/completions` and `/v1/completions` on the tenant's checkpoints, in OpenAI's shapes
(streamed as server-sent `chat.completion.chunk` / `text_completion` objects ending with
`data: [DONE]`), proxied to a worker's inference server (worker/inference_server.py).

`model` names a checkpoint: `<job id>` (its newest), `<job id>:<step>`, or the name the
fine-tuning surface hands out, `ft:<job id>:step-<N>` (objects.CHECKPOINT_NAME); the answer's
`model` is always the latter, so a client asking for a job's newest learns which step answered. Another
tenant's job is as unknown as a made-up one: a 404 with OpenAI's `model_not_found`. Each
tenant has at most `max_generations_per_tenant` generations running in this API process (a
429 beyond), on top of the rate limits every /v1 request passes, and, with
`completion_tokens_per_day`, at most that many prompt + completion tokens per rolling 24
hours (store.completion_usage: each finished call's usage, streamed or not, is written to the
database, so the quota holds across API processes; a call is refused before it generates).
This process imports no torch: it resolves the checkpoint, checks the parameters
(sampling.py), and relays text.
"""
from __future__ import annotations

import json
import logging
import re
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from store import completion_usage, jobs
from store.inference import inference_token, server_for
from store.settings import Settings
from store.tables import Checkpoint
from trainer.tasks.messages import MessagesError, parse_messages

from api.deps import SessionDep, SettingsDep, TenantDep
from api.openai import sampling
from api.openai.errors import OpenAIError, OpenAIRoute, bad_request
from api.openai.objects import CHECKPOINT_NAME, checkpoint_name
from api.quotas import StreamSlots, check_completion_quota

log = logging.getLogger(__name__)
router = APIRouter(tags=["openai: completions"], route_class=OpenAIRoute)
_JOB_STEP = r"^(?P<job>[A-Za-z0-9_]{1,40})(:(?P<step>[0-9]{1,9}))?$"


def _unknown(model: str, why: str = "does not exist or you do not have access to it") -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` {why}.", param="model", code="model_not_found")


def resolve_checkpoint(session: Session, tenant_id: int, model: str) -> Checkpoint:
    """The checkpoint `model` names among the tenant's jobs, or a 404."""
    m = CHECKPOINT_NAME.match(model) or re.match(_JOB_STEP, model)
    if m is None:
        raise _unknown(model)
    job_id, step = m.group("job"), m.group("step")
    if jobs.get_job(session, tenant_id, job_id) is None:
        raise _unknown(model)
    if step is not None:
        row = jobs.get_checkpoint(session, tenant_id, job_id, int(step))
        if row is None:
            raise _unknown(model, f"names no checkpoint: job {job_id} has none at step {int(step)}")
        return row
    rows = jobs.list_checkpoints(session, tenant_id, job_id, limit=1, newest_first=True)
    if not rows:
        raise _unknown(model, f"has no checkpoint yet (job {job_id} saved none)")
    return rows[0]


def _slots(request: Request) -> StreamSlots:
    state = request.app.state
    if not hasattr(state, "generation_slots"):
        state.generation_slots = StreamSlots("generations in progress")
    return state.generation_slots


def _accountant(request: Request, tenant_id: int, model: str) -> Callable[[int, int], None]:
    """Writes a call's usage once (the quota's count). Short and synchronous on purpose: it
    runs in a stream's `finally`, where an await could be cancelled with the hung-up client."""
    sessions, done = request.app.state.sessionmaker, False

    def account(prompt_tokens: int, completion_tokens: int) -> None:
        nonlocal done
        if done or prompt_tokens + completion_tokens <= 0:
            return
        done = True
        try:
            with sessions() as s:
                completion_usage.record(s, tenant_id, model, prompt_tokens, completion_tokens)
                s.commit()
        except Exception:  # the answer is sent; a lost count is logged, not raised at the client
            log.exception("completion usage of tenant %s not recorded", tenant_id)

    return account


async def _open(settings: Settings, ckpt: Checkpoint, payload: dict[str, Any]
                ) -> tuple[httpx.AsyncClient, httpx.Response]:
    """The inference server's answer, streaming; its refusal raised in OpenAI's shape."""
    url = server_for(settings, ckpt.uri)
    client = httpx.AsyncClient(timeout=httpx.Timeout(settings.inference_timeout_s, connect=5))
    try:
        answer = await client.send(client.build_request(
            "POST", f"{url}/generate", json={"checkpoint": ckpt.uri, **payload},
            headers={"Authorization": f"Bearer {inference_token(settings)}"}), stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise OpenAIError(503, f"no inference server answered at {url} ({type(exc).__name__}); "
                               "is one running (brorl worker --inference)?", code="unavailable")
    if answer.status_code != 200:
        body = await answer.aread()
        await answer.aclose()
        await client.aclose()
        try:
            message = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            message = body.decode(errors="replace")[:500]
        status = answer.status_code if answer.status_code in (404, 409, 410, 507) else 503
        if answer.status_code == 401:
            message = "the inference server refused the API's token (BRORL_INFERENCE_TOKEN differs)"
        raise OpenAIError(status, f"inference: {message}", param="model" if status < 500 else None)
    return client, answer


async def _pieces(client: httpx.AsyncClient, answer: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    try:
        async for line in answer.aiter_lines():
            if line.strip():
                yield json.loads(line)
    finally:
        await answer.aclose()
        await client.aclose()


class _Shape:
    """OpenAI's objects for one request: a whole answer, or its stream of chunks."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def whole(self, texts: dict[int, list[str]], finish: dict[int, str],
              usage: dict[str, int]) -> dict[str, Any]:
        choices = []
        for i in sorted(texts):
            text = "".join(texts[i])
            body = ({"message": {"role": "assistant", "content": text, "refusal": None}}
                    if self.chat else {"text": text})
            choices.append({"index": i, **body, "finish_reason": finish.get(i), "logprobs": None})
        return {**self._head(self.object), "choices": choices, "usage": usage}

    def chunk(self, index: int, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text else {})
            choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _complete(request: Request, session: Session, settings: Settings, tenant_id: int,
                    body: Any, chat: bool) -> Any:
    req = sampling.parse(body, settings, chat)
    payload: dict[str, Any] = {"sampling": req.sampling}
    if chat:
        try:
            payload["messages"] = parse_messages(body.get("messages"))
        except MessagesError as exc:
            raise bad_request(exc.path, exc.message)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise bad_request("prompt", "must be one non-empty string (token arrays and several "
                                        "prompts per request are not served)")
        payload["prompt"] = prompt
    ckpt = resolve_checkpoint(session, tenant_id, req.model)
    check_completion_quota(session, settings, tenant_id)
    session.close()  # nothing more to read; do not hold a connection while text is generated
    release = _slots(request).acquire(tenant_id, settings.max_generations_per_tenant)
    try:
        client, answer = await _open(settings, ckpt, payload)
    except BaseException:
        release()
        raise
    shape = _Shape(chat, checkpoint_name(ckpt.job_id, ckpt.step))  # which checkpoint answered
    account = _accountant(request, tenant_id, shape.model)
    if req.stream:
        body = _stream(shape, _pieces(client, answer), req, release, account)
        # A client gone before the first byte leaves the stream unstarted, and its `finally`
        # never runs: the slot comes back when the generator is collected.
        weakref.finalize(body, release)
        return StreamingResponse(body,
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    texts: dict[int, list[str]] = {}
    finish: dict[int, str] = {}
    prompt_tokens = completion = 0
    try:
        async for piece in _pieces(client, answer):
            if "error" in piece:
                raise OpenAIError(500, f"inference: {piece['error']}")
            texts.setdefault(piece["index"], []).append(piece["text"])
            if piece["finish_reason"]:
                finish[piece["index"]] = piece["finish_reason"]
                prompt_tokens = piece["prompt_tokens"]
                completion += piece["completion_tokens"]
        return shape.whole(texts, finish, _usage(prompt_tokens, completion))
    finally:
        release()
        account(prompt_tokens, completion)


async def _stream(shape: _Shape, pieces: AsyncIterator[dict[str, Any]], req: sampling.Request,
                  release: Any, account: Callable[[int, int], None]) -> AsyncIterator[bytes]:
    """The answer as server-sent chunks; its usage counted as far as it got (the choices that
    finished: a choice cut off by a client that hung up has no count yet)."""
    started: set[int] = set()
    prompt_tokens = completion = 0
    try:
        async for piece in pieces:
            if "error" in piece:  # the SDK raises APIError on a chunk that carries `error`
                yield _sse({"error": {"message": f"inference: {piece['error']}",
                                      "type": "server_error", "param": None, "code": None}})
                return
            i = piece["index"]
            if shape.chat and i not in started:
                yield _sse(shape.chunk(i, None, None, first=True))
            started.add(i)
            if piece["text"]:
                yield _sse(shape.chunk(i, piece["text"], None))
            if piece["finish_reason"]:
                yield _sse(shape.chunk(i, None, piece["finish_reason"]))
                prompt_tokens = piece["prompt_tokens"]
                completion += piece["completion_tokens"]
        if req.include_usage:
            yield _sse(shape.usage_chunk(_usage(prompt_tokens, completion)))
        yield b"data: [DONE]\n\n"
    finally:
        release()
        account(prompt_tokens, completion)


def _body_schema(chat: bool) -> dict[str, Any]:
    """The request body for /docs (parsed by hand in sampling.py, so a 400 names the field)."""
    number = {"type": "number"}
    props: dict[str, Any] = {
        "model": {"type": "string", "description": "a job id, `<job id>:<step>` or `ft:<job id>:step-<N>`"},
        "max_tokens": {"type": "integer", "minimum": 1}, "temperature": {**number, "minimum": 0, "maximum": 2},
        "top_p": {**number, "exclusiveMinimum": 0, "maximum": 1}, "n": {"type": "integer", "minimum": 1},
        "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
        "seed": {"type": "integer"}, "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    }
    if chat:
        props["max_completion_tokens"] = props["max_tokens"]
        props["messages"] = {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"], "properties": {
                "role": {"enum": ["system", "developer", "user", "assistant"]}, "content": {"type": "string"}}}}
    else:
        props["prompt"] = {"type": "string", "minLength": 1}
    required = ["model", "messages" if chat else "prompt"]
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": required, "properties": props}}}}}


@router.post("/chat/completions", openapi_extra=_body_schema(chat=True))
async def chat_completions(request: Request, session: SessionDep, settings: SettingsDep,
                           tenant: TenantDep) -> Any:
    """Chat with a checkpoint of one of your jobs (OpenAI's chat completions)."""
    return await _complete(request, session, settings, tenant.id, await _json(request), chat=True)


@router.post("/completions", openapi_extra=_body_schema(chat=False))
async def completions(request: Request, session: SessionDep, settings: SettingsDep,
                      tenant: TenantDep) -> Any:
    """Continue a prompt with a checkpoint of one of your jobs (OpenAI's legacy completions)."""
    return await _complete(request, session, settings, tenant.id, await _json(request), chat=False)


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        raise bad_request("body", "is not valid JSON")
