"""The worker's inference server: generation on checkpoints, for the API to proxy to.

`brorl up` starts one beside its worker; `brorl worker --inference` starts one beside a
Celery worker; `python -m worker.inference_server` runs one alone. It is a separate process
from the Celery worker on purpose: a training task holds its worker for hours, and a chat must
not wait behind it (docs/inference.md argues the design).

One route, `POST /generate`, bearer token `store.inference.inference_token`:
    {"checkpoint": "<folder under the artifact dir>", "prompt": "..." | "messages": [...],
     "sampling": {"max_tokens", "temperature", "top_p", "n", "stop", "seed"}}
answers NDJSON, one line per piece of text as it is decoded (`trainer.serving.Piece`), or
`{"error", "status"}` (as the answer's status before any text, as a last line after some).
The API has checked the tenant and the parameters; this server checks only the token and
that the folder is a checkpoint inside the artifact dir.
"""
from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from store.inference import inference_token
from store.settings import Settings, get_settings
from trainer.checkpoints import format as ckpt_format
from trainer.serving import ModelCache, Sampling, ServingError, generate, pick_backend, render_prompt

log = logging.getLogger(__name__)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def checkpoint_in(settings: Settings, name: str) -> Path:
    """The checkpoint folder a request names, if it is one inside the artifact dir."""
    root = Path(settings.artifact_dir).resolve()
    folder = Path(name).resolve()
    if not folder.is_relative_to(root) or ckpt_format.step_of(folder) is None:
        raise ServingError(f"{name} is not a checkpoint folder under the artifact dir", 403)
    if not folder.is_dir():
        raise ServingError(f"checkpoint {folder.name} no longer exists (rotated away?)", 410)
    return folder


def _sampling(raw: dict[str, Any]) -> Sampling:
    stop = raw.get("stop") or ()
    return Sampling(max_tokens=int(raw.get("max_tokens", 16)),
                    temperature=float(raw.get("temperature", 1.0)),
                    top_p=float(raw.get("top_p", 1.0)), n=int(raw.get("n", 1)),
                    stop=tuple([stop] if isinstance(stop, str) else stop), seed=raw.get("seed"))


def _lines(pieces: Iterator[Any]) -> Iterator[bytes]:
    try:
        for piece in pieces:
            yield (json.dumps(asdict(piece)) + "\n").encode()
    except ServingError as exc:
        yield (json.dumps({"error": str(exc), "status": exc.status}) + "\n").encode()
    except Exception as exc:  # noqa: BLE001 - the stream is already open: say it in-band
        log.exception("generation failed")
        yield (json.dumps({"error": f"generation failed: {exc}", "status": 500}) + "\n").encode()


def create_server(settings: Settings | None = None, cache: ModelCache | None = None) -> FastAPI:
    settings = settings or get_settings()
    token = inference_token(settings)
    if cache is None:
        backend = pick_backend(settings.inference_backend)
        cache = ModelCache(settings.inference_cache_models, settings.inference_cache_bytes, backend)
        log.info("inference server: %s backend, up to %d models / %d bytes", backend,
                 cache.max_models, cache.max_bytes)
    app = FastAPI(title="brorl inference server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.cache = cache

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        # No token here, so no folder names (they carry job ids): counts only.
        return {"status": "ok", "backend": cache.backend, "loaded": len(cache)}

    @app.post("/generate")
    def generate_route(request: Request, body: dict[str, Any]) -> Any:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return _error(401, "a valid inference token is required")
        try:
            loaded = cache.get(checkpoint_in(settings, str(body.get("checkpoint", ""))))
            prompt = render_prompt(loaded.tokenizer, body.get("messages"), body.get("prompt"))
            pieces = generate(loaded, prompt, _sampling(body.get("sampling") or {}))
            first = next(pieces)  # load and tokenize errors become the answer's status
        except ServingError as exc:
            return _error(exc.status, str(exc))
        except (OSError, ValueError) as exc:
            log.exception("inference: cannot serve %s", body.get("checkpoint"))
            return _error(500, f"cannot load or run the checkpoint: {exc}")

        def stream() -> Iterator[Any]:
            yield first
            yield from pieces
        return StreamingResponse(_lines(stream()), media_type="application/x-ndjson")

    return app


def serve(settings: Settings | None = None) -> None:
    import uvicorn

    settings = settings or get_settings()
    uvicorn.run(create_server(settings), host=settings.inference_host, port=settings.inference_port,
                log_level="info")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    serve()
