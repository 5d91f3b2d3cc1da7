"""Evaluate from the job page in a real browser (Chromium + Playwright) against `brorl up` with
the test trainer: the user ticks a checkpoint by its step (in place of the default "latest" and
"best"), the button queues an evaluation of it against the base, the real worker samples both models (untrained
builtin:tiny weights: the page's numbers, not a good model, are under test), and the
evaluation's page shows the table, the chart and the per-prompt counts; the job page lists it."""
from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.dashboard.helpers import client, fake_trainer_stack, shot, wait_for
from tests.support.upstack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TASK = {"reasoning_gym": {"name": "chain_sum", "train_size": 10, "eval_size": 3,
                          "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    from trainer.models.tiny import build_untrained, save_folder

    root = tmp_path_factory.mktemp("eval-models")
    for seed in (3, 4):
        save_folder(*build_untrained(seed), root / f"tiny-{seed}")
    return root


@pytest.fixture(scope="module")
def stack(tmp_path_factory, models) -> Iterator[Stack]:
    yield from fake_trainer_stack(tmp_path_factory, "evaluation-dashboard", BRORL_MODEL_ROOTS=str(models),
                                  OMP_NUM_THREADS="1", BRORL_TORCH_THREADS="1")


def test_evaluate_from_the_job_page(stack, models, page):
    spec = {"name": "dash-eval", "seed": 1, "model": {"path": str(models / "tiny-3")}, "task": TASK,
            "rollout": {"engine": "hf", "max_new_tokens": 16, "schedule": [{"n": 2, "prompts_per_step": 2, "steps": 3}]},
            "eval": {"every": 0, "samples_per_prompt": 2, "k": [1, 2]}, "algo": {"mini_batches": 1}}
    with client(stack) as c:
        job = c.submit(spec)["id"]
        wait_for(lambda: c.get_job(job)["status"] == "succeeded", 60, "the job to finish")
    folder = stack.data_dir / "artifacts" / "jobs" / job / "attempt-1" / "checkpoints" / "step-00000003"
    shutil.rmtree(folder)
    shutil.copytree(models / "tiny-4", folder)  # the fake trainer's files become a loadable model

    page.goto(f"{stack.url}/jobs/{job}")
    expect(page.locator("#evaluations-empty")).to_be_visible()
    step_box = page.locator("#evaluate-steps input[value='3']")
    expect(step_box).to_be_visible(timeout=30_000)  # one box per stored checkpoint
    page.uncheck("#evaluate-checkpoints input[value='latest']")
    page.uncheck("#evaluate-checkpoints input[value='best']")
    step_box.check()
    page.click("#evaluate")
    page.wait_for_url(re.compile(r".*/evaluations/evl_.*"))
    evaluation = page.url.rsplit("/", 1)[-1]
    expect(page.locator("#eval-status")).to_have_text("succeeded", timeout=240_000)
    rows = page.locator("#eval-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("th")).to_have_text("base")
    expect(rows.nth(1).locator("th")).to_have_text("step 3 ★ best")
    expect(page.locator("#eval-table thead")).to_contain_text("Δ pass@2 vs base")
    expect(rows.nth(1).locator("td").first).to_have_text(re.compile(r"^\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]$"))
    expect(page.locator("#chart-models")).to_have_attribute("data-points", "2")
    expect(page.locator("#chart-models")).to_have_attribute("data-drawn", "true")
    expect(page.locator("#eval-prompts tbody tr")).to_have_count(3)
    expect(page.locator("#eval-prompts tbody tr").first.locator("td").nth(2)).to_have_text(re.compile(r"^[0-2] / 2$"))
    expect(page.locator("#eval-what")).to_contain_text("steps 3 and the base")
    shot(page, "evaluation.png", full_page=True)
    with client(stack) as c:
        posted = c.get_evaluation(evaluation)
        result = posted["result"]
    # What the page posted: step 3 by its number, not "latest" that also names it.
    assert [p["asked"] for p in posted["spec"]["picked"]] == [["3"]], posted["spec"]["picked"]
    base, ckpt = result["models"]
    expect(rows.nth(0).locator("td").first).to_have_text(
        f"{base['pass_at_k']['1']['mean']:.3f} [{base['pass_at_k']['1']['lo']:.3f}, {base['pass_at_k']['1']['hi']:.3f}]")
    page.click(f"#eval-what a[href='/jobs/{job}']")
    page.wait_for_url(f"{stack.url}/jobs/{job}")
    listed = page.locator(f"#evaluations tr[data-id='{evaluation}']")
    expect(listed).to_be_visible(timeout=30_000)
    expect(listed.locator("td").nth(3)).to_have_text("3")
    expect(listed.locator("td").nth(6)).to_have_text(
        f"+{len(ckpt['changes']['gained'])} / −{len(ckpt['changes']['lost'])}")
    page.locator("#evaluate").scroll_into_view_if_needed()  # the shot shows the controls and the table
    shot(page, "job-evaluations.png")
