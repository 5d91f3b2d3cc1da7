"""The rollout-engine interface the training loop talks to, and what every engine promises.

Contract of `generate(prompts, sampling)`:
- `prompts` are P unique prompts as token ids; each gets `sampling.n` samples. The result is
  flat and prompt-major: samples 0..n-1 belong to prompt 0, then prompt 1, ...
  (`Generation.prompt_index` says so explicitly).
- `token_ids` are the response tokens only. Generation stops at the EOS token, which is then
  the last response token (its log-prob included) so that the trainer also learns to stop;
  `finished` is True for those and False for responses cut at `max_new_tokens`.
- `logprobs[i][t]` is the log-prob of the sampled token under the distribution it was drawn
  from: softmax(logits / temperature), restricted to the top-p nucleus and renormalised when
  `top_p < 1` (vLLM's "processed" log-probs; the HF engine computes the same), so the IS
  weights do not depend on the engine. At the default `top_p = 1` it is the full-vocabulary
  value the trainer recomputes.
- `temperature == 0` means greedy (tests use it); log-probs are then under the raw logits.

`sync_weights(model)` loads the trainer model's current weights and verifies them; a failed
check raises `WeightSyncError` (never silently stale weights). It returns the seconds spent.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from trainer.rollouts import Generation, SamplingConfig


class WeightSyncError(RuntimeError):
    """The engine's weights do not match the trainer's after a sync (or the load failed)."""


@runtime_checkable
class RolloutEngine(Protocol):
    name: str

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> Generation:
        ...

    def sync_weights(self, model: torch.nn.Module) -> float:
        ...

    def close(self) -> None:
        ...


def sync_check_tokens(vocab_size: int, length: int = 48, seed: int = 1234) -> list[int]:
    """A fixed pseudo-random token sequence used to compare engine and trainer log-probs.

    Random ids (not text) so that every check reads many different embedding rows and the
    check does not depend on a tokenizer.
    """
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=g).tolist()


@torch.no_grad()
def trainer_token_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 under the trainer model (eval mode, float32 result).

    The model's train/eval mode is restored afterwards: dropout must not blur the check.
    """
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        x = torch.tensor([ids], device=device)
        logits = model(input_ids=x).logits[0, :-1].float()
        lp = torch.log_softmax(logits, dim=-1)
        return lp.gather(-1, x[0, 1:, None]).squeeze(-1).cpu()
    finally:
        model.train(was_training)


def logprob_tolerance(dtype: torch.dtype | str) -> float:
    """Max |engine - trainer| log-prob allowed on the sync check's tokens after a sync.

    float32: different kernels (vLLM's fused CPU/GPU ops vs HF eager) agree to ~1e-5..1e-4
    (5e-5 measured on this CPU); 1e-3 leaves room. bfloat16 keeps ~3 significant digits and
    errors compound over layers, so agreement is only to a few 1e-2; 0.1 still catches a
    missing or mis-mapped load, which moves log-probs by O(1). Stale-by-one-step weights are
    caught by the parameter fingerprint instead (see vllm_engine), not by this tolerance.
    """
    name = str(dtype).replace("torch.", "")
    if name in ("float32", "float", "float64"):
        return 1e-3
    return 0.1
