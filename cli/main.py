"""`brorl`: one typer app; each module registers its own commands.

- cli.remote:   talks to a running service (submit, jobs, metrics, download, datasets)
- cli.server:   runs the service (up, demo, worker, migrate, keys)
- cli.local:    runs the trainer with no server (train, eval, schedule)
- cli.evidence: the paper's claims on your hardware (simulate)
- cli.probe:    the pass@k probe and its recommendation (here or on the service)
- cli.graders:  tries a grader on the service (graders validate, graders run)
- cli.webhooks: webhook endpoints and their delivery logs
- cli.continue_job: a new job from an earlier job's checkpoint (continue, --broad)
- cli.chat:     talks to a checkpoint (chat)
- cli.evaluate: a job's checkpoints against its base (evaluate, evaluation show/list)
Heavy imports (torch, FastAPI, Celery) happen inside the commands, so `brorl --help` is quick.
"""
import typer

from cli import chat, continue_job, evaluate, evidence, graders, local, probe, remote, server, webhooks

app = typer.Typer(no_args_is_help=True, add_completion=False, help="BroRL as a service.")
for module in (remote, server, local, evidence, graders, probe, webhooks, chat, continue_job, evaluate):
    module.register(app)

if __name__ == "__main__":
    app()
