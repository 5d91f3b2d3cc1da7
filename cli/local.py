"""brorl commands that run the trainer on this machine, no server: train, eval, schedule."""
from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def _load(spec_path: Path, **resources: int):
    """The spec at `spec_path` (with `resources` fields overridden), or exit 2 naming each error."""
    from pydantic import ValidationError

    from trainer.spec import JobSpec, load_spec, spec_errors

    try:
        spec = load_spec(spec_path)
        if resources:
            data = spec.model_dump(mode="json")
            data["resources"].update(resources)
            spec = JobSpec.model_validate(data)
        return spec
    except ValidationError as exc:
        for e in spec_errors(exc):
            console.print(f"[red]{spec_path}: {e['field']}: {e['message']}[/red]")
        raise typer.Exit(2)


def lr_rule(optim) -> list[str]:
    """The spec's lr rule in words, one line per knob: optim.lr_scaling, then optim.lr_batch."""
    f = {"sqrt": "sqrt(r)", "linear": "r", "none": "1"}[optim.lr_scaling]
    lines = [f"lr = {optim.lr:g} x {f}  (optim.lr_scaling: {optim.lr_scaling})"]
    if optim.lr_scaling != "none":
        r = "r = samples/step ÷ stage 0's"
        if optim.lr_batch == "prompts_capped":
            r += ", capped at prompts/step ÷ stage 0's (at least 1)"
        lines.append(f"{r}  (optim.lr_batch: {optim.lr_batch})")
    return lines


def schedule(spec_path: Path = typer.Argument(..., help="Job spec (YAML or JSON).")) -> None:
    """Print the stage table (n, prompts, samples per step, lr, steps) without running anything."""
    from trainer.algo.schedule import plan, stage_warning

    spec = _load(spec_path)
    o = spec.optim
    table = Table(title=f"{spec.name}: {spec.total_steps} steps, "
                        f"lr_scaling {o.lr_scaling}, lr_batch {o.lr_batch}")
    for col in ("stage", "n", "prompts/step", "samples/step", "lr", "steps", "first step"):
        table.add_column(col, justify="right")
    for p in plan(spec):
        table.add_row(str(p.index), str(p.n), str(p.prompts_per_step), str(p.samples_per_step),
                      f"{p.lr:.4g}", str(p.steps), str(p.first_step + 1))
    console.print(table)
    for line in lr_rule(o):
        console.print(line, highlight=False)
    plans = plan(spec)
    for p in plans:
        if warning := stage_warning(plans, p):
            console.print(f"[yellow]warning: {warning}[/yellow]")


def train(
    spec_path: Path = typer.Argument(..., help="Job spec (YAML or JSON)."),
    out: Path = typer.Option(Path("runs/local"), "--out", "-o", help="Output folder (metrics, checkpoints)."),
    dataset: Optional[Path] = typer.Option(None, help="JSONL file for a `task.dataset` spec."),
    resume: bool = typer.Option(False, help="Continue from the newest checkpoint in --out."),
    nproc: Optional[int] = typer.Option(None, "--nproc", min=1,
                                        help="Ranks (one per GPU) under torchrun; sets resources.gpus_per_node."),
) -> None:
    """Train locally: rich progress, metrics appended to OUT/metrics.jsonl, checkpoints in OUT."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cli.phases import PhaseSink

    from trainer.checkpoints import io as checkpoint
    from trainer import train as run_train
    from trainer.sink import JsonlSink

    spec = _load(spec_path, **({"gpus_per_node": nproc} if nproc else {}))
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(spec.model_dump_json(indent=1))
    start = checkpoint.latest(out) if resume else None
    stop = {"flag": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))  # finish the step, checkpoint, exit

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console) as bar:
        task = bar.add_task(spec.name, total=spec.total_steps, info="preparing (task, model, engine)...",
                            completed=0)

        def on_step(step: int, v: dict) -> None:
            info = (f"stage {v['stage']} N={v['n']} reward {v['reward_mean']:.3f} "
                    f"pass {v['pass_rate']:.3f} keep {v['keep_rate']:.2f} {v['samples_per_s']:.0f} samples/s")
            if "eval/pass@1" in v:
                info += f" eval pass@1 {v['eval/pass@1']:.3f}"
            bar.update(task, completed=step, info=info)

        # Long phases (a warm start, model load, engine start, evaluations) fill the info column
        # until the next step's figures replace it.
        sink = PhaseSink(JsonlSink(out), lambda line, finished: bar.update(task, info=line))
        result = run_train(spec, sink, lambda: stop["flag"], resume=start, out_dir=out,
                           dataset_path=dataset, on_step=on_step)
    console.print(f"steps completed: {result.steps_completed}"
                  + (" (stopped early)" if result.stopped else ""))
    if result.last_eval:
        console.print(json.dumps(result.last_eval, indent=1))
    if result.last_checkpoint:
        console.print(f"checkpoint: {result.last_checkpoint}")


def eval_cmd(
    checkpoint_dir: Path = typer.Argument(..., help="A checkpoint (HF model folder)."),
    spec_path: Path = typer.Option(..., "--spec", help="The spec whose task and eval settings to use."),
    dataset: Optional[Path] = typer.Option(None, help="JSONL file for a `task.dataset` spec."),
) -> None:
    """Evaluate a checkpoint on the spec's held-out split: pass@k and mean response length."""
    from trainer.evaluate import evaluate_checkpoint

    spec = _load(spec_path)
    values = evaluate_checkpoint(spec, checkpoint_dir, dataset)
    table = Table(title=f"{checkpoint_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in values.items():
        table.add_row(k, f"{v:.4f}")
    console.print(table)


def schema(out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to a file."),
           markdown: bool = typer.Option(
               False, "--markdown", help="The reference in Markdown (docs/jobspec.md) instead.")) -> None:
    """Print the job spec's JSON Schema (docs/jobspec.schema.json), or its reference in Markdown."""
    if markdown:
        from cli.spec_doc import spec_markdown

        text = spec_markdown()
    else:
        from trainer.spec import json_schema

        text = json.dumps(json_schema(), indent=2) + "\n"
    if out:
        out.write_text(text)
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)
    app.command("train")(train)
    app.command("eval")(eval_cmd)
    app.command("schedule")(schedule)
