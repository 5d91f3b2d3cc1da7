"""The OpenAI-compatible surface, driven by the official `openai` SDK against a real server
(the app of tests/api/conftest.py served by uvicorn: the SDK speaks its own HTTP client),
on SQLite and PostgreSQL like every API test: files, reinforcement jobs (create, retrieve,
list, cancel, pause, resume, events, checkpoints), the alpha grader routes, OpenAI's errors,
and that the native routes see the same objects."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from store import jobs as store_jobs
from store.artifacts import checkpoint_dir
from store.db import session_scope
from trainer.checkpoints import format as ckpt_format

from tests.api.helpers import make_spec
from tests.api.live import serve

ROWS = [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
         "reference_answer": str(a + b)} for a in range(4) for b in range(3)]
PYTHON_GRADER = {"type": "python", "source": (
    "def grade(sample, item):\n"
    "    return 1.0 if item['reference_answer'] in sample['output_text'] else 0.0\n")}
HP = "method.reinforcement.hyperparameters"


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def base_url(app) -> Iterator[str]:
    with serve(app) as url:
        yield url


@pytest.fixture
def sdk(base_url: str, key: str) -> openai.OpenAI:
    # max_retries=0: a test must see the first answer, not a retried one.
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture
def other_sdk(base_url: str, other_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=other_key, max_retries=0)


@pytest.fixture
def training_file(sdk: openai.OpenAI):
    return sdk.files.create(file=("rft.jsonl", jsonl(ROWS)), purpose="fine-tune")


def rl_method(**hyperparameters) -> dict:
    return {"type": "reinforcement",
            "reinforcement": {"grader": PYTHON_GRADER, "hyperparameters": hyperparameters}}


def create(sdk: openai.OpenAI, training_file, **kwargs):
    kwargs.setdefault("method", rl_method(n_epochs=2, batch_size=4, compute_multiplier=0.5))
    return sdk.fine_tuning.jobs.create(model="builtin:tiny", training_file=training_file.id,
                                       **kwargs)


# --------------------------------------------------------------------------- files


def test_files_upload_list_retrieve_content_delete(sdk, client, auth) -> None:
    up = sdk.files.create(file=("rft.jsonl", jsonl(ROWS)), purpose="fine-tune")
    assert up.object == "file" and up.purpose == "fine-tune" and up.status == "processed"
    assert up.id.startswith("ds_") and up.filename == "rft.jsonl" and up.bytes == len(jsonl(ROWS))
    # The same object as a native dataset.
    native = client.get(f"/v1/datasets/{up.id}", headers=auth).json()
    assert native["rows"] == len(ROWS) and native["bytes"] == up.bytes
    assert [f.id for f in sdk.files.list()] == [up.id]
    assert list(sdk.files.list(purpose="assistants")) == []
    assert sdk.files.retrieve(up.id).bytes == up.bytes
    assert sdk.files.content(up.id).content == jsonl(ROWS)
    gone = sdk.files.delete(up.id)
    assert gone.deleted is True and gone.id == up.id
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(up.id)
    assert client.get(f"/v1/datasets/{up.id}", headers=auth).status_code == 404


def test_file_upload_is_validated_like_a_dataset(sdk) -> None:
    bad = jsonl(ROWS[:2]) + b'{"reference_answer": "1"}\n'
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.files.create(file=("bad.jsonl", bad), purpose="fine-tune")
    assert exc.value.param == "file" and "line 3" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.files.create(file=("rft.jsonl", jsonl(ROWS)), purpose="assistants")
    assert exc.value.param == "purpose"
    assert list(sdk.files.list()) == []  # nothing stored by either


def test_a_file_in_use_is_not_deleted(sdk, training_file) -> None:
    job = create(sdk, training_file)
    with pytest.raises(openai.ConflictError) as exc:
        sdk.files.delete(training_file.id)
    assert job.id in exc.value.message
    sdk.fine_tuning.jobs.cancel(job.id)
    assert sdk.files.delete(training_file.id).deleted


def test_files_are_tenant_scoped(sdk, other_sdk, training_file) -> None:
    with pytest.raises(openai.NotFoundError):
        other_sdk.files.retrieve(training_file.id)
    with pytest.raises(openai.NotFoundError):
        other_sdk.files.delete(training_file.id)
    assert list(other_sdk.files.list()) == []


# --------------------------------------------------------------------------- jobs


def test_create_maps_onto_the_spec(sdk, client, auth, training_file, enqueued) -> None:
    job = create(sdk, training_file, suffix="adder", seed=7, metadata={"team": "math"},
                 method=rl_method(n_epochs=2, batch_size=4, compute_multiplier=0.5,
                                  learning_rate_multiplier=3.0, eval_interval=2,
                                  eval_samples=8, reasoning_effort="medium"))
    assert job.object == "fine_tuning.job" and job.status == "queued"
    assert job.model == "builtin:tiny" and job.training_file == training_file.id
    assert job.seed == 7 and job.metadata == {"team": "math"} and job.fine_tuned_model is None
    assert job.method.type == "reinforcement"
    assert job.method.reinforcement.grader.type == "python"
    assert job.method.reinforcement.hyperparameters.batch_size == 4
    assert job.hyperparameters.n_epochs == 2
    assert enqueued == [job.id]
    spec = client.get(f"/v1/jobs/{job.id}", headers=auth).json()["spec"]
    # 12 rows, one held out: 11 training rows, 2 epochs of batches of 4 -> ceil(22 / 4) steps.
    assert spec["rollout"]["schedule"] == [{"n": 8, "prompts_per_step": 4, "steps": 6}]
    assert spec["rollout"]["max_new_tokens"] == 1024
    assert spec["optim"]["lr"] == pytest.approx(3e-6)
    assert spec["eval"]["every"] == 2 and spec["eval"]["samples_per_prompt"] == 8
    assert spec["eval"]["k"] == [1, 4, 8]
    assert spec["name"] == "adder" and spec["seed"] == 7
    assert spec["task"]["dataset"]["id"] == training_file.id
    assert spec["task"]["grader"]["source"] == PYTHON_GRADER["source"]
    assert spec["task"]["reward"] == "score"
    # A validation file is checked to be the caller's and kept on the job.
    valid = sdk.files.create(file=("valid.jsonl", jsonl(ROWS[:3])), purpose="fine-tune")
    assert create(sdk, training_file, validation_file=valid.id).validation_file == valid.id
    with pytest.raises(openai.NotFoundError) as exc:
        create(sdk, training_file, validation_file="ds_missing")
    assert exc.value.param == "validation_file"


def test_auto_hyperparameters_are_the_defaults(sdk, training_file) -> None:
    """"auto" for every number (the SDK's own default) is accepted: bounds on the union
    used to compare "auto" with a number, a 500 (schemathesis found it)."""
    auto = dict.fromkeys(("batch_size", "compute_multiplier", "eval_interval", "eval_samples",
                          "learning_rate_multiplier", "n_epochs"), "auto")
    job = create(sdk, training_file, method=rl_method(**auto))
    assert job.status == "queued"
    chosen = job.method.reinforcement.hyperparameters  # "auto" comes back resolved, as OpenAI's
    assert isinstance(chosen.batch_size, int) and isinstance(chosen.n_epochs, int)


def test_brorl_settings_through_extra_body(sdk, client, auth, training_file) -> None:
    schedule = [{"n": 4, "prompts_per_step": 2, "steps": 3}, {"n": 16, "prompts_per_step": 1,
                                                              "steps": 2}]
    job = create(sdk, training_file, method=rl_method(learning_rate_multiplier=2),
                 extra_body={"brorl": {"rollout": {"schedule": schedule, "engine": "hf"},
                                       "algo": {"kl_coef": 0.0}}})
    spec = client.get(f"/v1/jobs/{job.id}", headers=auth).json()["spec"]
    assert spec["rollout"]["schedule"] == schedule and spec["rollout"]["engine"] == "hf"
    assert spec["algo"]["kl_coef"] == 0.0 and spec["optim"]["lr"] == pytest.approx(2e-6)
    assert job.model_extra["brorl"]["schedule"] == schedule
    # A schedule and the hyperparameters that make one: ambiguous, refused naming the latter.
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, training_file, method=rl_method(n_epochs=3),
               extra_body={"brorl": {"rollout": {"schedule": schedule}}})
    assert exc.value.param == f"{HP}.n_epochs"
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, training_file, method=rl_method(),
               extra_body={"brorl": {"rollout": {"schedule": [{"n": 1}]}}})
    assert exc.value.param.startswith("brorl.rollout.schedule")
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, training_file, extra_body={"brorl": {"model": {"path": "/etc"}}})
    assert exc.value.param == "brorl.model.path"


def test_retrieve_list_pause_resume_cancel_events(sdk, training_file, enqueued) -> None:
    first = create(sdk, training_file)
    second = create(sdk, training_file)
    assert sdk.fine_tuning.jobs.retrieve(first.id).id == first.id
    page = sdk.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in page.data] == [second.id] and page.has_more
    assert [j.id for j in sdk.fine_tuning.jobs.list(limit=1, after=second.id).data] == [first.id]
    # Iterating a page pages on: with limit=1 that is two requests.
    assert [j.id for j in sdk.fine_tuning.jobs.list(limit=1)] == [second.id, first.id]

    assert sdk.fine_tuning.jobs.pause(first.id).status == "paused"
    resumed = sdk.fine_tuning.jobs.resume(first.id)
    assert resumed.status == "queued" and enqueued == [first.id, second.id, first.id]
    with pytest.raises(openai.ConflictError):
        sdk.fine_tuning.jobs.resume(first.id)  # not paused
    assert sdk.fine_tuning.jobs.pause(first.id).status == "paused"
    assert sdk.fine_tuning.jobs.cancel(first.id).status == "cancelled"  # a paused job cancels
    with pytest.raises(openai.ConflictError):
        sdk.fine_tuning.jobs.cancel(first.id)

    events = sdk.fine_tuning.jobs.list_events(first.id, limit=50).data
    assert all(e.object == "fine_tuning.job.event" and e.level == "info" for e in events)
    kinds = [e.data["type"] for e in events]
    assert kinds == ["cancelled", "cancel_requested", "paused", "resumed", "paused", "created"]
    assert events[-1].message == f"Created fine-tuning job: {first.id}"
    older = sdk.fine_tuning.jobs.list_events(first.id, limit=2, after=events[1].id)
    assert [e.id for e in older.data] == [e.id for e in events[2:4]] and older.has_more
    assert sdk.fine_tuning.jobs.checkpoints.list(first.id).data == []


def test_progress_events_are_worded_with_their_phase(sdk, training_file, database_url) -> None:
    job = create(sdk, training_file)
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job.id, "test-worker", lease_seconds=60)
        for data in ({"phase": "warm_start", "done": 40, "total": 1200, "finished": False,
                      "message": "warm start: step 40, loss 1.234"},
                     {"phase": "warm_start", "done": 1200, "total": 1200, "finished": True, "seconds": 61.25}):
            store_jobs.add_event(s, job.id, "progress", data, attempt=claim.attempt)
    done, running = sdk.fine_tuning.jobs.list_events(job.id, limit=2).data  # newest first
    assert running.message == "Phase warm start (40/1200): warm start: step 40, loss 1.234"
    assert done.message == "Phase warm start done in 61.2 s" and done.level == "info"
    assert done.data["type"] == "progress" and done.data["phase"] == "warm_start"


def test_checkpoints_and_fine_tuned_model(sdk, training_file, database_url, settings,
                                          tmp_path: Path) -> None:
    """What a worker writes (claim, metrics, checkpoints, success) as OpenAI's objects."""
    job = create(sdk, training_file)
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job.id, "test-worker", lease_seconds=60)
    for step in (2, 4):
        folder = checkpoint_dir(settings, job.id, claim.attempt, step)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"step": step}))
        nbytes, digest = ckpt_format.write_manifest(folder)
        ckpt_format.build_archive(folder)
        with session_scope(database_url) as s:
            store_jobs.record_metrics(s, job.id, claim.attempt, step,
                                      {"loss": 0.5 / step, "reward_mean": step / 10,
                                       "eval/pass@1": 0.25})
            store_jobs.record_checkpoint(s, job.id, claim.attempt, step, str(folder), nbytes,
                                         digest)
    with session_scope(database_url) as s:
        store_jobs.finish(s, job.id, claim.attempt, "succeeded")

    done = sdk.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and done.finished_at is not None
    assert done.fine_tuned_model == f"ft:{job.id}:step-4"
    ckpts = sdk.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in ckpts] == [4, 2]
    assert ckpts[0].object == "fine_tuning.job.checkpoint" and ckpts[0].fine_tuning_job_id == job.id
    assert ckpts[0].fine_tuned_model_checkpoint == done.fine_tuned_model
    assert ckpts[0].metrics.train_loss == pytest.approx(0.125) and ckpts[0].metrics.step == 4
    assert ckpts[0].metrics.model_extra["eval/pass@1"] == 0.25
    assert [c.step_number for c in sdk.fine_tuning.jobs.checkpoints.list(
        job.id, after=ckpts[0].id).data] == [2]
    messages = [e.message for e in sdk.fine_tuning.jobs.list_events(job.id).data]
    assert messages[0] == "The job has successfully completed"
    assert f"Checkpoint saved at step 4: ft:{job.id}:step-4" in messages

    # The model's name downloads it (the SDK's raw client follows the redirect).
    resp = sdk.get(f"/fine_tuning/checkpoints/{done.fine_tuned_model}/download",
                   cast_to=openai._legacy_response.HttpxBinaryResponseContent)
    out = tmp_path / "model.tar.gz"
    resp.write_to_file(out)
    with tarfile.open(out) as tar:
        assert json.load(tar.extractfile("config.json")) == {"step": 4}
    with pytest.raises(openai.NotFoundError):
        sdk.get(f"/fine_tuning/checkpoints/ft:{job.id}:step-3/download", cast_to=object)


