"""Continuing a job from a checkpoint over the API: `continue_from` is resolved at submission
(the caller's job only, its checkpoint's step fixed, the parent's model filled in), the child
records its parent and the parent lists its continuations, and `GET .../continuation?broad=true`
gives BroRL's plateau -> broad spec. The training side is tests/trainer/test_continue.py."""
from __future__ import annotations

import pytest

from store import jobs as store_jobs
from store.db import session_scope
from tests.api.helpers import assert_error, make_spec

LORA_MODEL = {"path": "builtin:tiny", "lora": {"rank": 8, "alpha": 16}}


def _with_checkpoints(client, auth, database_url, tmp_path, steps, **spec) -> str:
    job_id = client.post("/v1/jobs", json=make_spec(**spec), headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60)
        for step in steps:
            folder = tmp_path / job_id / f"step-{step}"
            folder.mkdir(parents=True)
            store_jobs.record_checkpoint(s, job_id, claim.attempt, step, str(folder), 1, "0" * 64)
    return job_id


def _continue(client, auth, ref, **spec):
    body = make_spec(continue_from=ref, **spec)
    if "model" not in spec:
        del body["model"]  # left out: the parent's
    return client.post("/v1/jobs", json=body, headers=auth)


def test_a_continuation_records_its_parent_and_the_resolved_step(client, auth, database_url, tmp_path, enqueued):
    parent = _with_checkpoints(client, auth, database_url, tmp_path, [2, 4], model=LORA_MODEL)
    resp = _continue(client, auth, {"job": parent})  # newest, and the parent's model filled in
    assert resp.status_code == 201, resp.text
    child = resp.json()
    assert child["parent_job_id"] == parent and child["id"] in enqueued
    assert child["spec"]["continue_from"] == {"job": parent, "step": 4, "optimizer": False}
    assert child["spec"]["model"]["lora"]["rank"] == 8
    at_two = _continue(client, auth, {"job": parent, "step": 2, "optimizer": True}).json()
    assert at_two["spec"]["continue_from"]["step"] == 2
    listed = client.get(f"/v1/jobs/{parent}/continuations", headers=auth).json()["data"]
    assert [j["id"] for j in listed] == [child["id"], at_two["id"]]
    assert client.get(f"/v1/jobs/{child['id']}", headers=auth).json()["parent_job_id"] == parent


def test_what_cannot_be_continued_is_refused(client, auth, other_auth, database_url, tmp_path, enqueued):
    parent = _with_checkpoints(client, auth, database_url, tmp_path, [2])
    assert_error(_continue(client, other_auth, {"job": parent}), 404)  # another tenant's job
    assert_error(_continue(client, auth, {"job": "job_01NOPE"}), 404)
    assert_error(_continue(client, auth, {"job": parent, "step": 3}), 422, field="continue_from.step")
    empty = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    assert_error(_continue(client, auth, {"job": empty}), 422, field="continue_from.step")
    assert_error(_continue(client, auth, {"job": parent}, model=LORA_MODEL), 422, field="model")
    assert _continue(client, auth, {"job": parent}, model={"path": "builtin:tiny", "dtype": "float32"}).status_code == 201
    assert_error(_continue(client, auth, {"job": parent, "optimizer": True}, optim={"optimizer_state": "8bit"}),
                 422, field="continue_from.optimizer")
    listed = client.get(f"/v1/jobs/{parent}/continuations", headers=auth).json()["data"]
    assert len(listed) == 1  # only the one accepted (same weights, float32 compute)
    assert_error(client.get(f"/v1/jobs/{parent}/continuations", headers=other_auth), 404)


@pytest.mark.parametrize("broad", [False, True])
def test_the_continuation_spec_continues_narrow_or_broad(client, auth, database_url, tmp_path, broad):
    parent = _with_checkpoints(client, auth, database_url, tmp_path, [5])
    spec = client.get(f"/v1/jobs/{parent}/continuation?broad={str(broad).lower()}", headers=auth).json()["spec"]
    last = make_spec()["rollout"]["schedule"][-1]
    assert spec["continue_from"] == {"job": parent, "step": None, "optimizer": False}
    stage = spec["rollout"]["schedule"][-1]
    if broad:  # n x 4, same prompts, for as many steps, lr by the parent's rule for that batch
        assert spec["rollout"]["schedule"] == [{"n": last["n"] * 4, "prompts_per_step": last["prompts_per_step"],
                                                "steps": last["steps"]}]
        assert spec["optim"]["lr"] >= make_spec().get("optim", {}).get("lr", 1e-6)
    else:
        assert stage["n"] == last["n"]
    created = client.post("/v1/jobs", json=spec, headers=auth)  # the template submits as it is
    assert created.status_code == 201, created.text
    assert created.json()["parent_job_id"] == parent


def test_a_job_without_a_checkpoint_has_no_continuation_yet(client, auth):
    job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    assert_error(client.get(f"/v1/jobs/{job}/continuation", headers=auth), 409)


def test_latest_names_the_newest_checkpoint_as_null_does(client, auth, database_url, tmp_path, enqueued):
    parent = _with_checkpoints(client, auth, database_url, tmp_path, [2, 6, 4])
    resp = _continue(client, auth, {"job": parent, "step": "latest"})
    assert resp.status_code == 201, resp.text
    assert resp.json()["spec"]["continue_from"] == {"job": parent, "step": 6, "optimizer": False}
    # the stored spec names the step it found: a later checkpoint does not move this child
    err = assert_error(_continue(client, auth, {"job": parent, "step": "newest"}), 422)
    assert "continue_from" in err.get("field", "") + err["message"] and "latest" in err["message"], err
    assert_error(_continue(client, auth, {"job": parent, "step": -1}), 422)
    empty = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    err = assert_error(_continue(client, auth, {"job": empty, "step": "latest"}), 422, field="continue_from.step")
    assert "no checkpoint" in err["message"]
