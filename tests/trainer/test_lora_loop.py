"""The whole loop with `model.lora` on builtin:tiny (HF engine): the adapter learns, the base
stays, checkpoints hold PEFT's files and a merged folder, and a resume equals the
uninterrupted run (reference reset at step 3 included)."""
import math
from pathlib import Path

import pytest
import torch

from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from trainer.checkpoints.io import latest, verify
from trainer.sink import ListSink
from trainer.spec import JobSpec

pytestmark = pytest.mark.slow

SPEC = {
    "name": "lora-loop", "seed": SHARED_SEED, "task": shared_task(),
    "model": {"lora": {"rank": 8, "alpha": 16}},
    "rollout": {"engine": "auto", "max_new_tokens": 24, "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 4}]},
    "optim": {"lr": 1e-3},
    "algo": {"mini_batches": 2, "micro_batch_tokens": 256, "kl_coef": 1e-2, "ref_reset_every": 3},
    "eval": {"every": 2, "samples_per_prompt": 4, "k": [1, 4]},
    "checkpoint": {"every": 2, "keep_last": 3},
}


def spec() -> JobSpec:
    return JobSpec.model_validate(SPEC)


def run(out: Path, stop_after=None, resume=None):
    from trainer import train

    sink = ListSink()

    def should_stop():
        return stop_after is not None and any(r["step"] >= stop_after for r in sink.steps)

    return sink, train(spec(), sink, should_stop, resume=resume, out_dir=out)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    prebuild(spec())
    out = tmp_path_factory.mktemp("lora")
    sink, result = run(out)
    return out, sink, result


def test_lora_job_trains_the_adapter_only(full_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.run import cache_dir, tiny_model_key

    out, sink, result = full_run
    assert result.steps_completed == 4
    rows = {r["step"]: r for r in sink.steps}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    updated = [s for s in (1, 2, 3, 4) if rows[s]["loss"] is not None]
    assert updated and all(math.isfinite(rows[s]["loss"]) for s in updated)
    assert any(rows[s]["kl"] > 0 for s in updated)  # the reference (the base) differs from the policy
    ckpt = latest(out)
    verify(ckpt)
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "merged", "trainer_state"} <= names
    assert "model.safetensors" not in names  # the base is not copied into every checkpoint
    base_dir = cache_dir() / "models" / f"tiny-{tiny_model_key(spec())}"
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = PeftModel.from_pretrained(base, ckpt)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(bool(p.abs().sum() > 0) for p in lora_b)  # the adapter moved from B = 0
    fresh = AutoModelForCausalLM.from_pretrained(base_dir)  # the base on disk never changed
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in before.items())
    opt = torch.load(ckpt / "trainer_state" / "optimizer.pt", weights_only=False)
    assert len(opt["state"]) == len(lora_b) * 2  # AdamW state for A and B of each adapted layer
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt["state"].values())


def test_brorl_eval_reads_a_lora_checkpoint(full_run):
    from trainer.evaluate import evaluate_checkpoint

    out, _, _ = full_run
    values = evaluate_checkpoint(spec(), latest(out))  # through its merged/ folder
    assert 0.0 <= values["eval/pass@1"] <= 1.0


def test_lora_resume_equals_uninterrupted(full_run, tmp_path):
    _, full_sink, _ = full_run
    first, r1 = run(tmp_path, stop_after=2)
    assert r1.stopped and r1.steps_completed == 2
    assert (latest(tmp_path) / "trainer_state" / "ref.safetensors").is_file()  # ref 0 != step 2
    second, r2 = run(tmp_path, resume=latest(tmp_path))
    assert r2.steps_completed == 4
    full = {r["step"]: r for r in full_sink.steps}
    resumed = {r["step"]: r for r in first.steps + second.steps}
    for s in (1, 2, 3, 4):
        for k in ("reward_mean", "pass_rate", "loss", "kl", "grad_norm", "response_len_mean"):
            a, b = full[s][k], resumed[s][k]
            if a is None or b is None:
                assert a is b, (s, k)
            else:
                assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), (s, k, a, b)


def test_an_evaluation_of_a_lora_checkpoint_samples_its_merged_weights(full_run):
    """What the evaluation job runs (trainer.evaluation.evaluate_models) on a LoRA job's
    checkpoint: the folder holds PEFT's files and no full weights, and is loaded as its merged/
    model, so it draws the very samples that folder does (common random numbers), compared
    with the base (the job's own model) like any checkpoint."""
    from trainer.evaluation import Model, evaluate_models
    from trainer.evaluation_spec import EvaluationSpec, Picked, filled, sampling_job_spec

    out, _, _ = full_run
    ckpt = latest(out)
    step = int(ckpt.name.rsplit("-", 1)[-1])
    job = spec()
    ev = filled(EvaluationSpec(checkpoints=[step], prompts=4, n=4, k=[4], engine="hf"), job, "job_lora",
                [Picked(step=step, asked=["latest"])])
    models = [Model("base", None, None), Model(f"step {step}", step, ckpt),
              Model("its merged/ folder", step, ckpt / "merged")]
    result = evaluate_models(ev, sampling_job_spec(ev, job), models, lambda: False)
    base, lora, merged = result["models"]
    assert [m["samples"] for m in result["models"]] == [16, 16, 16]
    assert lora["correct"] == merged["correct"] and lora["tokens"] == merged["tokens"]
    assert base["delta"] is None and set(lora["delta"]) == {"1", "4"}
    for k in ("1", "4"):
        row = lora["pass_at_k"][k]
        assert 0 <= row["lo"] <= row["mean"] <= row["hi"] <= 1
