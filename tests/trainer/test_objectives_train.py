"""One short real training run of builtin:tiny through `trainer.train` per objective: the loss is
finite and the policy's weights moved (not an empty update). The runs switch on the other
options of the objective menu too (overlong shaping, the difficulty filter, the fp32 head
under bf16, Dr. GRPO's advantage), so each is exercised end to end once."""
import math

import pytest
import torch
from safetensors.torch import load_file

from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_model_dir, shared_task
from trainer.checkpoints.io import latest
from trainer.sink import ListSink
from trainer.spec import JobSpec

# The first run in a fresh cache warm-starts builtin:tiny (minutes on 2 busy cores).
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(2400)]

EXTRA = {
    "ppo": {},
    "gspo": {"algo": {"clip_low": 3e-4, "clip_high": 4e-4}, "model": {"fp32_lm_head": True, "dtype": "bfloat16"}},
    "cispo": {"algo": {"clip_high": 3.0, "overlong": {"buffer": 8}}},
    "dr_grpo": {"algo": {"advantage": "group_mean", "difficulty_filter": {"window": 1}}},
}


def _spec(loss: str) -> JobSpec:
    extra = EXTRA[loss]
    return JobSpec.model_validate({
        "name": f"objective-{loss}", "seed": SHARED_SEED, "task": shared_task(),
        "rollout": {"engine": "hf", "max_new_tokens": 24, "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 2}]},
        "optim": {"lr": 1e-4},
        "algo": {"loss": loss, "mini_batches": 2, "micro_batch_tokens": 256, **extra.get("algo", {})},
        "model": extra.get("model", {}),
        "eval": {"every": 0, "samples_per_prompt": 2, "k": [1]},
        "checkpoint": {"every": 0, "keep_last": 1},
    })


def _weights(folder) -> dict[str, torch.Tensor]:
    return {k: v.float() for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("loss", sorted(EXTRA))
def test_each_objective_trains_builtin_tiny(loss, tmp_path):
    from trainer import train

    spec = _spec(loss)
    prebuild(spec)
    sink = ListSink()
    train(spec, sink, lambda: False, out_dir=tmp_path)
    rows = [r for r in sink.steps if r["step"] >= 1]
    updated = [r for r in rows if r["loss"] is not None]
    assert updated, "no step updated"
    assert all(math.isfinite(r["loss"]) and r["skipped_updates"] == 0 and r["grad_norm"] > 0 for r in updated)
    assert all(r["mismatch_kl"] >= 0 and 0 < r["is_ess"] <= 1 + 1e-6 for r in updated)
    if loss == "dr_grpo":
        assert all("prompts_retired" in r for r in rows)
    before, after = _weights(shared_model_dir()), _weights(latest(tmp_path))
    moved = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert moved, "the policy's weights did not change"
