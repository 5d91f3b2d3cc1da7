"""`brorl` commands that talk to a running service over HTTP (through `cli.client`).

    brorl submit SPEC.yaml [--idempotency-key K] [--wait] [--dry-run]
    brorl jobs list [--status S] [--limit N] | show ID | cancel ID | wait ID
    brorl metrics JOB [--follow]
    brorl download JOB [--step S] -o DIR
    brorl datasets upload FILE [--name NAME] | list

The service is `BRORL_URL` (default http://127.0.0.1:8000) and the key `BRORL_API_KEY`; when
the key is unset, the embedded stack's `<data dir>/local.key` is used if it exists, so
`brorl up` in one terminal and `brorl submit` in another just work. API errors print as one
red line naming the field and exit with status 1.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console
from rich.table import Table

from cli.client import TERMINAL, BrorlAPIError, BrorlClient
from cli.estimates import estimate_text, progress_line
from cli.phases import PhaseStatus

DEFAULT_URL = "http://127.0.0.1:8000"
LOCAL_KEY_FILE = "local.key"
# Columns shown per step, in order; a metric the trainer did not write is left blank.
STEP_COLUMNS = ("stage", "n", "reward_mean", "pass_rate", "keep_rate", "loss", "kl",
                "entropy", "samples_per_s", "step_s")

console = Console()
err_console = Console(stderr=True)


def local_key_path(data_dir: Path | None = None) -> Path:
    """`<data dir>/local.key`, the data dir coming from the settings (BRORL_DATA_DIR)."""
    if data_dir is None:
        from store.settings import Settings

        data_dir = Settings().data_dir
    return Path(data_dir).expanduser() / LOCAL_KEY_FILE


class ClientSettings(BaseSettings):
    """What the CLI reads of its environment to reach a server (pydantic-settings, like the
    service's and the trainer's settings)."""

    model_config = SettingsConfigDict(env_prefix="BRORL_", extra="ignore")
    api_key: str = ""
    url: str = DEFAULT_URL


def resolve_api_key() -> str | None:
    if key := ClientSettings().api_key:
        return key
    path = local_key_path()
    return path.read_text().strip() if path.is_file() else None


def make_client(url: str | None = None, api_key: str | None = None) -> BrorlClient:
    return BrorlClient(url or ClientSettings().url,
                       api_key or resolve_api_key(), timeout=60.0)


def api_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a BrorlAPIError into one red line and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrorlAPIError as exc:
            field = f" (field: {exc.field})" if exc.field else ""
            err_console.print(f"[red]error {exc.status or ''} {exc.type}: {exc.message}{field}[/red]",
                              markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _step_values(data: Any) -> tuple[int | None, dict[str, Any]]:
    """(step, values) from a metrics row or SSE payload, flat or `{"step", "values"}`."""
    if not isinstance(data, dict):
        return None, {}
    values = data.get("values") if isinstance(data.get("values"), dict) else data
    step = data.get("step", values.get("step"))
    return (int(step) if step is not None else None), values


def format_step(step: int, values: dict[str, Any]) -> str:
    """One console line per step: the headline metrics, then any evaluation results."""
    parts = [f"step {step:>5}"]
    parts += [f"{k}={_fmt(values[k])}" for k in STEP_COLUMNS if k in values]
    parts += [f"{k}={_fmt(v)}" for k, v in sorted(values.items()) if k.startswith("eval/")]
    return "  ".join(parts)


def metrics_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("step", *STEP_COLUMNS, title="metrics")
    eval_keys = sorted({k for r in rows for k in _step_values(r)[1] if k.startswith("eval/")})
    for key in eval_keys:
        table.add_column(key)
    for row in rows:
        step, values = _step_values(row)
        table.add_row(str(step), *(_fmt(values.get(k)) for k in (*STEP_COLUMNS, *eval_keys)))
    return table


def follow_job(client: BrorlClient, job_id: str, poll: float = 2.0) -> dict[str, Any]:
    """Print each step's metrics as it arrives until the job ends; returns the final job.

    Uses the SSE stream, whose `progress` events (a warm start, model load, engine start, an
    evaluation) keep one status line up to date; if the stream is unavailable it falls back
    to polling the metrics endpoint, so following works against any API that serves the
    plain endpoints.
    """
    seen = -1
    try:
        with PhaseStatus(console) as line:
            for event in client.stream_metrics(job_id):
                if event.event == "end":
                    break
                if event.event == "progress" and isinstance(event.data, dict):
                    line.progress(event.data.get("data") or {})
                    continue
                if event.event == "status" and isinstance(event.data, dict):
                    line.text(f"job {event.data.get('status')}, step {event.data.get('step')}")
                if event.event not in ("message", "metric"):
                    continue  # `status` events: the closing line reports the outcome
                step, values = _step_values(event.data)
                if step is not None and step > seen:
                    seen = step
                    console.print(format_step(step, values), highlight=False)
                    line.text(f"running: step {step} done")
    except BrorlAPIError as exc:
        if exc.status not in (0, 404, 405, 501):
            raise
    while True:  # after the stream closes, or instead of it
        for row in client.metrics(job_id, after_step=seen).get("data", []):
            step, values = _step_values(row)
            if step is not None and step > seen:
                seen = step
                console.print(format_step(step, values), highlight=False)
        job = client.get_job(job_id)
        if job["status"] in TERMINAL:
            return job
        time.sleep(poll)


def print_outcome(job: dict[str, Any]) -> int:
    """A closing line; returns the exit code (0 only when the job succeeded)."""
    colour = {"succeeded": "green", "cancelled": "yellow"}.get(job["status"], "red")
    error = f": {job['error']}" if job.get("error") else ""
    console.print(f"[{colour}]job {job['id']} {job['status']}{error}[/{colour}]", highlight=False)
    return 0 if job["status"] == "succeeded" else 1


def load_spec_file(path: Path) -> dict[str, Any]:
    """The spec as a plain dict; validation is the server's job (a 422 names the field)."""
    import yaml

    text = path.read_text()
    data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path} does not hold a mapping")
    return data


