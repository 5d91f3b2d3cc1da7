"""Client pieces that need no server: SSE parsing, safe extraction, the error shape."""
from __future__ import annotations

import io
import tarfile

import httpx
import pytest

from cli.client import BrorlAPIError, parse_sse, safe_extract


def test_parse_sse_events_ids_and_comments():
    lines = [": keep-alive", "event: metric", "id: 3", 'data: {"step": 3, "values": {"loss": 1}}',
             "", "event: end", 'data: {"status": "succeeded"}', ""]
    events = list(parse_sse(iter(lines)))
    assert [(e.event, e.id) for e in events] == [("metric", "3"), ("end", "3")]
    assert events[0].data == {"step": 3, "values": {"loss": 1}}
    assert events[1].data == {"status": "succeeded"}


def _tar(members: dict[str, bytes]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r:gz")


def test_safe_extract_writes_files(tmp_path):
    safe_extract(_tar({"config.json": b"{}", "sub/model.bin": b"x"}), tmp_path)
    assert (tmp_path / "config.json").read_bytes() == b"{}"
    assert (tmp_path / "sub" / "model.bin").read_bytes() == b"x"


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", "a/../../evil"])
def test_safe_extract_refuses_traversal(tmp_path, name):
    dest = tmp_path / "dest"
    with pytest.raises(BrorlAPIError, match="escapes"):
        safe_extract(_tar({name: b"x"}), dest)
    assert not (tmp_path / "evil").exists()


def test_safe_extract_refuses_links(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    buf.seek(0)
    with pytest.raises(BrorlAPIError, match="not a file"):
        safe_extract(tarfile.open(fileobj=buf, mode="r:gz"), tmp_path)


def test_error_shape_is_parsed():
    response = httpx.Response(422, json={"error": {"type": "validation_error",
                                                   "message": "n: too small",
                                                   "field": "rollout.schedule.0.n"}})
    err = BrorlAPIError.from_response(response)
    assert (err.status, err.type, err.field) == (422, "validation_error", "rollout.schedule.0.n")
    assert "rollout.schedule.0.n" in str(err)
    assert BrorlAPIError.from_response(httpx.Response(502, text="bad gateway")).status == 502
