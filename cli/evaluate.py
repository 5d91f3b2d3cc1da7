"""`brorl evaluate JOB`: a job's checkpoints against its base on held-out prompts, on the service.

    brorl evaluate JOB [--checkpoints 40,latest,best] [--n 16] [--k 1 --k 8] [--prompts 200]
                       [--task NAME [--task-config JSON] | --task JSON | --dataset ID]
                       [--no-base] [--no-wait] [--json] [--idempotency-key K]
    brorl evaluation show EVL [--json]     # an evaluation's table (or its whole result)
    brorl evaluation list JOB              # a job's evaluations

`POST /v1/jobs/{id}/evaluations`, followed until it ends; the table has, per model, pass@k with
its 95 % interval, the delta against the base (paired interval) and the prompts gained / lost
(docs/evaluation.md). The prompts are the job's eval split unless `--task` names a
reasoning-gym task (its eval split: `--task chain_sum --task-config '{"min_terms": 3}'`, or the
whole `task` object as the API takes it, `--task '{"reasoning_gym": {...}}'`) or `--dataset`
an uploaded dataset (its held-out rows).
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional

import typer
from rich.table import Table

from cli.remote import api_errors, console, make_client

evaluation_app = typer.Typer(no_args_is_help=True, help="Evaluations of a job's checkpoints.")
TERMINAL = ("succeeded", "failed", "cancelled")


def _choice(text: str) -> int | str:
    if text in ("latest", "best"):
        return text
    if not text.isdigit():
        raise typer.BadParameter(f"{text!r}: a step, latest or best", param_hint="--checkpoints")
    return int(text)


def checkpoint_choices(values: list[str] | None) -> list[int | str]:
    """--checkpoints 40,latest,best (or repeated): steps, latest or best, in order, once each."""
    choices = [_choice(part.strip()) for v in values or ["latest"] for part in v.split(",") if part.strip()]
    return list(dict.fromkeys(choices)) or ["latest"]


def _json_object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON ({exc})", param_hint=option) from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return value


def task_section(task: str | None, task_config: str | None, dataset: str | None) -> dict[str, Any] | None:
    """The evaluation's `task` (as EvaluationSpec takes it) from --task / --task-config / --dataset;
    None: the job's own task."""
    if task is not None and dataset is not None:
        raise typer.BadParameter("give --task or --dataset, not both", param_hint="--dataset")
    if task_config is not None and (task is None or task.lstrip().startswith("{")):
        raise typer.BadParameter("goes with --task NAME (a reasoning-gym task)", param_hint="--task-config")
    if dataset is not None:
        return {"dataset": {"id": dataset}}
    if task is None:
        return None
    if task.lstrip().startswith("{"):
        return _json_object(task, "--task")  # the whole section, checked by the service
    config = _json_object(task_config, "--task-config") if task_config is not None else {}
    return {"reasoning_gym": {"name": task, "config": config}}


def _interval(row: dict[str, Any] | None) -> str:
    if not row:
        return ""
    return f"{row['mean']:.3f} [{row['lo']:.3f}, {row['hi']:.3f}]"


def _delta(row: dict[str, Any] | None) -> str:
    return "" if not row else f"{row['mean']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]"


def result_table(result: dict[str, Any]) -> Table:
    """One row per model: pass@k [95 % interval] per k, delta vs base per k, gained / lost."""
    ks = [str(k) for k in result["k"]]
    has_base = any(m["step"] is None for m in result["models"])
    source = " ".join(f"{kind} {name}" for kind, name in (result.get("task") or {}).items())
    table = Table(title=f"{result['prompts']} prompts{' of ' + source if source else ''} x {result['n']} samples, "
                        f"T={result['temperature']} (intervals: {result['interval']})")
    table.add_column("model", no_wrap=True)
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    if has_base:
        for k in ks:
            table.add_column(f"Δ pass@{k} vs base", justify="right")
        table.add_column("gained / lost", justify="right")
    best = (result.get("best") or {}).get("step")
    for m in result["models"]:
        label = m["label"] + (" *best*" if m["step"] is not None and m["step"] == best else "")
        cells = [label] + [_interval(m["pass_at_k"][k]) for k in ks]
        if has_base:
            cells += [_delta((m.get("delta") or {}).get(k)) for k in ks]
            ch = m.get("changes")
            cells.append("" if not ch else f"+{len(ch['gained'])} / -{len(ch['lost'])}")
        table.add_row(*cells)
    return table