def test_native_and_openai_routes_see_the_same_jobs(sdk, client, auth, training_file) -> None:
    native = client.post("/v1/jobs", json=make_spec(), headers=auth).json()
    ours = create(sdk, training_file)
    assert {j.id for j in sdk.fine_tuning.jobs.list()} == {native["id"], ours.id}
    assert {j["id"] for j in client.get("/v1/jobs", headers=auth).json()["data"]} == {
        native["id"], ours.id}
    seen = sdk.fine_tuning.jobs.retrieve(native["id"])
    assert seen.model == "builtin:tiny" and seen.training_file == "" and seen.status == "queued"
    assert seen.hyperparameters.batch_size == 2
    # A pause through one surface is a pause in the other.
    assert client.post(f"/v1/jobs/{ours.id}/pause", headers=auth).json()["status"] == "paused"
    assert sdk.fine_tuning.jobs.retrieve(ours.id).status == "paused"


def test_idempotency_key(sdk, training_file) -> None:
    headers = {"Idempotency-Key": "rft-1"}
    first = create(sdk, training_file, extra_headers=headers)
    again = create(sdk, training_file, extra_headers=headers)
    assert again.id == first.id
    with pytest.raises(openai.ConflictError) as exc:
        create(sdk, training_file, metadata={"other": "body"}, extra_headers=headers)
    assert exc.value.code == "idempotency_conflict"


