"""Hostile specs and parameters: size limits, NaN/Infinity, out-of-range integers, all 422/413."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from store.settings import Settings
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
    ({"resources": {"gpus_per_node": 1000}}, "resources.gpus_per_node"),
    ({"resources": {"nodes": 2}}, "resources.nodes"),  # multi-node: only with a Ray cluster (below)
    # Default BRORL_GPU_COUNTS=1: no worker serves 2 GPUs (test_gpu_counts_* below).
    ({"resources": {"gpus_per_node": 2}}, "resources.gpus_per_node"),
])
def test_lists_strings_and_numbers_in_the_spec_are_bounded(client, auth, section, field):
    assert_error(client.post("/v1/jobs", json=make_spec(**section), headers=auth), 422,
                 field=field)


def test_gpu_counts_no_worker_serves_are_422_naming_the_served_ones(client, auth, enqueued):
    resp = client.post("/v1/jobs", json=make_spec(resources={"gpus_per_node": 2}), headers=auth)
    err = assert_error(resp, 422, field="resources.gpus_per_node")
    assert err["message"] == ("resources.gpus_per_node: 2 GPUs asked; this deployment's "
                              "workers serve 1 (BRORL_GPU_COUNTS)")
    assert enqueued == [] and client.get("/v1/jobs", headers=auth).json()["data"] == []


def test_gpu_counts_served_are_accepted_on_their_own_queue(settings, enqueued, auth,
                                                          monkeypatch):
    monkeypatch.setenv("BRORL_GPU_COUNTS", "1,2")
    served = settings.model_copy(update={"gpu_counts": Settings().gpu_counts})
    with TestClient(create_app(served, enqueue=enqueued)) as client:
        two = client.post("/v1/jobs", json=make_spec(resources={"gpus_per_node": 2}), headers=auth)
        one = client.post("/v1/jobs", json=make_spec(), headers=auth)
        four = client.post("/v1/jobs", json=make_spec(resources={"gpus_per_node": 4}),
                           headers=auth)
    assert two.status_code == 201 and one.status_code == 201, (two.text, one.text)
    assert enqueued.queues == {two.json()["id"]: "gpu-2", one.json()["id"]: "gpu"}
    err = assert_error(four, 422, field="resources.gpus_per_node")
    assert "serve 1, 2 (BRORL_GPU_COUNTS)" in err["message"]


def test_many_nodes_only_where_a_ray_cluster_serves_their_shape(settings, enqueued, auth):
    two_nodes = make_spec(resources={"nodes": 2})
    with TestClient(create_app(settings, enqueue=enqueued)) as client:
        err = assert_error(client.post("/v1/jobs", json=two_nodes, headers=auth), 422, field="resources.nodes")
    assert "BRORL_RAY_ADDRESS and BRORL_RAY_MAX_NODES" in err["message"]
    served = settings.model_copy(update={"ray_address": "head:6379", "ray_max_nodes": 4,
                                         "ray_gpus_per_node": 2, "gpu_counts": (1, 2, 4)})
    with TestClient(create_app(served, enqueue=enqueued)) as client:
        two = client.post("/v1/jobs", json=two_nodes, headers=auth)
        five = client.post("/v1/jobs", json=make_spec(resources={"nodes": 5}), headers=auth)
        wide = client.post("/v1/jobs", json=make_spec(resources={"nodes": 2, "gpus_per_node": 4}), headers=auth)
        assert two.status_code == 201, two.text
        assert enqueued.queues == {two.json()["id"]: "ray"}  # driven by a Ray driver worker, not a GPU worker
        enqueued.queues.clear()  # paused and resumed: back to the same queue
        assert client.post(f"/v1/jobs/{two.json()['id']}/pause", headers=auth).json()["status"] == "paused"
        assert client.post(f"/v1/jobs/{two.json()['id']}/resume", headers=auth).json()["status"] == "queued"
    assert enqueued.queues == {two.json()["id"]: "ray"}
    assert "at most 4 (BRORL_RAY_MAX_NODES)" in assert_error(five, 422, field="resources.nodes")["message"]
    err = assert_error(wide, 422, field="resources.gpus_per_node")
    assert "Ray nodes have 2 (BRORL_RAY_GPUS_PER_NODE)" in err["message"]


def test_job_list_leaves_the_spec_out(client, auth):
    spec = make_spec()
    job = client.post("/v1/jobs", json=spec, headers=auth).json()
    listed = client.get("/v1/jobs", headers=auth).json()["data"]
    assert [j["id"] for j in listed] == [job["id"]] and "spec" not in listed[0]
    # ...but an overview of it: what a jobs list (the dashboard's) shows.
    overview = listed[0]["overview"]
    assert overview["model"] == spec["model"]["path"]
    assert [st["n"] for st in overview["schedule"]] == [st["n"] for st in spec["rollout"]["schedule"]]
    assert job["overview"] == overview
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


# --------------------------------------------------------------------------- uploads


def _upload(client, auth, content: bytes, **data):
    return client.post("/v1/datasets", headers=auth, data=data,
                       files={"file": ("d.jsonl", content)})


def test_dataset_line_nested_50000_deep_is_422(client, auth):
    line = b'{"prompt": "p", "answer": "a", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n"
    app_limit = client.app.state.settings
    app_limit.max_upload_bytes = 1024 * 1024
    err = assert_error(_upload(client, auth, line), 422, field="file")
    assert "line 1" in err["message"] and "nested too deeply" in err["message"]


def test_dataset_line_longer_than_the_cap_is_422(client, auth):
    client.app.state.settings.max_dataset_line_bytes = 100
    ok = b'{"prompt": "1+1", "answer": "2"}\n'
    long = b'{"prompt": "' + b"x" * 200 + b'", "answer": "2"}\n'
    err = assert_error(_upload(client, auth, ok + long), 422, field="file")
    assert err["message"] == "invalid dataset: line 2: is longer than 100 bytes"
    assert _upload(client, auth, ok * 3).json()["rows"] == 3


def test_form_fields_count_against_the_upload_limit(client, auth, monkeypatch):
    import api.upload

    monkeypatch.setattr(api.upload, "MULTIPART_OVERHEAD", 2048)  # boundaries, part headers
    limit = client.app.state.settings.max_upload_bytes  # 64 KiB in these tests
    fields = {f"f{i}": "x" * 4000 for i in range(7)}  # 7 fields: under the part cap
    ok = b'{"prompt": "1+1", "answer": "2"}\n'
    # The file alone fits the limit; with 28 kB of fields the body does not.
    big = ok * ((limit - 10_000) // len(ok))
    assert _upload(client, auth, big).status_code == 201
    assert_error(_upload(client, auth, big, **fields), 413)
    fields = {f"f{i}": "x" for i in range(20)}
    err = assert_error(_upload(client, auth, ok, **fields), 422)
    assert "parts" in err["message"]


# --------------------------------------------------------------------------- quotas


def test_active_job_quota(client, auth, other_auth):
    client.app.state.settings.max_active_jobs_per_tenant = 2
    first = client.post("/v1/jobs", json=make_spec(), headers={**auth, "Idempotency-Key": "a"})
    assert client.post("/v1/jobs", json=make_spec(), headers=auth).status_code == 201
    err = assert_error(client.post("/v1/jobs", json=make_spec(), headers=auth), 429,
                       "quota_exceeded")
    assert "at most 2" in err["message"]
    # A replay of an existing job still answers; other tenants are not affected.
    replay = client.post("/v1/jobs", json=make_spec(), headers={**auth, "Idempotency-Key": "a"})
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    assert client.post("/v1/jobs", json=make_spec(), headers=other_auth).status_code == 201
    # Cancelling frees a slot.
    client.post(f"/v1/jobs/{first.json()['id']}/cancel", headers=auth)
    assert client.post("/v1/jobs", json=make_spec(), headers=auth).status_code == 201


def test_dataset_quotas(client, auth):
    settings = client.app.state.settings
    ok = b'{"prompt": "1+1", "answer": "2"}\n'
    settings.max_datasets_per_tenant = 1
    assert _upload(client, auth, ok).status_code == 201
    assert_error(_upload(client, auth, ok), 429, "quota_exceeded")
    settings.max_datasets_per_tenant = 10
    settings.max_dataset_bytes_per_tenant = len(ok) * 2
    err = assert_error(_upload(client, auth, ok * 2), 429, "quota_exceeded")
    assert "bytes" in err["message"]
    assert client.get("/v1/datasets", headers=auth).json()["data"][0]["rows"] == 1


# --------------------------------------------------------------------------- model paths


def test_model_paths_are_limited_to_allowed_roots(client, auth, tmp_path):
    settings = client.app.state.settings
    root = tmp_path / "models"
    (root / "qwen").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")

    def submit(path: str):
        return client.post("/v1/jobs", json=make_spec(model={"path": path}), headers=auth)

    for path in ("/etc/passwd", str(root / "qwen"), "Qwen/Qwen2.5-0.5B", "../x", "a b"):
        assert_error(submit(path), 422, field="model.path")
    settings.model_roots = str(root)
    assert submit(str(root / "qwen")).status_code == 201
    for path in (str(root / "escape"), str(root / ".." / "outside"), "/etc/passwd"):
        err = assert_error(submit(path), 422, field="model.path")
        assert "allowed model root" in err["message"]
    err = assert_error(submit("Qwen/Qwen2.5-0.5B"), 422, field="model.path")
    assert "BRORL_ALLOW_HUB_MODELS" in err["message"]
    settings.allow_hub_models = True
    assert submit("Qwen/Qwen2.5-0.5B").status_code == 201


def test_upload_validation_holds_one_line_at_a_time(tmp_path):
    import tracemalloc

    from trainer.tasks.dataset_task import count_valid_rows

    path = tmp_path / "big.jsonl"
    line = b'{"prompt": "what is 12345 + 67890?", "answer": "80235"}\n'
    path.write_bytes(line * (10 * 1024 * 1024 // len(line)))  # 10 MiB, ~190k rows
    tracemalloc.start()
    with path.open("rb") as fh:
        rows = count_valid_rows(fh, 1024 * 1024)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rows == 10 * 1024 * 1024 // len(line)
    assert peak < 2 * 1024 * 1024, peak  # every row kept: ~100 MiB