def print_evaluation(row: dict[str, Any], as_json: bool) -> int:
    if row["status"] != "succeeded":
        console.print(f"[red]evaluation {row['id']} {row['status']}: {row.get('error') or ''}[/red]")
        return 1
    if as_json:
        typer.echo(json.dumps(row["result"], indent=1))
        return 0
    console.print(result_table(row["result"]))
    for p in row["spec"].get("picked", []):
        if p.get("why"):
            console.print(f"step {p['step']} ({', '.join(p['asked'])}): {p['why']}", highlight=False)
    if best := row["result"].get("best"):
        console.print(f"best: {best['label']} (pass@1 {best['pass@1']:.3f}; {best['rule']})", highlight=False)
    return 0


@api_errors
def evaluate(job_id: str = typer.Argument(..., help="The job whose checkpoints to evaluate."),
             checkpoint: Optional[list[str]] = typer.Option(
                 None, "--checkpoints", "--checkpoint", "-c",
                 help="Steps, latest or best, comma-separated or repeated (default: latest)."),
             base: bool = typer.Option(True, "--base/--no-base", help="Also evaluate the base and compare."),
             n: Optional[int] = typer.Option(None, "--n", min=1, max=1024, help="Samples per prompt "
                                             "(default: the job's eval.samples_per_prompt)."),
             k: Optional[list[int]] = typer.Option(None, "--k", min=1, help="A k of pass@k (repeat)."),
             prompts: Optional[int] = typer.Option(None, "--prompts", min=1, max=1024,
                                                   help="First this many eval prompts (default: all)."),
             temperature: Optional[float] = typer.Option(None, "--temperature"),
             task: Optional[str] = typer.Option(None, "--task", help="A reasoning-gym task name (its eval "
                                                "split), or the whole task object as JSON (default: the job's)."),
             task_config: Optional[str] = typer.Option(None, "--task-config",
                                                       help="The --task's config, a JSON object."),
             dataset: Optional[str] = typer.Option(None, "--dataset", help="An uploaded dataset's id "
                                                   "(its held-out rows)."),
             seed: int = typer.Option(0, "--seed", min=0),
             wait: bool = typer.Option(True, "--wait/--no-wait", help="Follow it and print the table."),
             as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
             idempotency_key: Optional[str] = typer.Option(None, "--idempotency-key"),
             poll: float = typer.Option(2.0, help="Seconds between polls.")):
    """Evaluate a job's checkpoints against its base: pass@k with intervals, prompts gained/lost."""
    body: dict[str, Any] = {"checkpoints": checkpoint_choices(checkpoint), "base": base, "seed": seed}
    body.update({key: v for key, v in (("n", n), ("k", k), ("prompts", prompts), ("temperature", temperature),
                                       ("task", task_section(task, task_config, dataset))) if v is not None})
    with make_client() as client:
        row = client.create_evaluation(job_id, body, idempotency_key)
        steps = ", ".join(str(s) for s in row["checkpoints"])
        console.print(f"evaluation {row['id']} {row['status']}: step {steps}"
                      + (" and the base" if row["base"] else ""), highlight=False)
        if not wait:
            return
        with console.status("evaluating...") as status:
            while row["status"] not in TERMINAL:
                time.sleep(poll)
                row = client.get_evaluation(row["id"])
                status.update(f"{row['status']}: {row['step']} / {row['total_steps']} samples")
    raise typer.Exit(print_evaluation(row, as_json))


@evaluation_app.command("show")
@api_errors
def show(evaluation_id: str, as_json: bool = typer.Option(False, "--json")):
    """An evaluation's table (or, with --json, its whole result)."""
    with make_client() as client:
        row = client.get_evaluation(evaluation_id)
    if row["status"] not in TERMINAL:
        console.print(f"evaluation {row['id']} {row['status']}: {row['step']} / {row['total_steps']} samples")
        return
    raise typer.Exit(print_evaluation(row, as_json))


@evaluation_app.command("list")
@api_errors
def list_for_job(job_id: str):
    """A job's evaluations, newest first."""
    with make_client() as client:
        rows = client.job_evaluations(job_id)["data"]
    table = Table("id", "status", "checkpoints", "base", "best", "pass@1 of best")
    for r in rows:
        best = (r.get("result") or {}).get("best") or {}
        table.add_row(r["id"], r["status"], ", ".join(map(str, r["checkpoints"])), str(r["base"]),
                      str(best.get("step", "")), f"{best['pass@1']:.3f}" if best else "")
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
    app.add_typer(evaluation_app, name="evaluation")
