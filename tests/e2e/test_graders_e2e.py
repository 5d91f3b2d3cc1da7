"""Graders end to end: `brorl up` with the real worker and trainer on builtin:tiny runs a job
rewarded by a python grader and one by a multi grader (python + string_check) to success; the
metrics carry grader/* and reward/<key>, the stored samples their sub-rewards."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.client import BrorlClient
from trainer.spec import JobSpec
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from tests.support.upstack import Stack, running_stack
from tests.support.services import grader_sandbox_missing, needs_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              needs_service("a grader sandbox", grader_sandbox_missing())]

ANSWER_PY = """
import re

def grade(sample, item):
    m = re.search(r"<answer>(.*?)</answer>", sample["output_text"])
    return float(m is not None and m.group(1).strip() == str(item["answer"]))
"""
PYTHON = {"type": "python", "name": "right answer", "source": ANSWER_PY}
MULTI = {"type": "multi", "name": "answer and format",
         "calculate_output": "0.75 * right + 0.25 * tagged",
         "graders": {"right": PYTHON,
                     "tagged": {"type": "string_check", "name": "tagged",
                                "input": "{{ sample.output_text }}", "reference": "</answer>",
                                "operation": "like"}}}


def spec(name: str, grader: dict) -> dict:
    return {
        "spec_version": 1, "name": name, "seed": SHARED_SEED,
        "model": {"path": "builtin:tiny"},
        "task": shared_task(grader=grader, reward="score"),
        "rollout": {"engine": "hf", "max_new_tokens": 24,
                    "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 3}]},
        "algo": {"mini_batches": 1, "dynamic_sampling": False},
        "eval": {"every": 0, "samples_per_prompt": 2, "k": [1]},
        "checkpoint": {"every": 0, "keep_last": 1},
        "samples": {"per_step": 4},
        "optim": {"lr": 1e-4},
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    # builtin:tiny's cache key leaves the grader out: one short warm start serves both jobs,
    # found by the worker in the session's BRORL_CACHE_DIR (tests/conftest.py).
    prebuild(JobSpec.model_validate(spec("warm", PYTHON)))
    with running_stack(tmp_path_factory.mktemp("graders"), {
            "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1"}) as stack:
        yield stack


@pytest.fixture(scope="module")
def finished(stack: Stack) -> dict[str, dict]:
    with BrorlClient(stack.url, stack.key, timeout=30) as client:
        ids = {name: client.submit(spec(name, grader))["id"]
               for name, grader in (("python", PYTHON), ("multi", MULTI))}
        jobs = {name: client.wait(job_id, poll=1, timeout=800) for name, job_id in ids.items()}
        for name, job in jobs.items():
            assert job["status"] == "succeeded", (job, stack.output()[-4000:])
            job["metric_rows"] = client.metrics(job["id"])["data"]
            job["sample_rows"] = client._json("GET", f"/v1/jobs/{job['id']}/samples",
                                              params={"step": 1})["data"]
        return jobs


def _trained(job: dict) -> list[dict]:
    return [row["values"] for row in job["metric_rows"] if row["step"] > 0]


def test_a_python_grader_job_succeeds_with_grader_metrics(finished):
    rows = _trained(finished["python"])
    assert len(rows) == 3
    for values in rows:
        assert values["grader/errors"] == 0 and values["grader/timeouts"] == 0
        assert values["grader/seconds"] > 0
        assert not any(k.startswith("reward/") for k in values)
    samples = finished["python"]["sample_rows"]
    assert samples and all(s["sub_rewards"] == {} for s in samples)


def test_a_multi_grader_job_logs_and_stores_each_sub_reward(finished):
    for values in _trained(finished["multi"]):
        assert values["grader/errors"] == 0
        assert {"reward/right", "reward/tagged"} <= set(values)
        assert values["reward/tagged"] > 0  # the warm-started model closes its answer tag
    samples = finished["multi"]["sample_rows"]
    assert len(samples) == 4
    for s in samples:
        assert set(s["sub_rewards"]) == {"right", "tagged"}
        if not s["truncated"]:
            want = 0.75 * s["sub_rewards"]["right"] + 0.25 * s["sub_rewards"]["tagged"]
            assert s["reward"] == pytest.approx(want, abs=1e-6)


SLOW = {"type": "python", "name": "slow",
        "source": "import time\ndef grade(sample, item):\n    time.sleep(60)\n    return 1.0\n"}


def _job_sandboxes(stack: Stack) -> list[int]:
    """The worker's sandbox processes: tagged, and below this stack's `brorl up`."""
    import psutil

    from trainer.graders.sandbox.process import processes_with

    mine = {p.pid for p in psutil.Process(stack.proc.pid).children(recursive=True)}
    return [pid for pid in processes_with("brorl-grader") if pid in mine]


def test_a_cancel_stops_a_job_whose_samples_are_still_grading(stack: Stack):
    """The cancel reaches the sandboxes: the job ends within seconds, not after its batch
    (8 samples of 60 s on 2 runners: 4 minutes), and no sandbox is left."""
    import time

    with BrorlClient(stack.url, stack.key, timeout=30) as client:
        job_id = client.submit(spec("slow grader", SLOW))["id"]
        deadline = time.monotonic() + 300
        while not _job_sandboxes(stack) and time.monotonic() < deadline:
            job = client.get_job(job_id)
            assert job["status"] in ("queued", "running"), (job, stack.output()[-4000:])
            time.sleep(0.5)
        assert _job_sandboxes(stack), ("the job never reached its grader",
                                       stack.output()[-4000:])
        time.sleep(1.0)  # inside the batch now
        asked = time.monotonic()
        client.cancel(job_id)
        job = client.wait(job_id, poll=0.5, timeout=200)
        took = time.monotonic() - asked
    assert job["status"] == "cancelled", (job, stack.output()[-4000:])
    assert took < 60, (took, stack.output()[-4000:])
    deadline = time.monotonic() + 10
    while _job_sandboxes(stack) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _job_sandboxes(stack) == []
