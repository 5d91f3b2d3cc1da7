"""`brorl webhooks`: register endpoints for job events and read their delivery logs.

    brorl webhooks create URL [--event job.succeeded --event job.failed] [--description D]
    brorl webhooks list | delete ID | rotate ID | test ID
    brorl webhooks deliveries ID [--status failed]

`create` and `rotate` print the signing secret, which the service shows only then.
"""
from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from cli.remote import api_errors, console, make_client

webhooks_app = typer.Typer(no_args_is_help=True, help="Webhooks: be told when jobs change state.")


@webhooks_app.command("create")
@api_errors
def create(url: str = typer.Argument(..., help="Where to POST (a public http/https URL)."),
           event: Optional[list[str]] = typer.Option(None, "--event", help="An event type (repeat); default: all."),
           description: str = typer.Option("", "--description")):
    with make_client() as client:
        endpoint = client.create_webhook(url, event or None, description)
    console.print(f"{endpoint['id']}  secret: [bold]{endpoint['secret']}[/bold]  (shown once: keep it)")


@webhooks_app.command("list")
@api_errors
def list_endpoints():
    with make_client() as client:
        rows = client.list_webhooks()["data"]
    table = Table("id", "url", "events", "enabled")
    for e in rows:
        table.add_row(e["id"], e["url"], ", ".join(e["event_types"] or ["all"]), str(e["enabled"]))
    console.print(table)


@webhooks_app.command("delete")
@api_errors
def delete(endpoint_id: str):
    with make_client() as client:
        client.delete_webhook(endpoint_id)
    console.print(f"deleted {endpoint_id}")


@webhooks_app.command("rotate")
@api_errors
def rotate(endpoint_id: str):
    with make_client() as client:
        endpoint = client.rotate_webhook_secret(endpoint_id)
    console.print(f"{endpoint_id}  new secret: [bold]{endpoint['secret']}[/bold]  (the old one signs too for 24 h)")


@webhooks_app.command("test")
@api_errors
def test(endpoint_id: str):
    with make_client() as client:
        delivery = client.test_webhook(endpoint_id)
    console.print(f"queued {delivery['message_id']}: see `brorl webhooks deliveries {endpoint_id}`")


@webhooks_app.command("deliveries")
@api_errors
def deliveries(endpoint_id: str, status: Optional[str] = typer.Option(None, "--status"),
               limit: int = typer.Option(20, "--limit", min=1, max=100)):
    with make_client() as client:
        rows = client.webhook_deliveries(endpoint_id, limit, status)["data"]
    table = Table("id", "event", "status", "attempts", "last answer", "created")
    for d in rows:
        answer = d["last_error"] or (str(d["last_status_code"]) if d["last_status_code"] else "")
        table.add_row(str(d["id"]), d["event_type"], d["status"], str(d["attempts"]), answer, d["created_at"][:19])
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(webhooks_app, name="webhooks")