# --------------------------------------------------------------------------- errors


def test_errors_in_openai_shape(sdk, other_sdk, training_file) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk.fine_tuning.jobs.retrieve("job_nope")
    job = create(sdk, training_file)
    for call in (other_sdk.fine_tuning.jobs.retrieve, other_sdk.fine_tuning.jobs.cancel,
                 other_sdk.fine_tuning.jobs.pause, other_sdk.fine_tuning.jobs.list_events,
                 other_sdk.fine_tuning.jobs.checkpoints.list):
        with pytest.raises(openai.NotFoundError):
            call(job.id)
    assert other_sdk.fine_tuning.jobs.list().data == []
    with pytest.raises(openai.NotFoundError) as exc:  # another tenant's file is no file
        create(other_sdk, training_file)
    assert exc.value.param == "training_file"

    cases = [
        (rl_method(batch_size=0), f"{HP}.batch_size"),
        (rl_method(n_epochs="lots"), f"{HP}.n_epochs"),
        (rl_method(learning_rate_multiplier=1e9), f"{HP}.learning_rate_multiplier"),
        (rl_method(reasoning_effort="extreme"), f"{HP}.reasoning_effort"),
        ({"type": "supervised", "supervised": {}}, "method.type"),
        ({"type": "reinforcement", "reinforcement": {"grader": {"type": "python"}}},
         "method.reinforcement.grader.source"),
        # An OpenAI judge id the operator mapped to no judge (BRORL_JUDGE_ALIASES).
        ({"type": "reinforcement", "reinforcement": {"grader": {
            "type": "score_model", "model": "gpt-4o-2024-08-06",
            "input": [{"role": "user", "content": "Score {{ sample.output_text }}"}]}}},
         "method.reinforcement.grader.model"),
    ]
    for method, param in cases:
        with pytest.raises(openai.BadRequestError) as exc:
            create(sdk, training_file, method=method)
        assert exc.value.param == param, (param, exc.value.body)
        assert exc.value.type == "invalid_request_error" and param in exc.value.message
    for model in ("/not/allowed", "o4-mini-2025-04-16"):
        with pytest.raises(openai.BadRequestError) as exc:
            sdk.fine_tuning.jobs.create(model=model, training_file=training_file.id,
                                        method=rl_method())
        assert exc.value.param == "model"
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, training_file, extra_body={"mystery": 1})
    assert exc.value.param == "mystery"


