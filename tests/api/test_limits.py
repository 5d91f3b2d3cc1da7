"""Hostile specs and parameters: size limits, NaN/Infinity, out-of-range integers, all 422/413."""

from __future__ import annotations

import json

import pytest

from tests.api.helpers import assert_error, make_spec

BIG = 2**63


@pytest.mark.parametrize("section,field", [
    ({"optim": {"weight_decay": "Infinity"}}, "optim.weight_decay"),
    ({"algo": {"truncated_reward": "NaN"}}, "algo.truncated_reward"),
    ({"optim": {"lr": "-Infinity"}}, "optim.lr"),
    ({"algo": {"is_truncation": [0.5, "Infinity"]}}, "algo.is_truncation.1"),
])
def test_nan_and_infinity_are_refused(client, auth, enqueued, section, field):
    # The JSON literals NaN / Infinity, as Python's json writes them.
    body = json.dumps(make_spec(**section)).replace('"Infinity"', "Infinity").replace(
        '"-Infinity"', "-Infinity").replace('"NaN"', "NaN")
    resp = client.post("/v1/jobs", content=body,
                       headers={**auth, "Content-Type": "application/json"})
    assert_error(resp, 422, "validation_error", field=field)
    assert enqueued == []


def test_oversized_json_body_is_413_before_parsing(client, auth):
    spec = make_spec(eval={"samples_per_prompt": 16, "k": [1] * 400_000})
    err = assert_error(client.post("/v1/jobs", json=spec, headers=auth), 413)
    assert "limit" in err["message"]


@pytest.mark.parametrize("section,field", [
    ({"eval": {"samples_per_prompt": 16, "k": [1] * 17}}, "eval.k"),
    ({"task": {"reasoning_gym": {"name": "chain_sum", "config": {"junk": "x" * 20_000}}}},
     "task.reasoning_gym.config"),
    ({"checkpoint": {"every": 1, "keep_last": 10**40}}, "checkpoint.keep_last"),
    ({"limits": {"max_wall_seconds": 10**12}}, "limits.max_wall_seconds"),
])
def test_lists_strings_and_numbers_in_the_spec_are_bounded(client, auth, section, field):
    assert_error(client.post("/v1/jobs", json=make_spec(**section), headers=auth), 422,
                 field=field)


def test_job_list_leaves_the_spec_out(client, auth):
    job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()
    listed = client.get("/v1/jobs", headers=auth).json()["data"]
    assert [j["id"] for j in listed] == [job["id"]] and "spec" not in listed[0]
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth).json()["spec"]["name"]


@pytest.mark.parametrize("path,params,headers,field", [
    ("events", {"after": BIG}, {}, "query.after"),
    ("metrics", {"after_step": 10**30}, {}, "query.after_step"),
    ("metrics/stream", {}, {"Last-Event-ID": str(10**30)}, "Last-Event-ID"),
    ("metrics/stream", {"after_step": -(10**30)}, {}, "query.after_step"),
])
def test_out_of_range_integers_are_422(client, auth, path, params, headers, field):
    job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    resp = client.get(f"/v1/jobs/{job}/{path}", params=params, headers={**auth, **headers})
    assert_error(resp, 422, "validation_error", field=field)


def test_deeply_nested_json_body_is_a_clean_4xx(client, auth):
    body = "[" * 50_000 + "]" * 50_000
    resp = client.post("/v1/jobs", content=body,
                       headers={**auth, "Content-Type": "application/json"})
    assert 400 <= resp.status_code < 500, resp.text
    assert_error(resp, resp.status_code)