def _jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("id", "name", "status", "step", "created_at")
    for job in jobs:
        step = f"{job.get('step', '')}/{job.get('total_steps', '')}"
        table.add_row(job["id"], job.get("name") or job.get("spec", {}).get("name", ""),
                      job["status"], step, str(job.get("created_at", "")))
    return table


@api_errors
def submit(spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="YAML or JSON."),
           idempotency_key: Optional[str] = typer.Option(None, "--idempotency-key"),
           wait: bool = typer.Option(False, "--wait", help="Follow the job until it ends."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Check and estimate; submit nothing.")):
    """Submit a job spec; prints the job id (--dry-run: its estimate)."""
    with make_client() as client:
        if dry_run:
            console.print(estimate_text(client.estimate(load_spec_file(spec))), highlight=False, soft_wrap=True)
            return
        job = client.submit(load_spec_file(spec), idempotency_key=idempotency_key)
        console.print(f"{job['id']} {job['status']}", highlight=False)
        if wait:
            raise typer.Exit(print_outcome(follow_job(client, job["id"])))


@api_errors
def jobs_list(status: Optional[str] = typer.Option(None, "--status"),
              limit: int = typer.Option(20, "--limit"),
              after: Optional[str] = typer.Option(None, "--after")):
    """Jobs of your tenant, newest first."""
    with make_client() as client:
        page = client.list_jobs(limit=limit, after=after, status=status)
    console.print(_jobs_table(page["data"]))
    if page.get("has_more"):
        console.print(f"more: --after {page['data'][-1]['id']}", highlight=False)


@api_errors
def jobs_show(job_id: str):
    """The job object as JSON (a queued job's place or a running job's ETA first, on stderr)."""
    with make_client() as client:
        job = client.get_job(job_id)
    if (line := progress_line(job)) is not None:
        err_console.print(line, highlight=False, soft_wrap=True)
    console.print_json(data=job)


@api_errors
def jobs_cancel(job_id: str):
    """Cancel a queued job now, or ask a running one to stop at its next step."""
    with make_client() as client:
        job = client.cancel(job_id)
    console.print(f"{job['id']} {job['status']}", highlight=False)


@api_errors
def jobs_wait(job_id: str):
    """Follow a job's metrics until it ends; exit status 0 only if it succeeded."""
    with make_client() as client:
        raise typer.Exit(print_outcome(follow_job(client, job_id)))


@api_errors
def metrics(job_id: str, follow: bool = typer.Option(False, "--follow", "-f")):
    """A job's metrics as a table (`--follow`: live, one line per step)."""
    with make_client() as client:
        if follow:
            raise typer.Exit(print_outcome(follow_job(client, job_id)))
        console.print(metrics_table(client.metrics(job_id).get("data", [])))


@api_errors
def download(job_id: str, step: Optional[int] = typer.Option(None, "--step"),
             output: Path = typer.Option(..., "-o", "--output", help="Folder to extract into."),
             merged: bool = typer.Option(False, "--merged", help="LoRA jobs: the base with the adapter "
                                         "merged in (an HF model folder) instead of the PEFT adapter.")):
    """Download a checkpoint (the latest by default), check its sha256, extract it.

    A LoRA job's checkpoint is PEFT's adapter (adapter_config.json + adapter_model.safetensors)
    unless --merged; a full fine-tuning checkpoint is an HF model folder."""
    with make_client() as client:
        dest = client.download(job_id, step, output, merged=merged)
    what = "merged HF model folder" if merged else (
        "PEFT adapter (load it onto the base with peft)" if (Path(dest) / "adapter_config.json").is_file()
        else "HF model folder")
    console.print(f"checkpoint extracted to {dest}: {what}", highlight=False)


@api_errors
def datasets_upload(file: Path = typer.Argument(..., exists=True, dir_okay=False),
                    name: Optional[str] = typer.Option(None, "--name")):
    """Upload a JSONL file (one {"prompt", "answer"} object per line)."""
    with make_client() as client:
        ds = client.upload_dataset(file, name)
    console.print(f"{ds['id']} {ds.get('name', '')} rows={ds.get('rows', '')}", highlight=False)


@api_errors
def datasets_list():
    """Your tenant's datasets."""
    with make_client() as client:
        page = client.list_datasets()
    table = Table("id", "name", "rows", "bytes", "created_at")
    for ds in page.get("data", []):
        table.add_row(ds["id"], ds.get("name", ""), str(ds.get("rows", "")),
                      str(ds.get("bytes", "")), str(ds.get("created_at", "")))
    console.print(table)


def register(app: typer.Typer) -> None:
    jobs_app = typer.Typer(no_args_is_help=True, help="List, inspect, cancel and wait for jobs.")
    datasets_app = typer.Typer(no_args_is_help=True, help="Upload and list JSONL datasets.")
    app.add_typer(jobs_app, name="jobs")
    app.add_typer(datasets_app, name="datasets")
    for command in (submit, metrics, download):
        app.command()(command)
    for name, command in (("list", jobs_list), ("show", jobs_show), ("cancel", jobs_cancel),
                          ("wait", jobs_wait)):
        jobs_app.command(name)(command)
    datasets_app.command("upload")(datasets_upload)
    datasets_app.command("list")(datasets_list)