def test_unauthenticated_is_authentication_error(base_url: str) -> None:
    anon = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anon.fine_tuning.jobs.list()


# --------------------------------------------------------------------------- graders


def test_alpha_graders_run_and_validate(sdk) -> None:
    grader = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
              "reference": "{{ item.reference_answer }}", "operation": "eq"}
    assert sdk.fine_tuning.alpha.graders.validate(grader=grader).grader.type == "string_check"
    run = sdk.fine_tuning.alpha.graders.run(grader=grader, model_sample="7",
                                            item={"reference_answer": "7"})
    assert run.reward == 1.0 and run.metadata.type == "string_check"
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.fine_tuning.alpha.graders.validate(grader={**grader, "operation": "nearly"})
    assert exc.value.param and "operation" in exc.value.param


def test_job_quota_is_a_rate_limit_error_not_retried(settings, enqueued, key) -> None:
    from api.app import create_app

    app = create_app(settings.model_copy(update={"max_active_jobs_per_tenant": 1}),
                     enqueue=enqueued)
    with serve(app) as url:
        # max_retries=2, the SDK's default: x-should-retry: false must stop it retrying.
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=2)
        training = sdk.files.create(file=("rft.jsonl", jsonl(ROWS)), purpose="fine-tune")
        first = create(sdk, training)
        with pytest.raises(openai.RateLimitError) as exc:
            create(sdk, training)
        assert exc.value.code == "quota_exceeded"
        assert exc.value.response.headers["x-should-retry"] == "false"
        # A paused job frees its slot; resuming it needs the slot back.
        sdk.fine_tuning.jobs.pause(first.id)
        second = create(sdk, training)
        with pytest.raises(openai.RateLimitError):
            sdk.fine_tuning.jobs.resume(first.id)
        sdk.fine_tuning.jobs.cancel(second.id)
        assert sdk.fine_tuning.jobs.resume(first.id).status == "queued"
    assert len(enqueued) == 3  # first, second, first again: no retried creation


