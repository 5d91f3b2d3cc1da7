"""The objective's token-level pieces: KL estimators, truncated IS weights, clipped PPO terms.

All tensors are [B, T] over response tokens, right-padded, with a `mask` (float or bool) of
valid tokens; padded positions may hold anything and are removed by the mask. Functions
return per-token values; aggregation is `token_sum`, which the update divides by the number
of valid tokens of the WHOLE mini-batch (not of the micro-batch) so that micro-batch losses
add up exactly to the mini-batch loss (the recipe's token-level aggregation, docs/algorithm.md).

Variants are picked once by name (`KL_ESTIMATORS`), never switched inside the step.
"""
from __future__ import annotations

from typing import Callable

import torch

# Bound on every log-ratio before it is exponentiated (veRL uses the same): exp(20) ~ 5e8 is
# finite in float32, so an extreme token gives a huge but finite value instead of inf -> NaN.
LOG_RATIO_CLAMP = 20.0


def _log_ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

# ----------------------------------------------------------------------------- KL estimators
# Schulman's estimators of KL(pi || ref) from tokens sampled from pi, with
# log r = ref_logp - logp. k1 is unbiased but high-variance and can be negative; k2 is
# biased (its gradient is the reverse-KL's gradient), k3 is unbiased and non-negative.


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log ref."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log pi - log ref)^2 (the recipe's estimator)."""
    return 0.5 * _log_ratio(logp, ref_logp).pow(2)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1."""
    log_ratio = _log_ratio(ref_logp, logp)
    return torch.expm1(log_ratio) - log_ratio  # expm1: exact near 0, where k3 is ~ x^2/2


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}

# ----------------------------------------------------------------------------- importance


def is_weights(
    trainer_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    band: tuple[float, float] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ICE-POP truncated importance weights between the trainer's and the engine's policy.

    ratio = exp(trainer_old_logp - engine_logp) per token corrects for sampling from the
    engine (different kernels, maybe stale or lower precision) rather than from the trainer.
    Inside [low, high] the weight is the ratio; outside it is 0: the token is dropped rather
    than clipped, because a ratio that far off means the engine's sample is not one the
    trainer's policy would produce. `band=None` turns the correction off (all ones).
    Returns (weights, truncated_mask); weights are detached (they are constants of the step).
    """
    ratio = torch.exp(_log_ratio(trainer_logp.detach().float(), engine_logp.detach().float()))
    if band is None:
        return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)
    low, high = band
    inside = (ratio >= low) & (ratio <= high)
    return torch.where(inside, ratio, torch.zeros_like(ratio)), ~inside


def is_ratio(trainer_logp: torch.Tensor, engine_logp: torch.Tensor) -> torch.Tensor:
    """The untruncated trainer/engine ratio, for the is_ratio_mean statistic."""
    return torch.exp(_log_ratio(trainer_logp.detach().float(), engine_logp.detach().float()))


# ----------------------------------------------------------------------------- PPO


def ppo_clip_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped PPO surrogate with Clip-Higher, per token.

    r = exp(logp - old_logp); loss = -min(r A, clip(r, 1-clip_low, 1+clip_high) A), with the
    sample's advantage A ([B]) broadcast over its tokens. Returns (per_token_loss,
    clipped_low_mask, clipped_high_mask); a clip is "active" where it sets the loss (and so
    zeroes the gradient): A < 0 and r < 1-clip_low, or A > 0 and r > 1+clip_high. Masks are
    not restricted to valid tokens; the caller applies `mask`.
    """
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(_log_ratio(logp, old_logp.detach()))
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    r = ratio.detach()
    low = (adv < 0) & (r < 1.0 - clip_low)
    high = (adv > 0) & (r > 1.0 + clip_high)
    return loss, low, high


# ----------------------------------------------------------------------------- aggregation


def token_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over valid tokens. Uses where, not multiply, so NaN/inf in padding is inert."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def entropy_from_logits(logits: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
    """Per-position entropy of softmax(logits) over the last dim, in the logsumexp form.

    H = logsumexp(z) - sum softmax(z) z: one [.., V] temporary (the probabilities, multiplied
    by z in place) instead of the separate log-softmax and probability tensors of -sum p log p.
    The update calls it on slices of the sequence (trainer/optim/logprobs.py), passing the
    slice's log-sum-exp (`lse`) it has already computed.
    """
    logits = logits.float()
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse.unsqueeze(-1))
    return lse - probs.mul_(logits).sum(-1)
