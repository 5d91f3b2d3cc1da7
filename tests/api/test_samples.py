"""GET /v1/jobs/{id}/samples: a job's stored rollouts, tenant-scoped, filtered and paged."""

from __future__ import annotations

from store import jobs as store_jobs
from store.db import session_scope

from tests.api.helpers import assert_error, make_spec


def _row(reward: float, text: str) -> dict:
    return {"prompt": "Q: 1+1", "completion": text, "reward": reward, "correct": reward == 1.0,
            "truncated": False, "advantage": reward - 0.5, "sub_rewards": {}}


def test_samples_route(client, auth, other_auth, database_url):
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    with session_scope(database_url) as s:
        attempt = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60).attempt
    with session_scope(database_url) as s:
        store_jobs.record_samples(s, job_id, attempt, 1, [_row(1.0, "2"), _row(0.0, "3")], 10**6)
        store_jobs.record_samples(s, job_id, attempt, 2, [_row(1.0, "<answer>2</answer>")], 10**6)
    page = client.get(f"/v1/jobs/{job_id}/samples", headers=auth).json()
    assert page["object"] == "list" and page["has_more"] is False
    assert [(r["step"], r["completion"], r["object"]) for r in page["data"]] == [
        (2, "<answer>2</answer>", "job.sample"), (1, "2", "job.sample"), (1, "3", "job.sample")]
    step1 = client.get(f"/v1/jobs/{job_id}/samples?step=1&max_reward=0.5", headers=auth).json()
    assert [r["completion"] for r in step1["data"]] == ["3"]
    first = client.get(f"/v1/jobs/{job_id}/samples?limit=2", headers=auth).json()
    assert first["has_more"] is True
    rest = client.get(f"/v1/jobs/{job_id}/samples?after={first['data'][-1]['id']}", headers=auth).json()
    assert [r["completion"] for r in rest["data"]] == ["3"]
    assert_error(client.get(f"/v1/jobs/{job_id}/samples", headers=other_auth), 404)
    assert_error(client.get(f"/v1/jobs/{job_id}/samples?limit=0", headers=auth), 422)
    assert_error(client.get("/v1/jobs/job_nope/samples", headers=auth), 404)
