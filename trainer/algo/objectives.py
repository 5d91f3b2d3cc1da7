"""The policy objectives `algo.loss` picks from: per-token terms and how they are aggregated.

Each objective is a pair of small pure functions, resolved once when the run is built
(`OBJECTIVES[name]`, held by the update's config), never switched per micro-batch:
- `terms(logp, old_logp, adv, mask, clip_low, clip_high)` -> (per_token_loss, clipped_low,
  clipped_high), all [B, T] over response tokens (right-padded; `mask` marks valid tokens);
- `aggregate(x, mask, totals)`: the micro-batch's share of the mini-batch loss. `totals` are
  the WHOLE mini-batch's counts (every rank's), so micro-batch losses add up to the
  mini-batch's loss whatever the micro-batching, packing or ranks.

The objectives (docs/objectives.md), with the names TRL 1.16 gives the same loss:
- ppo: the token-level clipped surrogate with Clip-Higher, summed over tokens and divided by
  the mini-batch's tokens (TRL's loss_type="dapo"/"bnpo").
- gspo: GSPO's sequence-level ratio s = exp(mean over the sequence of log(pi / pi_old)),
  clipped as PPO's, one term per sequence; the mean over sequences (TRL's
  importance_sampling_level="sequence" with loss_type="grpo").
- cispo: CISPO's clipped, stop-gradient ratio weighting every token's log-prob,
  -sg(min(r, 1 + clip_high)) A log pi, so no token's gradient is dropped; over the mini-batch's
  tokens (TRL's loss_type="cispo" with epsilon_high = 1 + clip_high).
- dr_grpo: Dr. GRPO's constant normaliser: the clipped token terms summed and divided by
  samples x max_new_tokens (TRL's loss_type="dr_grpo"), so a long response's tokens weigh
  what a short one's do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from trainer.algo.losses import LOG_RATIO_CLAMP, _log_ratio, ppo_clip_terms, token_sum


@dataclass(frozen=True)
class Totals:
    """The mini-batch's counts the aggregation divides by (summed over ranks)."""

    tokens: int
    samples: int
    max_new_tokens: int


def gspo_terms(logp, old_logp, advantages, mask, clip_low: float, clip_high: float):
    """GSPO: one clipped ratio per sequence, s = exp(mean_t (logp - old_logp)), broadcast to
    the sequence's tokens. Its gradient is s A x the mean of the tokens' grad log pi
    (unclipped). Clip masks are per sequence, broadcast too."""
    lengths = mask.sum(-1, keepdim=True).clamp_min(1).to(logp.dtype)
    diff = torch.where(mask.bool(), logp - old_logp.detach(), torch.zeros((), dtype=logp.dtype, device=logp.device))
    seq_log_ratio = diff.sum(-1, keepdim=True) / lengths
    ratio = torch.exp(seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    loss = -torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    r = ratio.detach()
    low = (adv < 0) & (r < 1.0 - clip_low)
    high = (adv > 0) & (r > 1.0 + clip_high)
    return loss.expand_as(logp), low.expand_as(logp), high.expand_as(logp)


def cispo_terms(logp, old_logp, advantages, mask, clip_low: float, clip_high: float):
    """CISPO: -sg(min(r, 1 + clip_high)) A logp per token (no lower bound, as MiniMax-M1 and
    TRL). `clip_low` unused. `clipped_high` marks the tokens whose weight the cap set."""
    r = torch.exp(_log_ratio(logp, old_logp.detach())).detach()
    weight = r.clamp(max=1.0 + clip_high)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    loss = -weight * adv * logp
    return loss, torch.zeros_like(r, dtype=torch.bool), r > 1.0 + clip_high


def ppo_terms(logp, old_logp, advantages, mask, clip_low: float, clip_high: float):
    """The token-level clipped PPO surrogate (`ppo_clip_terms`); `mask` unused."""
    return ppo_clip_terms(logp, old_logp, advantages, clip_low, clip_high)


def per_token_mean(x: torch.Tensor, mask: torch.Tensor, totals: Totals) -> torch.Tensor:
    """Sum over valid tokens / the mini-batch's valid tokens."""
    return token_sum(x, mask) / max(totals.tokens, 1)


def per_sequence_mean(x: torch.Tensor, mask: torch.Tensor, totals: Totals) -> torch.Tensor:
    """Each sequence's token mean, summed / the mini-batch's sequences."""
    lengths = mask.sum(-1, keepdim=True).clamp_min(1).to(x.dtype)
    return token_sum(x / lengths, mask) / max(totals.samples, 1)


def constant_norm(x: torch.Tensor, mask: torch.Tensor, totals: Totals) -> torch.Tensor:
    """Sum over valid tokens / (the mini-batch's sequences x max_new_tokens)."""
    return token_sum(x, mask) / (max(totals.samples, 1) * max(totals.max_new_tokens, 1))


@dataclass(frozen=True)
class Objective:
    terms: Callable
    aggregate: Callable[[torch.Tensor, torch.Tensor, Totals], torch.Tensor]
    # The loss is a sum of per-token terms (a token's gradient depends on its own log-prob
    # alone), so the update may compute it slice by slice in the log-prob forward
    # (trainer/optim/fused_head.py). GSPO's sequence ratio is not.
    per_token: bool = True


OBJECTIVES: dict[str, Objective] = {
    "ppo": Objective(ppo_terms, per_token_mean),
    "gspo": Objective(gspo_terms, per_sequence_mean, per_token=False),
    "cispo": Objective(cispo_terms, per_token_mean),
    "dr_grpo": Objective(ppo_terms, constant_norm),
}
