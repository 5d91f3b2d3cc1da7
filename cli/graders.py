"""`brorl graders validate|run`: try a grader JSON (OpenAI's format) against the service.

    brorl graders validate GRADER.json
    brorl graders run GRADER.json --sample TEXT [--sample-file F] [--item JSON | --item-file F]

Both print the service's JSON answer (the grader, or the reward, sub-rewards and error
flags). Python and code graders run in the service's sandbox, never on this machine.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from cli.remote import api_errors, console, err_console, make_client

graders_app = typer.Typer(no_args_is_help=True, help="Validate and try graders.")


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        err_console.print(f"[red]{what} {path}: {exc}[/red]")
        raise typer.Exit(2) from None


@graders_app.command("validate")
@api_errors
def validate(grader: Path = typer.Argument(..., exists=True, dir_okay=False,
                                           help="A grader JSON file.")):
    with make_client() as client:
        console.print_json(data=client.validate_grader(_load_json(grader, "grader")))


@graders_app.command("run")
@api_errors
def run(grader: Path = typer.Argument(..., exists=True, dir_okay=False),
        sample: Optional[str] = typer.Option(None, "--sample", help="The model's output text."),
        sample_file: Optional[Path] = typer.Option(None, "--sample-file", exists=True),
        item: Optional[str] = typer.Option(None, "--item", help="The dataset row, as JSON."),
        item_file: Optional[Path] = typer.Option(None, "--item-file", exists=True)):
    if (sample is None) == (sample_file is None):
        err_console.print("[red]give exactly one of --sample and --sample-file[/red]")
        raise typer.Exit(2)
    text = sample if sample is not None else sample_file.read_text()
    try:
        row = json.loads(item) if item else (_load_json(item_file, "item") if item_file else {})
    except ValueError as exc:
        err_console.print(f"[red]--item is not JSON: {exc}[/red]")
        raise typer.Exit(2) from None
    with make_client() as client:
        console.print_json(data=client.run_grader(_load_json(grader, "grader"), text, row))


def register(app: typer.Typer) -> None:
    app.add_typer(graders_app, name="graders")
