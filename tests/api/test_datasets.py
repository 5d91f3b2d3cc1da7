"""Dataset uploads: stored whole with rows and sha256, or refused (413 / 422) leaving nothing."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from store.artifacts import dataset_path

from tests.api.helpers import UPLOAD_LIMIT, assert_error


def _jsonl(n: int) -> bytes:
    return b"".join(json.dumps({"prompt": f"{i}+1=?", "answer": str(i + 1)}).encode() + b"\n"
                    for i in range(n))


def _stored_files(settings) -> list[Path]:
    """Every file under the datasets folder, temp files included."""
    folder = dataset_path(settings, "x").parent
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_upload_stores_the_file_and_its_row(client, auth, settings):
    data = _jsonl(7)
    resp = client.post("/v1/datasets", headers=auth, data={"name": "sums"},
                       files={"file": ("sums.jsonl", data, "application/jsonl")})
    assert resp.status_code == 201, resp.text
    ds = resp.json()
    assert ds["object"] == "dataset" and ds["id"].startswith("ds_") and ds["name"] == "sums"
    assert ds["rows"] == 7 and ds["bytes"] == len(data)
    assert ds["sha256"] == hashlib.sha256(data).hexdigest()
    assert "uri" not in ds and "tenant_id" not in ds  # internals stay internal
    assert dataset_path(settings, ds["id"]).read_bytes() == data
    assert _stored_files(settings) == [dataset_path(settings, ds["id"])]  # no temp left over
    assert client.get(f"/v1/datasets/{ds['id']}", headers=auth).json() == ds
    listing = client.get("/v1/datasets", headers=auth).json()
    assert listing["object"] == "list" and [d["id"] for d in listing["data"]] == [ds["id"]]


def test_name_defaults_to_the_file_name_and_lists_are_newest_first(client, auth):
    ids = []
    for i in range(3):
        resp = client.post("/v1/datasets", headers=auth, files={"file": (f"f{i}.jsonl", _jsonl(2))})
        assert resp.json()["name"] == f"f{i}.jsonl"
        ids.append(resp.json()["id"])
    page = client.get("/v1/datasets?limit=2", headers=auth).json()
    assert [d["id"] for d in page["data"]] == ids[::-1][:2] and page["has_more"] is True


def test_over_the_limit_is_413_and_nothing_is_stored(client, auth, settings):
    big = _jsonl(UPLOAD_LIMIT // 30 + 100)
    assert len(big) > UPLOAD_LIMIT
    resp = client.post("/v1/datasets", headers=auth, files={"file": ("big.jsonl", big)})
    err = assert_error(resp, 413, "payload_too_large")
    assert str(UPLOAD_LIMIT) in err["message"]
    assert _stored_files(settings) == []
    assert client.get("/v1/datasets", headers=auth).json()["data"] == []


def test_content_length_over_the_limit_is_refused_before_reading(client, auth):
    # A streamed body with a lying, huge Content-Length: refused up front.
    headers = {**auth, "Content-Type": "multipart/form-data; boundary=xyz",
               "Content-Length": str(10 * UPLOAD_LIMIT)}
    resp = client.post("/v1/datasets", headers=headers, content=b"--xyz--\r\n")
    assert_error(resp, 413)


def test_malformed_line_is_422_naming_it_and_nothing_is_stored(client, auth, settings):
    lines = _jsonl(2) + b'{"question": "no prompt here", "answer": "1"}\n' + _jsonl(2)
    resp = client.post("/v1/datasets", headers=auth, files={"file": ("bad.jsonl", lines)})
    err = assert_error(resp, 422, "validation_error", field="file")
    assert "line 3" in err["message"], err
    assert _stored_files(settings) == []
    assert client.get("/v1/datasets", headers=auth).json()["data"] == []


def test_not_json_and_empty_files_are_422(client, auth, settings):
    for content, where in [(_jsonl(1) + b"{oops\n", "line 2"), (b"", "dataset"),
                           (b"\xff\xfe\n", "line 1")]:
        resp = client.post("/v1/datasets", headers=auth, files={"file": ("x.jsonl", content)})
        err = assert_error(resp, 422)
        assert where in err["message"], err
    assert _stored_files(settings) == []


def test_malformed_requests(client, auth):
    no_file = client.post("/v1/datasets", headers=auth, data={"name": "x"},
                          files={"other": ("x", b"1")})
    assert_error(no_file, 422, field="file")
    not_multipart = client.post("/v1/datasets", headers=auth, json={"file": "x"})
    assert_error(not_multipart, 415)
    long_name = client.post("/v1/datasets", headers=auth, data={"name": "n" * 201},
                            files={"file": ("x.jsonl", _jsonl(1))})
    assert_error(long_name, 422, field="name")


def test_other_tenants_dataset_is_404(client, auth, other_auth):
    ds = client.post("/v1/datasets", headers=auth, files={"file": ("d.jsonl", _jsonl(1))}).json()
    assert_error(client.get(f"/v1/datasets/{ds['id']}", headers=other_auth), 404, "not_found")
    assert_error(client.get("/v1/datasets/ds_unknown", headers=auth), 404, "not_found")
    assert client.get("/v1/datasets", headers=other_auth).json()["data"] == []


def test_concurrent_uploads_are_capped_per_tenant(settings, enqueued, key, other_key):
    # One tenant's parallel uploads share the API's cores with everyone: at most
    # `max_concurrent_uploads_per_tenant` at a time, the next is a 429 at once.
    import httpx

    from api.app import create_app
    from tests.api.live import serve, stalled_upload

    app = create_app(settings.model_copy(update={"max_concurrent_uploads_per_tenant": 2}),
                     enqueue=enqueued)
    with serve(app) as url:
        socks = [stalled_upload(url, key) for _ in range(2)]
        try:
            time.sleep(0.5)
            files = {"file": ("d.jsonl", _jsonl(2))}
            resp = httpx.post(f"{url}/v1/datasets", headers={"Authorization": f"Bearer {key}"},
                              files=files, timeout=10)
            err = assert_error(resp, 429, "quota_exceeded")
            assert "at most 2 uploads in progress per tenant" in err["message"]
            other = httpx.post(f"{url}/v1/datasets", files=files, timeout=10,
                               headers={"Authorization": f"Bearer {other_key}"})
            assert other.status_code == 201, other.text  # another tenant is not affected
        finally:
            for sock in socks:
                sock.close()
        time.sleep(0.5)  # the slots free up when the uploads end
        resp = httpx.post(f"{url}/v1/datasets", headers={"Authorization": f"Bearer {key}"},
                          files={"file": ("d.jsonl", _jsonl(2))}, timeout=10)
        assert resp.status_code == 201, resp.text


def test_rows_need_no_answer_and_may_carry_any_json(client, auth):
    # A grader reads whichever fields it names; `answer` is only needed by what reads it.
    rows = b'{"prompt": "p1", "tests": [{"stdin": "1", "stdout": "1"}], "meta": {"a": [1]}}\n'
    resp = client.post("/v1/datasets", headers=auth, files={"file": ("g.jsonl", rows * 2)})
    assert resp.status_code == 201, resp.text
    assert resp.json()["rows"] == 2
