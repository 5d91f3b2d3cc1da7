"""`BrorlClient`: a small synchronous Python client for the BroRL REST API (v1).

Everything the CLI does goes through this class, so scripts can do the same:

    client = BrorlClient("http://127.0.0.1:8000", api_key)
    job = client.submit(yaml.safe_load(open("examples/demo.yaml")))
    for event in client.stream_metrics(job["id"]):
        print(event.data)

Every 4xx/5xx becomes a `BrorlAPIError` built from the API's one error shape
(`{"error": {"type", "message", "field"?}}`).
"""
from __future__ import annotations

import hashlib
import json
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


class BrorlAPIError(Exception):
    """An error answer from the API (or a transport failure, with status 0)."""

    def __init__(self, status: int, type: str, message: str, field: str | None = None):
        self.status, self.type, self.message, self.field = status, type, message, field
        where = f" [field: {field}]" if field else ""
        super().__init__(f"{status} {type}: {message}{where}")

    @classmethod
    def from_response(cls, response: httpx.Response) -> "BrorlAPIError":
        try:
            err = response.json()["error"]
            return cls(response.status_code, err.get("type", "error"),
                       err.get("message", ""), err.get("field"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(response.status_code, "error", response.text[:500] or response.reason_phrase)


@dataclass(frozen=True)
class SSEvent:
    """One Server-Sent Event: `id:`, `event:` and the (JSON-decoded when possible) `data:`."""

    id: str | None
    event: str
    data: Any


def parse_sse(lines: Iterator[str]) -> Iterator[SSEvent]:
    """Events from SSE lines; comments (`:` keep-alives) and unknown fields are skipped."""
    event_id: str | None = None
    event_type, data_lines = "message", []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data_lines:
                text = "\n".join(data_lines)
                try:
                    data: Any = json.loads(text)
                except ValueError:
                    data = text
                yield SSEvent(event_id, event_type, data)
            event_type, data_lines = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            event_id = value
        elif name == "event":
            event_type = value
        elif name == "data":
            data_lines.append(value)


def safe_extract(archive: tarfile.TarFile, dest: Path) -> list[Path]:
    """Extract regular files and folders only, refusing anything that escapes `dest`."""
    dest = dest.resolve()
    written = []
    for member in archive.getmembers():
        target = (dest / member.name).resolve()
        if target != dest and dest not in target.parents:
            raise BrorlAPIError(0, "unsafe_archive", f"member {member.name!r} escapes {dest}")
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif member.isfile():
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None
            with source, open(target, "wb") as out:
                while chunk := source.read(1 << 20):
                    out.write(chunk)
            written.append(target)
        else:
            # Links and devices could point outside dest; a checkpoint never needs them.
            raise BrorlAPIError(0, "unsafe_archive", f"member {member.name!r} is not a file")
    return written


class BrorlClient:
    """Thin wrapper over httpx with the key, the error shape and the paging rules."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "BrorlClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BrorlAPIError(0, "connection_error", f"{self.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise BrorlAPIError.from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", "/v1/jobs", json=spec, headers=headers)

    def estimate(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The spec checked and estimated (`POST /v1/jobs?dry_run=true`); nothing is stored."""
        return self._json("POST", "/v1/jobs", json=spec, params={"dry_run": "true"})

    def list_jobs(self, limit: int = 20, after: str | None = None,
                  status: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        if status:
            params["status"] = status
        return self._json("GET", "/v1/jobs", params=params)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/jobs/{job_id}/cancel")

    def wait(self, job_id: str, poll: float = 2.0, timeout: float | None = None) -> dict[str, Any]:
        """Poll until the job is succeeded, failed or cancelled; returns the final job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout}s")
            time.sleep(poll)

    # ------------------------------------------------------------------ probes

    def create_probe(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/probes", json=body)

    def get_probe(self, probe_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/probes/{probe_id}")

    def cancel_probe(self, probe_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/probes/{probe_id}/cancel")

    def events(self, job_id: str, after: int | str | None = None) -> dict[str, Any]:
        params = {"after": after} if after is not None else {}
        return self._json("GET", f"/v1/jobs/{job_id}/events", params=params)

    def metrics(self, job_id: str, after_step: int | None = None,
                limit: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if after_step is not None:
            params["after_step"] = after_step
        if limit is not None:
            params["limit"] = limit
        return self._json("GET", f"/v1/jobs/{job_id}/metrics", params=params)

    def stream_metrics(self, job_id: str, last_event_id: str | None = None,
                       max_reconnects: int = 20, retry_wait: float = 1.0) -> Iterator[SSEvent]:
        """Follow the SSE stream until the server closes it because the job ended.

        A dropped connection is resumed with `Last-Event-ID`, so no step is seen twice. The
        stream ends when the server closes it after the job ended (or after `max_reconnects`
        connection failures in a row).
        """
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id is not None:
                headers["Last-Event-ID"] = last_event_id
            try:
                with self._http.stream("GET", f"/v1/jobs/{job_id}/metrics/stream",
                                       headers=headers, timeout=httpx.Timeout(30.0, read=None)) as r:
                    if r.status_code >= 400:
                        r.read()
                        raise BrorlAPIError.from_response(r)
                    for event in parse_sse(r.iter_lines()):
                        failures = 0
                        if event.id is not None:
                            last_event_id = event.id
                        yield event
                return  # a clean close: the job is over
            except httpx.HTTPError as exc:
                failures += 1
                if failures > max_reconnects:
                    raise BrorlAPIError(0, "connection_error", str(exc)) from exc
                time.sleep(retry_wait)

    # ------------------------------------------------------------------ checkpoints

    def list_checkpoints(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}/checkpoints")

    def download(self, job_id: str, step: int | None, dest: str | Path, merged: bool = False) -> Path:
        """Download a checkpoint (the latest when `step` is None) and extract it into `dest`.

        A LoRA job's checkpoint is PEFT's adapter; `merged` asks for the HF folder of the base
        with the adapter merged in instead (a full fine-tuning checkpoint is that already).
        The `.tar.gz` is checked against `X-Checksum-Sha256` before anything is extracted.
        """
        if step is None:
            checkpoints = self.list_checkpoints(job_id).get("data", [])
            if not checkpoints:
                raise BrorlAPIError(404, "not_found", f"job {job_id} has no checkpoints")
            step = max(int(c["step"]) for c in checkpoints)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        # Spooled to a temporary file: a real model's archive can be gigabytes.
        with tempfile.TemporaryFile() as spool:
            digest = hashlib.sha256()
            query = "?variant=merged" if merged else ""
            with self._http.stream("GET", f"/v1/jobs/{job_id}/checkpoints/{step}/download{query}") as r:
                if r.status_code >= 400:
                    r.read()
                    raise BrorlAPIError.from_response(r)
                expected = r.headers.get("X-Checksum-Sha256")
                for chunk in r.iter_bytes():
                    digest.update(chunk)
                    spool.write(chunk)
            if expected and digest.hexdigest() != expected.strip('"').lower():
                raise BrorlAPIError(0, "checksum_mismatch",
                                    f"sha256 {digest.hexdigest()} != X-Checksum-Sha256 {expected}")
            spool.seek(0)
            with tarfile.open(fileobj=spool, mode="r:gz") as archive:
                safe_extract(archive, dest)
        return dest

    # ------------------------------------------------------------------ datasets

    def upload_dataset(self, path: str | Path, name: str | None = None) -> dict[str, Any]:
        path = Path(path)
        data = {"name": name} if name else {}
        with open(path, "rb") as fh:
            files = {"file": (path.name, fh, "application/jsonl")}
            return self._json("POST", "/v1/datasets", files=files, data=data)

    def list_datasets(self) -> dict[str, Any]:
        return self._json("GET", "/v1/datasets")

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/datasets/{dataset_id}")

    # ------------------------------------------------------------------ graders

    def validate_grader(self, grader: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/graders/validate", json={"grader": grader})

    def run_grader(self, grader: dict[str, Any], model_sample: str | dict[str, Any],
                   item: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._json("POST", "/v1/graders/run",
                          json={"grader": grader, "model_sample": model_sample,
                                "item": item or {}})

    # ------------------------------------------------------------------ continuations

    def continuation_spec(self, job_id: str, broad: bool = False) -> dict[str, Any]:
        """The spec that continues `job_id` from its newest checkpoint (broad: n x 4)."""
        params = {"broad": "true" if broad else "false"}
        return self._json("GET", f"/v1/jobs/{job_id}/continuation", params=params)["spec"]

    def continuations(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}/continuations")

    # ------------------------------------------------------------------ evaluations

    def create_evaluation(self, job_id: str, body: dict[str, Any],
                          idempotency_key: str | None = None) -> dict[str, Any]:
        """Evaluate `job_id`'s checkpoints (and its base); docs/evaluation.md."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", f"/v1/jobs/{job_id}/evaluations", json=body, headers=headers)

    def get_evaluation(self, evaluation_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/evaluations/{evaluation_id}")

    def job_evaluations(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}/evaluations")

    def cancel_evaluation(self, evaluation_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/evaluations/{evaluation_id}/cancel")

    # ------------------------------------------------------------------ webhooks

    def create_webhook(self, url: str, event_types: list[str] | None = None,
                       description: str = "") -> dict[str, Any]:
        """Register an endpoint; the answer's `secret` is shown this once (docs/webhooks.md)."""
        return self._json("POST", "/v1/webhooks", json={"url": url, "event_types": event_types,
                                                        "description": description})

    def list_webhooks(self) -> dict[str, Any]:
        return self._json("GET", "/v1/webhooks")

    def update_webhook(self, endpoint_id: str, **fields: Any) -> dict[str, Any]:
        return self._json("PATCH", f"/v1/webhooks/{endpoint_id}", json=fields)

    def delete_webhook(self, endpoint_id: str) -> None:
        self._request("DELETE", f"/v1/webhooks/{endpoint_id}")

    def rotate_webhook_secret(self, endpoint_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/webhooks/{endpoint_id}/rotate")

    def test_webhook(self, endpoint_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/webhooks/{endpoint_id}/test")

    def webhook_deliveries(self, endpoint_id: str, limit: int = 20, status: str | None = None) -> dict[str, Any]:
        params = {"limit": limit, **({"status": status} if status else {})}
        return self._json("GET", f"/v1/webhooks/{endpoint_id}/deliveries", params=params)

    # ------------------------------------------------------------------ health

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False
