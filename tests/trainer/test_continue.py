"""Continuing from another job's checkpoint (`spec.continue_from`, `trainer.train(start_from=)`):
the continued run starts from the parent's weights (full fine-tuning) or the parent's base and
adapter (LoRA), optionally its optimizer state, with its own counters from step 0; and it
trains from there (the weights move on)."""
from pathlib import Path

import pytest
import torch

from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from trainer.checkpoints.io import StartFrom, latest
from trainer.sink import ListSink
from trainer.spec import JobSpec

pytestmark = pytest.mark.slow

BASE = {
    "name": "parent", "seed": SHARED_SEED, "task": shared_task(),
    "rollout": {"engine": "hf", "max_new_tokens": 24, "schedule": [{"n": 4, "prompts_per_step": 4, "steps": 2}]},
    "optim": {"lr": 1e-4},
    "algo": {"mini_batches": 1, "micro_batch_tokens": 256, "kl_coef": 0.0},
    "eval": {"every": 0, "samples_per_prompt": 2, "k": [1]},
    "checkpoint": {"every": 2, "keep_last": 1},
}
LORA = {"model": {"lora": {"rank": 4, "alpha": 8}}, "optim": {"lr": 1e-3}}


def _spec(lora: bool, **over) -> JobSpec:
    return JobSpec.model_validate({**BASE, **(LORA if lora else {}), **over})


def _trainable(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


@pytest.fixture(scope="module", params=[False, True], ids=["full", "lora"])
def parent(request, tmp_path_factory):
    """(lora?, the parent's last checkpoint folder) after 2 steps of training."""
    from trainer import train

    prebuild(_spec(False))
    out = tmp_path_factory.mktemp("parent")
    result = train(_spec(request.param), ListSink(), lambda: False, out_dir=out)
    assert result.steps_completed == 2
    return request.param, latest(out)


def test_a_continuation_starts_from_the_parents_weights_and_optimizer(parent, tmp_path):
    from trainer.run import build_run

    lora, folder = parent
    child = _spec(lora, name="child", continue_from={"job": "job_parent", "step": 2, "optimizer": True})
    saved = torch.load(folder / "trainer_state" / "optimizer.pt", weights_only=False)
    run = build_run(child, tmp_path, None, None, start_from=StartFrom(folder, optimizer=True))
    try:
        assert run.state.step == 0 and run.stream.cursor == 0  # its own counters
        mine = _trainable(run.policy)
        if lora:
            from safetensors.torch import load_file

            adapter = load_file(str(folder / "adapter_model.safetensors"))
            assert mine and all("lora_" in k for k in mine)
            for name, value in adapter.items():  # every saved adapter tensor is the policy's
                match = [v for k, v in mine.items() if k.replace(".default", "").endswith(name.split("base_model.model.")[-1])]
                assert match and torch.equal(match[0].float(), value.float()), name
        else:
            from transformers import AutoModelForCausalLM

            weights = AutoModelForCausalLM.from_pretrained(folder).state_dict()
            assert all(torch.equal(v.float(), weights[k].float()) for k, v in mine.items() if k in weights)
        state = run.optimizer.state_dict()["state"]
        assert state and len(state) == len(saved["state"])
        first = next(iter(state.values()))
        assert torch.equal(first["exp_avg"], next(iter(saved["state"].values()))["exp_avg"])
    finally:
        run.close()


def test_without_the_optimizer_the_moments_start_empty(parent, tmp_path):
    from trainer.run import build_run

    lora, folder = parent
    child = _spec(lora, name="child", continue_from={"job": "job_parent", "step": 2})
    run = build_run(child, tmp_path, None, None, start_from=StartFrom(folder))
    try:
        assert run.optimizer.state_dict()["state"] == {}
    finally:
        run.close()


def test_a_continued_job_trains_on_from_there(parent, tmp_path):
    from trainer import train

    lora, folder = parent
    child = _spec(lora, name="child", continue_from={"job": "job_parent", "step": 2})
    sink = ListSink()
    result = train(child, sink, lambda: False, out_dir=tmp_path, start_from=StartFrom(folder))
    assert result.steps_completed == 2 and [r["step"] for r in sink.steps][-1] == 2
    before = {p.name: p.read_bytes() for p in Path(folder).glob("*.safetensors")}
    after = {p.name: p.read_bytes() for p in Path(result.last_checkpoint).glob("*.safetensors")}
    assert before.keys() == after.keys() and before != after  # it learned on from the parent
