"""`brorl probe spec.yaml`: the pass@k curve of the spec's model on its task, and whether to broaden.

Runs the probe here (trainer.probe, no server) or, with `--remote`, on the service
(`POST /v1/probes`, followed until it ends). Either way the recommendation is computed against
the spec given (trainer.algo.recommend: its first stage's prompts per step, its lr rule), and
`--submit` sends the recommended spec to the service as a job; `--write` saves it as YAML.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def probe_body(spec, n: int, prompts: int) -> dict[str, Any]:
    """The `POST /v1/probes` body that probes `spec`'s model on its task, at its rollout sampling."""
    r = spec.rollout
    return {"model": spec.model.model_dump(mode="json"), "task": spec.task.model_dump(mode="json"),
            "n": n, "prompts": prompts, "max_new_tokens": r.max_new_tokens, "temperature": r.temperature,
            "top_p": r.top_p, "seed": spec.seed, "engine": r.engine}


def curve_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"pass@k, {result['prompts']} prompts x {result['n']} samples "
                        f"(band: {result.get('band', '')})")
    for col in ("k", "pass@k", "low", "high", "all-wrong at k, solved within n"):
        table.add_column(col, justify="right")
    n = result["n"]
    top = result["pass_at_k"][str(n)]["mean"]
    for k, row in result["pass_at_k"].items():
        gap = f"{top - row['mean']:.3f}" if int(k) < n else ""
        table.add_row(k, f"{row['mean']:.3f}", f"{row['lo']:.3f}", f"{row['hi']:.3f}", gap)
    return table


def print_result(result: dict[str, Any], rec: dict[str, Any]) -> None:
    console.print(curve_table(result))
    console.print(f"response length {result['response_len_mean']:.1f} tokens, truncated "
                  f"{result['truncated_frac']:.1%}, {result['samples']} samples, {result['tokens']} tokens, "
                  f"{result['seconds']:.1f} s, {result['samples_per_s']:.1f} samples/s")
    if env := result.get("env"):  # a task.env job's probe sampled episodes
        console.print(f"episodes: {env['turns_mean']:.2f} turns, {env['tool_calls_mean']:.2f} tool calls and "
                      f"{env['tool_errors_mean']:.2f} tool errors per episode, {env['budget_truncated_frac']:.1%} "
                      f"cut by the budget, {env['errors']} broken by the environment, {env['seconds']:.1f} s "
                      "in the environment")
    colour = "green" if rec["broaden"] else "yellow"
    console.print(f"[bold {colour}]{rec['verdict']}[/bold {colour}]: {rec['reason']}")
    for i, st in enumerate(rec["schedule"]):
        console.print(f"  stage {i}: n {st['n']} x {st['prompts_per_step']} prompts, {st['steps']} steps, "
                      f"lr {st['lr']:.3g}")
    if rec.get("broaden_on_plateau"):
        console.print(f"  rollout.broaden: {json.dumps(rec['broaden_on_plateau'])}")


def _probe_here(spec, n: int, prompts: int, dataset: Optional[Path]) -> dict[str, Any]:
    from trainer.probe import probe
    from trainer.probe_spec import ProbeSpec
    from trainer.stop import StopRequested

    pspec = ProbeSpec.model_validate(probe_body(spec, n, prompts))
    with console.status("probing...") as status:
        def progress(p: dict) -> None:
            status.update(f"probing: {p['samples_done']} / {p['samples_total']} samples")
        try:
            return probe(pspec, spec, lambda: False, dataset_path=dataset, on_progress=progress)
        except StopRequested:
            raise typer.Exit(130)


def _probe_remote(spec, n: int, prompts: int, poll: float) -> dict[str, Any]:
    from cli.remote import make_client

    with make_client() as client:
        row = client.create_probe(probe_body(spec, n, prompts))
        console.print(f"probe {row['id']} queued")
        with console.status("waiting...") as status:
            while row["status"] in ("queued", "running"):
                time.sleep(poll)
                row = client.get_probe(row["id"])
                status.update(f"{row['status']}: {row['step']} / {row['total_steps']} samples")
    if row["status"] != "succeeded":
        console.print(f"[red]probe {row['id']} {row['status']}: {row.get('error') or ''}[/red]")
        raise typer.Exit(1)
    return row["result"]


def probe_cmd(
    spec_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Job spec (YAML or JSON)."),
    n: int = typer.Option(512, "--n", min=2, max=4096, help="Samples per prompt."),
    prompts: int = typer.Option(64, "--prompts", min=1, max=1024, help="Eval prompts to probe."),
    remote: bool = typer.Option(False, "--remote", help="Run the probe on the service."),
    submit: bool = typer.Option(False, "--submit", help="Submit the recommended spec as a job."),
    write: Optional[Path] = typer.Option(None, "--write", help="Save the recommended spec (YAML)."),
    dataset: Optional[Path] = typer.Option(None, help="JSONL file for a `task.dataset` spec (local)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
    poll: float = typer.Option(2.0, help="Seconds between polls with --remote."),
) -> None:
    """Probe the spec's model: pass@k for k = 1..n, and whether broad exploration will pay."""
    import yaml

    from cli.local import _load
    from trainer.algo.recommend import recommend

    spec = _load(spec_path)
    result = _probe_remote(spec, n, prompts, poll) if remote else _probe_here(spec, n, prompts, dataset)
    rec = recommend(result, spec)  # against this spec (the service's is against a default one)
    result["recommendation"] = rec
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        print_result(result, rec)
    if write:
        write.write_text(yaml.safe_dump(rec["spec"], sort_keys=False))
        console.print(f"recommended spec written to {write}")
    if submit:
        from cli.remote import make_client

        with make_client() as client:
            job = client.submit(rec["spec"])
        console.print(f"submitted job {job['id']} ({rec['verdict']})")


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_cmd)
