"""`brorl evaluate JOB`: a job's checkpoints against its base on held-out prompts, on the service.

    brorl evaluate JOB [-c best -c latest -c 40] [--n 16] [--k 1 --k 8] [--prompts 200]
                       [--no-base] [--no-wait] [--json] [--idempotency-key K]
    brorl evaluation show EVL [--json]     # an evaluation's table (or its whole result)
    brorl evaluation list JOB              # a job's evaluations

`POST /v1/jobs/{id}/evaluations`, followed until it ends; the table has, per model, pass@k with
its 95 % interval, the delta against the base (paired interval) and the prompts gained / lost
(docs/evaluation.md).
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
    try:
        return int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: a step, latest or best") from None


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
    table = Table(title=f"{result['prompts']} prompts x {result['n']} samples, T={result['temperature']} "
                        f"(intervals: {result['interval']})")
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
             checkpoint: Optional[list[str]] = typer.Option(None, "--checkpoint", "-c",
                                                             help="A step, latest or best (repeat; default latest)."),
             base: bool = typer.Option(True, "--base/--no-base", help="Also evaluate the base and compare."),
             n: Optional[int] = typer.Option(None, "--n", min=1, max=1024, help="Samples per prompt "
                                             "(default: the job's eval.samples_per_prompt)."),
             k: Optional[list[int]] = typer.Option(None, "--k", min=1, help="A k of pass@k (repeat)."),
             prompts: Optional[int] = typer.Option(None, "--prompts", min=1, max=1024,
                                                   help="First this many eval prompts (default: all)."),
             temperature: Optional[float] = typer.Option(None, "--temperature"),
             seed: int = typer.Option(0, "--seed", min=0),
             wait: bool = typer.Option(True, "--wait/--no-wait", help="Follow it and print the table."),
             as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
             idempotency_key: Optional[str] = typer.Option(None, "--idempotency-key"),
             poll: float = typer.Option(2.0, help="Seconds between polls.")):
    """Evaluate a job's checkpoints against its base: pass@k with intervals, prompts gained/lost."""
    body: dict[str, Any] = {"checkpoints": [_choice(c) for c in checkpoint or ["latest"]], "base": base,
                            "seed": seed}
    body.update({key: v for key, v in (("n", n), ("k", k), ("prompts", prompts),
                                       ("temperature", temperature)) if v is not None})
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
