"""Each objective against TRL 1.16's own loss code (GRPOTrainer._compute_loss) on one batch:
the same loss and the same gradient with respect to the token log-probs.

TRL is not a dependency of the service (the `bench` extra pins it): this test installs it
into a virtual environment of its own under ~/.cache/brorl, which sees this project's
packages (torch, transformers) through a .pth file, and runs TRL in a subprocess. Without a
package index it skips, and fails under CI (tests/support/services.py)."""
import json
import math
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from trainer.algo.objectives import OBJECTIVES, Totals
from tests.support.services import require_service

pytestmark = pytest.mark.slow

TRL_VERSION = "1.16.0"
MAX_COMPLETION = 6
# Our objective -> TRL's GRPOConfig fields for the same loss (trainer/algo/objectives.py).
TRL_ARGS = {
    "ppo": {"loss_type": "dapo", "importance_sampling_level": "token"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    "cispo": {"loss_type": "cispo", "importance_sampling_level": "token"},
    "dr_grpo": {"loss_type": "dr_grpo", "importance_sampling_level": "token"},
}

# Runs TRL's GRPOTrainer._compute_loss on an instance that holds only what the loss reads; the
# model forward is replaced by the given log-probs (a leaf tensor), so the gradient compared
# is d loss / d log-probs.
TRL_SCRIPT = r"""
import json, sys, types
import torch
from trl.trainer.grpo_trainer import GRPOTrainer


def run(case):
  logp = torch.tensor(case["logp"], requires_grad=True)
  t = GRPOTrainer.__new__(GRPOTrainer)
  acc = types.SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x,
                              gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x)
  t.__dict__.update(
      loss_type=case["loss_type"], importance_sampling_level=case["importance_sampling_level"],
      epsilon_low=case["epsilon_low"], epsilon_high=case["epsilon_high"], beta=0.0,
      top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False,
      max_completion_length=case["max_completion_length"], current_gradient_accumulation_steps=1,
      _entropy_bonus_enabled=False, aux_loss_enabled=False, accelerator=acc,
      args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
      _metrics={"train": __import__("collections").defaultdict(list)},
      model=types.SimpleNamespace(training=True))
  t._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
  mask = torch.tensor(case["mask"])
  inputs = {"prompt_ids": torch.zeros(len(mask), 1, dtype=torch.long), "prompt_mask": torch.ones(len(mask), 1),
            "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask,
            "advantages": torch.tensor(case["advantages"]), "old_per_token_logps": torch.tensor(case["old"]),
            "num_items_in_batch": mask.sum()}
  loss = GRPOTrainer._compute_loss(t, None, inputs)
  loss.backward()
  return {"loss": loss.item(), "grad": (logp.grad * mask).tolist()}

print(json.dumps([run(c) for c in json.load(sys.stdin)]))
"""


def _trl_python() -> Path:
    """A venv holding TRL (made once, then reused), or skip / fail (CI) when pip cannot get it."""
    home = Path.home() / ".cache" / "brorl" / f"trl-{TRL_VERSION}-venv"
    python = home / "bin" / "python"
    ok = python.exists() and subprocess.run([str(python), "-c", "import trl.trainer.grpo_trainer"],
                                            capture_output=True).returncode == 0
    if not ok:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True, capture_output=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        # This project's packages (torch, transformers) are seen, not installed a second time.
        Path(site, "brorl_project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}"],
                             capture_output=True, text=True)
        require_service("TRL", "" if pip.returncode == 0 else f"pip install trl=={TRL_VERSION}: "
                        f"{pip.stderr.strip()[-400:]}")
    return python


def _batch():
    """Three samples of 4, 6 and 2 tokens; ratios spread over [0.4, 2.2] so that both clips
    and CISPO's cap are active somewhere; advantages of both signs."""
    g = torch.Generator().manual_seed(0)
    lengths = [4, 6, 2]
    mask = torch.arange(MAX_COMPLETION)[None] < torch.tensor(lengths)[:, None]
    logp = -torch.rand(3, MAX_COMPLETION, generator=g) * 3
    old = logp - (torch.rand(3, MAX_COMPLETION, generator=g) * 1.7 - 0.9)
    # GSPO's sequence ratio: pull sample 2 out of the clip range, keep sample 0 inside it
    old[0] = logp[0] - 0.05
    old[2] = logp[2] - 0.6
    logp, old = torch.where(mask, logp, 0.0), torch.where(mask, old, 0.0)
    return logp, old, torch.tensor([0.7, -1.2, 1.5]), mask


CLIP_LOW, CLIP_HIGH = 0.2, 0.28


@pytest.fixture(scope="module")
def trl_results() -> dict[str, dict]:
    """TRL's loss and gradient for every objective, from one subprocess (TRL imports slowly)."""
    python = _trl_python()
    logp, old, adv, mask = _batch()
    names = sorted(OBJECTIVES)
    cases = [{"logp": logp.tolist(), "old": old.tolist(), "advantages": adv.tolist(), "mask": mask.tolist(),
              "max_completion_length": MAX_COMPLETION, "epsilon_low": CLIP_LOW,
              # CISPO's cap is TRL's epsilon_high itself; ours is 1 + clip_high, as the paper's eps.
              "epsilon_high": 1 + CLIP_HIGH if name == "cispo" else CLIP_HIGH, **TRL_ARGS[name]}
             for name in names]
    out = subprocess.run([str(python), "-c", TRL_SCRIPT], input=json.dumps(cases), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(zip(names, json.loads(out.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_same_loss_and_gradient_as_trl(name, trl_results):
    clip_low, clip_high = CLIP_LOW, CLIP_HIGH
    logp, old, adv, mask = _batch()
    trl = trl_results[name]

    x = logp.clone().requires_grad_(True)
    obj = OBJECTIVES[name]
    per_token, low, high = obj.terms(x, old, adv, mask, clip_low, clip_high)
    loss = obj.aggregate(per_token, mask, Totals(int(mask.sum()), len(mask), MAX_COMPLETION))
    loss.backward()
    assert (low | high)[mask].any(), "the batch must exercise the clip"
    assert math.isfinite(trl["loss"]) and trl["loss"] != 0
    assert loss.item() == pytest.approx(trl["loss"], rel=1e-5, abs=1e-7)
    torch.testing.assert_close(x.grad * mask, torch.tensor(trl["grad"]), rtol=1e-5, atol=1e-7)
