"""Typed batches handed between the algorithm pieces (ARCHITECTURE.md rule 3).

`Generation` is what a rollout engine returns; `Rollouts` is one step's scored batch,
flat over samples, with `group` telling which prompt each sample came from.
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
    advantages: torch.Tensor | None = None  # [S] float, set by trainer.advantages
    extras: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.response_ids)

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
            advantages=None if self.advantages is None else self.advantages[idx],
        )
