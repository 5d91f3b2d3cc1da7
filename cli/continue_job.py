"""`brorl continue JOB`: a new job that starts from JOB's checkpoint, in one step.

    brorl continue JOB [--broad] [--step S] [--optimizer] [--steps N] [--name NAME] [--wait]
    brorl continue JOB --broad --print > next.yaml    # the spec, to edit and `brorl submit`

`--broad` is BroRL's move at a plateau: the last stage's prompts at n x 4 (up to 512), at the
lr the job's own scaling rule gives that batch (GET /v1/jobs/{id}/continuation?broad=true).
"""
from __future__ import annotations

from typing import Optional

import typer
import yaml

from cli.remote import api_errors, console, follow_job, make_client, print_outcome


@api_errors
def continue_job(job_id: str = typer.Argument(..., help="The job to continue."),
                 broad: bool = typer.Option(False, "--broad", help="n x 4 (up to 512) at the lr rule's rate."),
                 step: Optional[str] = typer.Option(None, "--step", help="Its checkpoint at this step, or "
                                                    "'latest' (the default: the newest)."),
                 optimizer: bool = typer.Option(False, "--optimizer", help="Also restore its optimizer state."),
                 steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Steps of the new stage."),
                 name: Optional[str] = typer.Option(None, "--name"),
                 print_only: bool = typer.Option(False, "--print", help="Print the spec; submit nothing."),
                 wait: bool = typer.Option(False, "--wait", help="Follow the new job until it ends.")):
    """Continue a job from its checkpoint (narrow as it was, or --broad)."""
    with make_client() as client:
        spec = client.continuation_spec(job_id, broad=broad)
        spec["continue_from"].update({"step": _step(step), "optimizer": optimizer})
        if steps is not None:
            spec["rollout"]["schedule"][-1]["steps"] = steps
        if name:
            spec["name"] = name
        spec.pop("model", None)  # the parent's, filled in by the service
        if print_only:
            console.print(yaml.safe_dump(spec, sort_keys=False), highlight=False, soft_wrap=True)
            return
        job = client.submit(spec)
        stage = spec["rollout"]["schedule"][-1]
        console.print(f"{job['id']} {job['status']} (from {job_id} step {job['spec']['continue_from']['step']}, "
                      f"n={stage['n']}, lr={spec['optim']['lr']:.3g})", highlight=False)
        if wait:
            raise typer.Exit(print_outcome(follow_job(client, job["id"])))


def _step(value: str | None) -> int | str | None:
    """--step: a step number, or "latest" (sent as such; the service names the step it found)."""
    if value is None or value == "latest":
        return value
    if not value.isdigit():
        raise typer.BadParameter(f"{value!r} is neither a step number nor 'latest'", param_hint="--step")
    return int(value)


def register(app: typer.Typer) -> None:
    app.command("continue")(continue_job)
