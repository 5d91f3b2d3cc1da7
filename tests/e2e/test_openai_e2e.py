"""The official `openai` SDK, with only `base_url` and `api_key` changed, trains a
reinforcement job end to end through `brorl up` (the real API, worker and trainer): it uploads
an RFT JSONL (`{"messages": [...], "reference_answer": ...}` rows), creates a job with a python
grader reading `item["reference_answer"]`, waits for `succeeded`, lists the events and the
checkpoints, and downloads `fine_tuned_model`.

The model is the suite's shared warm-started builtin:tiny (tests/support/tinyprebuild.py),
named as OpenAI's `model` by its folder under BRORL_MODEL_ROOTS, as an operator's model would
be; the rows are the shared task's questions, so the model answers some of them.
"""
from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from trainer.spec import ReasoningGymTask
from trainer.tasks import reasoning_gym_task
from trainer.tasks.prompts import PLAIN_INSTRUCTION
from tests.support.tinyprebuild import SHARED_SEED, shared_model_dir, shared_task
from tests.support.upstack import Stack, running_stack
from tests.support.services import grader_sandbox_missing, needs_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              needs_service("a grader sandbox", grader_sandbox_missing())]

GRADER = {"type": "python", "source": (
    "import re\n\n"
    "def grade(sample, item):\n"
    "    m = re.search(r'<answer>(.*?)</answer>', sample['output_text'])\n"
    "    return float(m is not None and m.group(1).strip() == str(item['reference_answer']))\n")}
# Seconds on a CPU: the hf engine, short answers, no refills. BroRL's own settings travel in
# the `brorl` object (docs/migrating-from-openai.md); the OpenAI hyperparameters set the rest.
BRORL = {"rollout": {"engine": "hf", "max_new_tokens": 24},
         "algo": {"mini_batches": 1, "max_refill_rounds": 0},
         "checkpoint": {"every": 2, "keep_last": 3}, "samples": {"per_step": 2}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Stack, Path]]:
    model_dir = shared_model_dir()
    with running_stack(tmp_path_factory.mktemp("openai"), {
            "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1",
            # A pause reaches the worker with its heartbeat: at the default 20 s the
            # 11-step job sometimes finished first on a quiet machine.
            "BRORL_HEARTBEAT_SECONDS": "1",
            "BRORL_MODEL_ROOTS": str(model_dir.parent)}) as stack:
        yield stack, model_dir


def _rft_rows(n: int) -> bytes:
    rg = ReasoningGymTask(**shared_task()["reasoning_gym"])
    examples = reasoning_gym_task.build(rg, seed=SHARED_SEED).train[:n]
    return "".join(json.dumps({
        "messages": [{"role": "user", "content": f"{ex.question}\n{PLAIN_INSTRUCTION}"}],
        "reference_answer": ex.answer}) + "\n" for ex in examples).encode()


def test_the_sdk_trains_a_reinforcement_job_to_succeeded(stack, tmp_path) -> None:
    stack, model_dir = stack
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0)
    started = time.monotonic()
    training = client.files.create(file=("rft.jsonl", _rft_rows(8)), purpose="fine-tune")
    assert client.fine_tuning.alpha.graders.validate(grader=GRADER).grader.type == "python"
    job = client.fine_tuning.jobs.create(
        model=str(model_dir), training_file=training.id, suffix="adder", seed=SHARED_SEED,
        method={"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": {
            "n_epochs": 1, "batch_size": 2, "compute_multiplier": 0.25, "eval_samples": 2,
            "learning_rate_multiplier": 100}}},
        extra_body={"brorl": BRORL})
    assert job.status == "queued"
    while job.status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() - started < 800, job
        time.sleep(1)
        job = client.fine_tuning.jobs.retrieve(job.id)
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    assert job.status == "succeeded", (job.error, [e.message for e in events][:8],
                                       stack.output()[-3000:])
    print(f"openai e2e: {time.monotonic() - started:.1f} s to succeeded, "
          f"{job.model_extra['total_steps']} steps")
    # 8 rows, one held out, batches of 2: 4 steps of N=4 (16 x 0.25) rollouts per prompt.
    assert job.model_extra["total_steps"] == 4 and job.model_extra["step"] == 4
    assert events[0].message == "The job has successfully completed"
    assert events[-1].message == f"Created fine-tuning job: {job.id}"
    assert any("N=4 rollouts per prompt" in e.message for e in events)

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in checkpoints] == [4, 2]
    assert checkpoints[0].fine_tuned_model_checkpoint == job.fine_tuned_model == \
        f"ft:{job.id}:step-4"
    assert checkpoints[0].metrics.step == 4 and checkpoints[0].metrics.train_loss is not None

    archive = tmp_path / "model.tar.gz"
    client.get(f"/fine_tuning/checkpoints/{job.fine_tuned_model}/download",
               cast_to=openai._legacy_response.HttpxBinaryResponseContent).write_to_file(archive)
    with tarfile.open(archive) as tar:
        assert "config.json" in tar.getnames()


def test_the_sdk_pauses_and_resumes_a_running_job(stack) -> None:
    """A pause stops the real trainer within its current step, keeping its checkpoints; resume
    continues from the newest in a new attempt, and the job trains to the end."""
    stack, model_dir = stack
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0)
    training = client.files.create(file=("rft.jsonl", _rft_rows(8)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=str(model_dir), training_file=training.id, seed=SHARED_SEED,
        method={"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": {
            "n_epochs": 3, "batch_size": 2, "compute_multiplier": 0.25, "eval_samples": 2}}},
        extra_body={"brorl": BRORL})
    total = job.model_extra["total_steps"]
    assert total == 11  # ceil(3 epochs x 7 rows / 2)

    def wait(until, timeout: float = 600):
        deadline = time.monotonic() + timeout
        while True:
            current = client.fine_tuning.jobs.retrieve(job.id)
            if until(current) or current.status in ("succeeded", "failed", "cancelled"):
                return current
            assert time.monotonic() < deadline, current
            time.sleep(0.5)

    wait(lambda j: j.status == "running" and j.model_extra["step"] >= 1)
    client.fine_tuning.jobs.pause(job.id)
    paused = wait(lambda j: j.status == "paused")
    assert paused.status == "paused", (paused.error, stack.output()[-3000:])
    assert paused.model_extra["step"] < total
    # The stop falls inside a step (then that step is redone on resume) or between two (then
    # the trainer saves one on its way out): the newest checkpoint is at most the paused step.
    saved = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert all(c.step_number <= paused.model_extra["step"] for c in saved)

    assert client.fine_tuning.jobs.resume(job.id).status == "queued"
    done = wait(lambda j: False, timeout=800)
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    assert done.status == "succeeded", (done.error, [e.message for e in events][:8])
    messages = [e.message for e in reversed(events)]
    assert messages.index("Fine-tuning job paused") < messages.index("Fine-tuning job resumed")
    assert [e.data["attempt"] for e in reversed(events) if e.data["type"] == "started"] == [1, 2]
    assert done.fine_tuned_model == f"ft:{job.id}:step-{total}"