def test_a_failed_job_names_the_request_field_and_bad_cursors_are_refused(
        sdk, training_file, database_url) -> None:
    job = create(sdk, training_file)
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job.id, "test-worker", lease_seconds=60)
        store_jobs.finish(s, job.id, claim.attempt, "failed",
                          error="task.grader.source: grade() is missing")
    failed = sdk.fine_tuning.jobs.retrieve(job.id)
    assert failed.status == "failed" and failed.error.code == "job_failed"
    assert failed.error.param == "method.reinforcement.grader.source"
    assert "grade() is missing" in failed.error.message
    assert failed.fine_tuned_model is None
    for after in ("nonsense", "ftevent-" + "9" * 30):
        with pytest.raises(openai.BadRequestError) as exc:
            sdk.fine_tuning.jobs.list_events(job.id, after=after)
        assert exc.value.param == "after"
    with pytest.raises(openai.BadRequestError):
        sdk.fine_tuning.jobs.checkpoints.list(job.id, after="ftckpt-" + "9" * 30)


def test_objects_validate_against_the_sdks_own_types(sdk, training_file, database_url) -> None:
    """The SDK builds its objects without validation; validating the raw JSON with its types
    checks every field's name and type (statuses in its list; `paused` is not in it)."""
    from openai.types import FileObject
    from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
    from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint

    job = create(sdk, training_file, suffix="typed", metadata={"k": "v"})
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job.id, "test-worker", lease_seconds=60)
        store_jobs.record_checkpoint(s, job.id, claim.attempt, 1, "/nonexistent", 1, "0" * 64)
        store_jobs.finish(s, job.id, claim.attempt, "failed", error="boom")
    raw = sdk.fine_tuning.jobs.with_raw_response
    FineTuningJob.model_validate(raw.retrieve(job.id).http_response.json())
    for page, model in ((raw.list_events(job.id), FineTuningJobEvent),
                        (sdk.fine_tuning.jobs.checkpoints.with_raw_response.list(job.id),
                         FineTuningJobCheckpoint),
                        (raw.list(), FineTuningJob),
                        (sdk.files.with_raw_response.list(), FileObject)):
        data = page.http_response.json()["data"]
        assert data and all(model.model_validate(item) for item in data)


