"""Typed batches handed between the algorithm pieces, which are pure functions of them.

`Generation` is what a rollout engine returns; `Rollouts` is one step's scored batch,
flat over samples, with `group` telling which prompt each sample came from (built from the
rollout seam's `Episodes`, generate.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingConfig:
    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Generation:
    """Engine output for P unique prompts x n samples, flat and prompt-major."""

    prompt_index: list[int]          # per sample: index into the prompts passed in
    token_ids: list[list[int]]       # per sample: response token ids (no prompt)
    logprobs: list[list[float]]      # per sample: the engine's log-prob of each response token
    finished: list[bool]             # per sample: False when cut at max_new_tokens

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class Rollouts:
    """One step's samples after scoring; the unit the objective works on."""

    prompt_ids: list[list[int]]      # per sample: prompt token ids (shared lists per group)
    response_ids: list[list[int]]    # per sample: response token ids
    engine_logprobs: list[list[float]]
    group: torch.Tensor              # [S] long: prompt (group) index of each sample
    rewards: torch.Tensor            # [S] float
    truncated: torch.Tensor          # [S] bool
    correct: torch.Tensor | None = None     # [S] bool: the verifier's verdict (pass rate, filter stats)
    advantages: torch.Tensor | None = None  # [S] float, set by trainer.algo.advantages
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # other per-sample tensors
    # Per sample, per response token: 1 where the model wrote it (loss, ratios, KL, entropy),
    # 0 where an environment did (context only). None: every response token is the model's.
    loss_mask: list[list[int]] | None = None
    # Per sample, a multi-turn episode's transcript and counts for the stored samples
    # (`Episodes.episode_rows`); None for single-turn batches.
    episodes: list[dict] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)

    def model_lengths(self) -> list[int]:
        """Per sample, the response tokens the model wrote (all of them without a loss mask):
        what token-weighted statistics and length shaping count."""
        if self.loss_mask is None:
            return [len(r) for r in self.response_ids]
        return [int(sum(m)) for m in self.loss_mask]

    def select(self, idx: torch.Tensor) -> "Rollouts":
        """The samples at `idx` (a 1-D long tensor), in that order."""
        ids = idx.tolist()
        return Rollouts(
            prompt_ids=[self.prompt_ids[i] for i in ids],
            response_ids=[self.response_ids[i] for i in ids],
            engine_logprobs=[self.engine_logprobs[i] for i in ids],
            group=self.group[idx],
            rewards=self.rewards[idx],
            truncated=self.truncated[idx],
            correct=None if self.correct is None else self.correct[idx],
            advantages=None if self.advantages is None else self.advantages[idx],
            extras={k: v[idx] for k, v in self.extras.items()},
            loss_mask=None if self.loss_mask is None else [self.loss_mask[i] for i in ids],
            episodes=None if self.episodes is None else [self.episodes[i] for i in ids],
        )


def concat_rollouts(parts: list[Rollouts]) -> Rollouts:
    """Join batches from several generation rounds, keeping group ids distinct."""
    offset, groups = 0, []
    for p in parts:
        groups.append(p.group + offset)
        offset += int(p.group.max()) + 1 if len(p) else 0
    extras = {k: torch.cat([p.extras[k] for p in parts]) for k in parts[0].extras} if parts else {}
    # A part without a mask is all model tokens: 1s, so the joined batch keeps one mask.
    mask = None if all(p.loss_mask is None for p in parts) else [
        m for p in parts for m in (p.loss_mask if p.loss_mask is not None else [[1] * len(r) for r in p.response_ids])]
    return Rollouts(
        prompt_ids=[x for p in parts for x in p.prompt_ids],
        response_ids=[x for p in parts for x in p.response_ids],
        engine_logprobs=[x for p in parts for x in p.engine_logprobs],
        group=torch.cat(groups) if groups else torch.zeros(0, dtype=torch.long),
        rewards=torch.cat([p.rewards for p in parts]) if parts else torch.zeros(0),
        truncated=torch.cat([p.truncated for p in parts]) if parts else torch.zeros(0, dtype=torch.bool),
        correct=(torch.cat([p.correct for p in parts])
                 if parts and all(p.correct is not None for p in parts) else None),
        extras=extras,
        loss_mask=mask,
        episodes=None if all(p.episodes is None for p in parts) else [
            e for p in parts for e in (p.episodes if p.episodes is not None else [None] * len(p))],
    )
