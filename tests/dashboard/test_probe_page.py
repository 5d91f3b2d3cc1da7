"""The probe page in a real browser (Chromium + Playwright) against `brorl up` running the real
worker: a probe of a finished job's newest checkpoint draws its pass@k curve and histogram, shows the
recommendation, and its button opens the submit page with the recommended spec; the job page
lists the probe; the submit page's "Probe first" queues a probe of the spec in the box.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import yaml
from playwright.sync_api import expect

from tests.dashboard.helpers import client, shot, wait_for
from tests.support.tinyprebuild import prebuild
from tests.support.upstack import Stack, running_stack
from trainer.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TASK = {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
                          "train_size": 500, "eval_size": 16}}
# builtin:tiny on the task and seed of tests/trainer/test_probe.py: one warm start serves both.
SPEC = {"name": "probe-dash", "seed": 1, "model": {"path": "builtin:tiny"}, "task": TASK,
        "rollout": {"engine": "hf", "max_new_tokens": 24, "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 2}]},
        "eval": {"every": 2, "samples_per_prompt": 2, "k": [1, 2]}, "checkpoint": {"every": 1, "keep_last": 2},
        "algo": {"mini_batches": 1}, "optim": {"lr": 1e-4}}


# A stack of this module's own (not the session's, whose two jobs this page does not need).
@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    prebuild(JobSpec.model_validate(SPEC), sft_steps=150)
    with running_stack(tmp_path_factory.mktemp("probe-dashboard"), {
            "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1", "BRORL_TORCH_THREADS": "1",
            "BRORL_HEARTBEAT_SECONDS": "1"}) as st:
        yield st



@pytest.fixture(scope="module")
def job_id(stack: Stack) -> str:
    """A two-step job with a checkpoint at each step, finished."""
    with client(stack) as c:
        job = c.submit(SPEC)
        deadline = time.monotonic() + 400
        while (job := c.get_job(job["id"]))["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, job
            time.sleep(1)
    assert job["status"] == "succeeded", job
    return job["id"]


def _get(stack, path: str) -> dict:
    with client(stack) as c:
        return c._json("GET", path)


def test_probe_page_draws_the_curve_and_hands_over_the_recommendation(stack, job_id, page):
    with client(stack) as c:
        probe = c.create_probe({"model": {"job": job_id}, "n": 32, "prompts": 4, "chunk_samples": 32,
                                "max_new_tokens": 24, "engine": "hf"})
    page.goto(f"{stack.url}/probes/{probe['id']}")
    expect(page.locator("#probe-status")).to_have_text("succeeded", timeout=300_000)
    expect(page.locator("#verdict")).not_to_be_empty()
    for chart, points in (("passk", "6"), ("hist", "4")):  # k = 1..32; 4 prompts
        wait_for(lambda: page.get_attribute(f"#chart-{chart}", "data-drawn") == "true", 15, f"{chart} drawn")
        assert page.get_attribute(f"#chart-{chart}", "data-points") == points
        assert page.locator(f"#chart-{chart} canvas").count() == 1
    assert page.locator("#figures tr").count() >= 8
    shot(page, "dashboard_probe.png", full_page=True)
    page.click("#use-recommendation")
    page.wait_for_url("**/submit")
    spec = yaml.safe_load(page.input_value("#spec-text"))
    result = _get(stack, f"/v1/probes/{probe['id']}")["result"]
    assert spec == result["recommendation"]["spec"] and spec["name"] == "probe-dash"
    # The job page links the probes of its checkpoints.
    page.goto(f"{stack.url}/jobs/{job_id}")
    expect(page.locator(f"#probes a[href='/probes/{probe['id']}']")).to_be_visible(timeout=30_000)


def test_submit_page_probes_the_spec_first(stack, page):
    page.goto(f"{stack.url}/submit")
    page.fill("#spec-text", yaml.safe_dump(SPEC))
    page.click("#probe-first")
    page.wait_for_url("**/probes/prb_*")
    probe_id = page.url.rsplit("/", 1)[1]
    spec = _get(stack, f"/v1/probes/{probe_id}")["spec"]
    assert spec["task"]["reasoning_gym"]["name"] == "chain_sum" and spec["n"] == 512 and spec["max_new_tokens"] == 24
    page.on("dialog", lambda d: d.accept())
    page.click("#cancel")  # 512 x 16 samples is not this test's business
    expect(page.locator("#probe-status")).to_have_text("cancelled", timeout=120_000)
