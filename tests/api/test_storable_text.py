"""Text PostgreSQL cannot store (NUL, lone surrogates) is a 422 or a 404, on both databases.

Each request below was a 500 on PostgreSQL ("text fields cannot contain NUL") and a 201/200
on SQLite before the edge checks; `client` runs every test on both.
"""

from __future__ import annotations

import json

import pytest

from tests.api.helpers import assert_error, make_spec


def _post_raw(client, auth, body: str, **headers):
    return client.post("/v1/jobs", content=body.encode("utf-8", "surrogatepass"),
                       headers={**auth, "Content-Type": "application/json", **headers})


@pytest.mark.parametrize("where, spec, field", [
    ("job name", make_spec(name="a\x00b"), "name"),
    ("model path", make_spec(model={"path": "gpt2\x00"}), "model.path"),
    ("task config value", make_spec(task={"reasoning_gym": {
        "name": "basic_arithmetic", "config": {"operators": ["+", "\x00"]}}}),
     "task.reasoning_gym.config.operators.1"),
    ("prompt template", make_spec(task={"reasoning_gym": {"name": "chain_sum"},
                                        "prompt_template": "{question}\x00"}),
     "task.prompt_template"),
])
def test_nul_in_the_spec_is_422_naming_the_field(client, auth, enqueued, where, spec, field):
    err = assert_error(client.post("/v1/jobs", json=spec, headers=auth), 422,
                       "validation_error", field=field)
    assert "NUL" in err["message"], err
    assert enqueued == []


def test_a_lone_surrogate_in_the_spec_is_422(client, auth):
    body = json.dumps(make_spec(name="x")).replace('"name": "x"', '"name": "\\ud800"')
    err = assert_error(_post_raw(client, auth, body), 422, "validation_error", field="name")
    assert "surrogate" in err["message"]


def test_nul_in_the_idempotency_key_is_422(client, auth):
    resp = _post_raw(client, auth, json.dumps(make_spec()), **{"Idempotency-Key": "k\x00"})
    assert_error(resp, 422, field="header.idempotency-key")


@pytest.mark.parametrize("url, field", [
    ("/v1/jobs?after=%00", "query.after"),
    ("/v1/datasets?after=job_%00", "query.after"),
    ("/v1/jobs?limit=1&status=%00queued", "query.status"),
])
def test_nul_in_a_query_parameter_is_422(client, auth, url, field):
    assert_error(client.get(url, headers=auth), 422, field=field)


@pytest.mark.parametrize("url", ["/v1/jobs/job_%00", "/v1/datasets/ds_%00",
                                 "/v1/jobs/job_%00/events", "/v1/jobs/job_%00/checkpoints"])
def test_nul_in_an_id_is_a_miss(client, auth, url):
    assert_error(client.get(url, headers=auth), 404, "not_found")


def test_nul_in_a_cancel_id_is_a_miss(client, auth):
    assert_error(client.post("/v1/jobs/job_%00/cancel", headers=auth), 404, "not_found")


def test_nul_in_a_dataset_name_is_422(client, auth):
    data = b'{"prompt": "1+1", "answer": "2"}\n'
    resp = client.post("/v1/datasets", headers=auth, data={"name": "my\x00data"},
                       files={"file": ("ok.jsonl", data, "application/jsonl")})
    assert_error(resp, 422, field="name")
    assert client.get("/v1/datasets", headers=auth).json()["data"] == []
