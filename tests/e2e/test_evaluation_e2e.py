"""Evaluations through `brorl up` (SQLite, SQLite broker, the API and one real worker process):
a job's checkpoints and its base sampled on held-out prompts, driven over HTTP and the CLI.

The job runs the fake trainer (seconds); its checkpoint folders are then given real weights:
step 1 the very model the job started from (the suite's warm-started builtin:tiny, named as a
folder under BRORL_MODEL_ROOTS), step 3 an untrained builtin:tiny. So the evaluation must find
step 1 identical to the base, sample for sample (same weights, same draws: a delta of exactly
zero), and step 3 no better than an untrained model, losing every prompt the base solved.
"""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from store import keys
from store.db import reset_engine_cache, session_scope
from tests.support.jobs import FAKE_ENTRYPOINT, make_spec
from tests.support.tinyprebuild import SHARED_SEED, shared_model_dir, shared_task
from tests.support.upstack import Stack, running_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
BODY = {"checkpoints": [1, "latest"], "n": 8, "prompts": 8, "k": [1, 8], "temperature": 0.3, "chunk_samples": 32}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Stack, Path]]:
    model_dir = shared_model_dir()
    with running_stack(tmp_path_factory.mktemp("evaluations"), {
            "BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT, "BRORL_MODEL_ROOTS": str(model_dir.parent),
            "BRORL_HEARTBEAT_SECONDS": "0.5", "BRORL_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}) as st:
        yield st, model_dir


def _client(stack: Stack, key: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key or stack.key}"}, timeout=30)


def _wait(client: httpx.Client, url: str, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        row = client.get(url).json()
        if row["status"] not in ("queued", "running"):
            return row
        assert time.monotonic() < deadline, row
        time.sleep(0.5)


@pytest.fixture(scope="module")
def job(stack) -> str:
    """A succeeded job with checkpoints at steps 1, 2 and 3: step 1 = its base, step 3 = untrained."""
    from trainer.models.tiny import build_untrained, save_folder

    st, model_dir = stack
    spec = make_spec("evaluated ckpt")
    spec.update({"seed": SHARED_SEED, "model": {"path": str(model_dir)}, "task": shared_task(),
                 "checkpoint": {"every": 0, "keep_last": 3}})
    with _client(st) as client:
        created = client.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        assert _wait(client, f"/v1/jobs/{job_id}", 120)["status"] == "succeeded", st.output()[-3000:]
    ckpts = st.data_dir / "artifacts" / "jobs" / job_id / "attempt-1" / "checkpoints"
    shutil.rmtree(ckpts / "step-00000001")
    shutil.copytree(model_dir, ckpts / "step-00000001")
    model, tokenizer = build_untrained(3)
    save_folder(model, tokenizer, ckpts / "step-00000003")
    return job_id


def test_checkpoints_against_the_base_through_the_worker(stack, job):
    st, _ = stack
    client = _client(st)
    created = client.post(f"/v1/jobs/{job}/evaluations", json=BODY)
    assert created.status_code == 201, created.text
    ev = created.json()
    assert ev["checkpoints"] == [1, 3] and ev["status"] == "queued"
    row = _wait(client, f"/v1/evaluations/{ev['id']}")
    assert row["status"] == "succeeded", (row, st.output()[-3000:])
    assert row["step"] == row["total_steps"] == 3 * 8 * 8
    events = client.get(f"/v1/evaluations/{ev['id']}/events", params={"limit": 1000}).json()["data"]
    assert [e["type"] for e in events][:2] == ["created", "started"] and events[-1]["type"] == "succeeded"
    models_in_progress = [e["data"]["model"] for e in events if e["type"] == "progress"]
    assert models_in_progress == ["base"] * 2 + ["step 1"] * 2 + ["step 3"] * 2  # 64 samples each, 32 a chunk

    result = row["result"]
    base, same, untrained = result["models"]
    assert [m["label"] for m in result["models"]] == ["base", "step 1", "step 3"]
    assert result["prompts"] == 8 and result["k"] == [1, 8] and len(result["prompt_texts"]) == 8
    # Step 1 holds the base's weights: the same draws give the same answers, to the sample.
    assert same["correct"] == base["correct"]
    assert same["delta"] == {k: {"mean": 0.0, "lo": 0.0, "hi": 0.0} for k in ("1", "8")}
    assert same["changes"] == {"gained": [], "lost": [], "better": 0, "worse": 0}
    assert base["delta"] is None and base["changes"] is None
    # The untrained model: every prompt the base solved and it did not is lost; the delta adds up.
    lost = [i for i, (b, u) in enumerate(zip(base["correct"], untrained["correct"])) if b > 0 and u == 0]
    assert untrained["changes"]["lost"] == lost
    for k in ("1", "8"):
        d = untrained["delta"][k]
        assert d["mean"] == pytest.approx(untrained["pass_at_k"][k]["mean"] - base["pass_at_k"][k]["mean"])
        assert d["lo"] <= d["mean"] <= d["hi"]
        assert base["pass_at_k"][k]["lo"] <= base["pass_at_k"][k]["mean"] <= base["pass_at_k"][k]["hi"]
    assert sum(base["correct"]) > sum(untrained["correct"]), (base["correct"], untrained["correct"])
    assert result["best"]["step"] == 1
    # The job lists it; another tenant sees nothing of it.
    assert [e["id"] for e in client.get(f"/v1/jobs/{job}/evaluations").json()["data"]] == [ev["id"]]
    with session_scope(f"sqlite:///{st.data_dir / 'brorl.db'}") as s:
        other = keys.create_key(s, "other-tenant")
    reset_engine_cache()
    with _client(st, other) as foreign:
        assert foreign.get(f"/v1/evaluations/{ev['id']}").status_code == 404
        assert foreign.post(f"/v1/jobs/{job}/evaluations", json=BODY).status_code == 404

    shown = st.brorl("evaluation", "show", ev["id"], key=st.key)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = " ".join(shown.stdout.split())
    assert "pass@1" in text and "step 1 *best*" in text and "step 3" in text and "best: step 1" in text


def test_the_cli_evaluates_and_waits(stack, job):
    st, _ = stack
    out = st.brorl("evaluate", job, "-c", "1", "--no-base", "--n", "2", "--prompts", "2", "--k", "2",
                   "--poll", "0.5", key=st.key, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "evaluation evl_" in text and "pass@2" in text and "step 1" in text
    assert "vs base" not in text  # no base, no deltas
    refused = st.brorl("evaluate", job, "-c", "2", "-c", "7", key=st.key)
    assert refused.returncode == 1 and "no checkpoint at step 7" in " ".join(refused.stderr.split())


def test_the_cli_evaluates_on_an_uploaded_dataset(stack, job, tmp_path):
    """`brorl evaluate --dataset`: the held-out rows of an uploaded set in place of the job's
    eval split; the result names the dataset and has its pass@k rows."""
    st, _ = stack
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(f'{{"prompt": "{a}+{b}=?", "answer": "{a + b}"}}\n'
                            for a in range(1, 9) for b in range(1, 6)))  # 40 rows: 2 held out
    with _client(st) as client, open(data, "rb") as fh:
        uploaded = client.post("/v1/datasets", files={"file": ("sums.jsonl", fh, "application/jsonl")})
        assert uploaded.status_code == 201, uploaded.text
        dataset = uploaded.json()["id"]
    out = st.brorl("evaluate", job, "--checkpoints", "1", "--no-base", "--dataset", dataset, "--n", "2",
                   "--k", "2", "--poll", "0.5", "--json", key=st.key, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout[out.stdout.index("{"):])
    assert result["task"] == {"dataset": dataset}
    assert result["prompts"] == len(result["prompt_texts"]) >= 1
    assert all(text.endswith("=?") for text in result["prompt_texts"]), result["prompt_texts"]  # its rows
    (model,) = result["models"]
    assert model["label"] == "step 1" and result["k"] == [1, 2]
    for k in ("1", "2"):
        row = model["pass_at_k"][k]
        assert 0 <= row["lo"] <= row["mean"] <= row["hi"] <= 1, row
    with _client(st) as client:
        (latest, *_) = client.get(f"/v1/jobs/{job}/evaluations").json()["data"]
    assert latest["spec"]["task"]["dataset"]["id"] == dataset
