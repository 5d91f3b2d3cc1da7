"""`brorl chat JOB_ID[:STEP] "prompt"`: talk to a checkpoint of one of your jobs.

The answer streams to stdout as the worker decodes it, through the service's OpenAI-compatible
`/v1/chat/completions` (or `/v1/completions` with --completion: the prompt continued as it is,
no chat turn). The model is a job id (its newest checkpoint), `JOB_ID:STEP`, or the
`ft:JOB_ID:step-N` name the OpenAI fine-tuning surface hands out (docs/inference.md).
"""
from __future__ import annotations

import json
import sys
from typing import Any, Optional

import httpx
import typer

from cli.remote import ClientSettings, err_console, resolve_api_key


def _fail(message: str) -> None:
    err_console.print(f"[red]error: {message}[/red]", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _body(model: str, prompt: str, system: Optional[str], completion: bool, max_tokens: int,
          temperature: float, seed: Optional[int]) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
                            "stream": True}
    if seed is not None:
        body["seed"] = seed
    if completion:
        return "/v1/completions", {**body, "prompt": prompt}
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": prompt}]
    return "/v1/chat/completions", {**body, "messages": messages}


def _text(event: dict[str, Any]) -> str:
    choice = (event.get("choices") or [{}])[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def chat(model: str = typer.Argument(..., help="JOB_ID (newest checkpoint), JOB_ID:STEP or ft:JOB_ID:step-N."),
         prompt: str = typer.Argument(..., help="What to say ('-': read it from stdin)."),
         system: Optional[str] = typer.Option(None, "--system", help="A system message first."),
         completion: bool = typer.Option(False, "--completion", help="Continue the prompt as text (no chat turn)."),
         max_tokens: int = typer.Option(256, "--max-tokens", min=1),
         temperature: float = typer.Option(1.0, "--temperature", min=0.0, max=2.0),
         seed: Optional[int] = typer.Option(None, "--seed")) -> None:
    """Talk to a checkpoint of one of your jobs; the answer streams as it is generated."""
    if prompt == "-":
        prompt = sys.stdin.read()
    path, body = _body(model, prompt, system, completion, max_tokens, temperature, seed)
    key = resolve_api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.stream("POST", ClientSettings().url.rstrip("/") + path, json=body,
                          headers=headers, timeout=httpx.Timeout(600, connect=10)) as answer:
            if answer.status_code != 200:
                answer.read()
                try:
                    error = answer.json()["error"]
                    param = f" ({error['param']})" if error.get("param") else ""
                    _fail(f"{answer.status_code}: {error['message']}{param}")
                except (ValueError, KeyError, TypeError):
                    _fail(f"{answer.status_code}: {answer.text[:500]}")
            for line in answer.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    _fail(event["error"].get("message", "generation failed"))
                sys.stdout.write(_text(event))
                sys.stdout.flush()
    except httpx.HTTPError as exc:
        _fail(f"cannot reach the service at {ClientSettings().url}: {exc}")
    sys.stdout.write("\n")


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