def test_hostile_brorl_objects_are_bad_requests(sdk, training_file) -> None:
    for brorl, param in (({"task": "x"}, "brorl.task"),
                         ({"task": {"dataset": {"eval_fraction": "lots"}}},
                          "brorl.task.dataset.eval_fraction"),
                         ({"task": {"grader": {"type": "string_check"}}}, "brorl.task.grader"),
                         ({"rollout": {"schedule": "wide"}}, "brorl.rollout.schedule"),
                         ({"spec_version": 2}, "brorl.spec_version")):
        with pytest.raises(openai.BadRequestError) as exc:
            create(sdk, training_file, method=rl_method(), extra_body={"brorl": brorl})
        assert exc.value.param == param, (brorl, exc.value.body)
    job = create(sdk, training_file, method=rl_method(n_epochs=1, batch_size=2),
                 extra_body={"brorl": {"task": {"dataset": {"eval_fraction": 0.5}}}})
    assert job.model_extra["total_steps"] == 3  # 6 of 12 rows held out: ceil(6 / 2)


def test_text_a_database_cannot_store_is_a_bad_request(sdk, training_file) -> None:
    for kwargs, param in (({"metadata": {"k": "a\x00b"}}, "metadata.k"),
                          ({"validation_file": "ds_\x00"}, "validation_file"),
                          ({"suffix": "x\x00"}, "suffix")):
        with pytest.raises(openai.BadRequestError) as exc:
            create(sdk, training_file, **kwargs)
        assert exc.value.param == param, exc.value.body
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.fine_tuning.jobs.create(model="builtin:tiny", training_file="ds_\x00",
                                    method=rl_method())
    assert exc.value.param == "training_file"
