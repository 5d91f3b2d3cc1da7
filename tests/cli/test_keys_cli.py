"""`brorl keys list|revoke`: operators see keys by prefix and revoke one; it stops working."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app
from store import keys
from store.db import session_scope


def test_list_and_revoke(data_dir):
    runner = CliRunner()
    acme = runner.invoke(app, ["keys", "create", "--tenant", "acme"]).output.strip()
    globex = runner.invoke(app, ["keys", "create", "--tenant", "globex"]).output.strip()
    listing = runner.invoke(app, ["keys", "list"])
    assert listing.exit_code == 0, listing.output
    lines = listing.output.splitlines()[1:]
    assert [line.split("\t")[1:3] for line in lines] == [["acme", acme[:12]], ["globex", globex[:12]]]
    assert acme not in listing.output  # the secret is never shown again
    assert len(runner.invoke(app, ["keys", "list", "--tenant", "acme"]).output.splitlines()) == 2

    assert runner.invoke(app, ["keys", "revoke", "brorl_"]).exit_code == 1  # matches everything
    result = runner.invoke(app, ["keys", "revoke", acme[:12]])
    assert result.exit_code == 0 and "revoked key 1" in result.output, result.output
    with session_scope() as s:
        assert keys.authenticate(s, acme) is None
        assert keys.authenticate(s, globex).name == "globex"
    assert "already revoked" in runner.invoke(app, ["keys", "revoke", "1"]).output
    assert runner.invoke(app, ["keys", "revoke", "99"]).exit_code == 1
    assert runner.invoke(app, ["keys", "list"]).output.splitlines()[1].split("\t")[4] != "-"
