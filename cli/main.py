"""`brorl`: one typer app; each module registers its own commands.

- cli.remote: talks to a running service (submit, jobs, metrics, download)
- cli.server: runs the service (up, demo, keys, worker)
- cli.local:  runs the trainer with no server (train, eval, schedule, simulate)
Heavy imports (torch, FastAPI, Celery) happen inside the commands, so `brorl --help` is quick.
"""
import typer

from cli import local, remote, server

app = typer.Typer(no_args_is_help=True, add_completion=False, help="BroRL as a service.")
for module in (remote, server, local):
    module.register(app)

if __name__ == "__main__":
    app()
