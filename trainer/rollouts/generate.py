"""The rollout seam: N samples of each prompt generated, decoded and scored in one place.

`generate_and_score` is the only code that turns prompts into scored samples: the training
step, evaluation and the probe call it with their own sampling settings and read what they
need from the `Episodes` it returns. It makes one engine call for all the prompts (large N is
one request of n samples per unique prompt, never a request per sample), decodes the
completions, scores them with the run's scorer (a built-in verifier or a grader: one
interface) and keeps the grader's per-sample detail.

Token ids are kept exactly as the engine sampled them: they are what training computes
ratios on, and decoding then re-tokenising text does not give them back. `loss_mask` is None
while every completion token is the model's (single-turn); a multi-turn environment appends
its own tokens (tool results, observations) to a completion and marks them 0 there, so that
they are context but carry no loss.

The seam draws no random numbers of its own: the engine's seed in `SamplingConfig` alone
decides the samples, so a seeded run gives the same samples whoever calls it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from trainer.rollouts.batch import Rollouts, SamplingConfig
from trainer.stop import never


@dataclass
class Episodes:
    """Scored samples of P prompts x n, flat and prompt-major (as the engine returns them)."""

    prompt_index: list[int]               # per sample: index into the prompts passed in
    prompt_ids: list[list[int]]           # per sample: its prompt's ids (one shared list per prompt)
    completion_ids: list[list[int]]       # per sample: every token after the prompt, as sampled
    logprobs: list[list[float]]           # per sample: the engine's log-prob of each completion token
    texts: list[str]                      # per sample: the decoded completion the scorer read
    truncated: list[bool]                 # per sample: cut by the token budget, never verified
    rewards: list[float]
    correct: list[bool]
    scores: list[float] | None = None     # the verifier's raw scores, where the scorer reports them
    timeouts: int = 0                     # samples whose scoring timed out
    grades: list = field(default_factory=list)  # a grader's per-sample results (or None); [] for a verifier
    sub_rewards: dict[str, list[float]] = field(default_factory=dict)  # a grader's sub-reward per sample
    # Per sample, per completion token: 1 where the model wrote it (loss, ratios, KL and
    # entropy), 0 where an environment did. None: all 1, every completion is the model's.
    loss_mask: list[list[int]] | None = None
    gen_s: float = 0.0                    # seconds in the engine
    score_s: float = 0.0                  # seconds decoding and scoring
    # Multi-turn episodes (trainer.rollouts.multiturn); empty lists for single-turn samples.
    messages: list[list[dict]] = field(default_factory=list)  # per sample: the transcript
    turns: list[int] = field(default_factory=list)            # per sample: model turns
    tool_calls: list[int] = field(default_factory=list)       # per sample: tool calls answered
    tool_errors: list[int] = field(default_factory=list)      # per sample: of which failed
    budget_truncated: list[bool] = field(default_factory=list)  # per sample: ended by max_total_tokens
    infos: list[dict] = field(default_factory=list)           # per sample: the environment's info, error
    env_errors: int = 0                   # trajectories the environment itself broke (reward 0)
    env_s: float = 0.0                    # seconds awaiting the environment

    def __len__(self) -> int:
        return len(self.completion_ids)

    def lengths(self) -> list[int]:
        """Completion lengths in tokens."""
        return [len(t) for t in self.completion_ids]

    def correct_counts(self, prompts: int) -> list[int]:
        """How many samples of each of the `prompts` prompts were correct."""
        counts = [0] * prompts
        for p, ok in zip(self.prompt_index, self.correct):
            counts[p] += int(ok)
        return counts

    def to_rollouts(self) -> Rollouts:
        """The training batch: one group per prompt, the grader's sub-rewards as `reward/<key>`
        extras (what the stored samples and metrics read), the loss mask as it is (the update
        puts loss only where it is 1)."""
        return Rollouts(prompt_ids=self.prompt_ids, response_ids=self.completion_ids,
                        engine_logprobs=self.logprobs,
                        group=torch.tensor(self.prompt_index, dtype=torch.long),
                        rewards=torch.tensor(self.rewards, dtype=torch.float32),
                        truncated=torch.tensor(self.truncated, dtype=torch.bool),
                        correct=torch.tensor(self.correct, dtype=torch.bool),
                        extras={f"reward/{k}": torch.tensor(v, dtype=torch.float32)
                                for k, v in self.sub_rewards.items()},
                        loss_mask=self.loss_mask, episodes=self.episode_rows())

    def episode_rows(self) -> list[dict] | None:
        """Per sample, what the stored samples show of a multi-turn episode (None: single-turn)."""
        if not self.messages:
            return None
        return [{"messages": m, "turns": t, "tool_calls": c, "tool_errors": e, "info": i}
                for m, t, c, e, i in zip(self.messages, self.turns, self.tool_calls, self.tool_errors,
                                         self.infos or [{}] * len(self.messages))]


def generate_and_score(engine: Any, tokenizer: Any, scorer: Any, prompts: list[list[int]],
                       examples: Sequence[Any], sampling: SamplingConfig, *,
                       check: Callable[[], None] = never) -> Episodes:
    """`sampling.n` samples of each prompt (`examples[i]` is what `prompts[i]` asks), scored.

    `check` runs between generation and scoring (a stop check: scoring a large batch takes a
    while too) and may raise to abandon the batch.
    """
    if len(prompts) != len(examples):
        raise ValueError(f"{len(prompts)} prompts but {len(examples)} examples")
    t = time.perf_counter()
    gen = engine.generate(prompts, sampling)
    gen_s = time.perf_counter() - t
    check()
    t = time.perf_counter()
    texts = tokenizer.batch_decode(gen.token_ids, skip_special_tokens=True)
    truncated = [not f for f in gen.finished]
    scored = scorer.score(texts, [examples[g] for g in gen.prompt_index], truncated)
    grades, sub_rewards = _grader_detail(scorer)
    return Episodes(prompt_index=gen.prompt_index, prompt_ids=[prompts[g] for g in gen.prompt_index],
                    completion_ids=gen.token_ids, logprobs=gen.logprobs, texts=texts, truncated=truncated,
                    rewards=list(scored.rewards), correct=list(scored.correct),
                    scores=getattr(scored, "scores", None), timeouts=int(getattr(scored, "timeouts", 0) or 0),
                    grades=grades, sub_rewards=sub_rewards, gen_s=gen_s, score_s=time.perf_counter() - t)


def _grader_detail(scorer: Any) -> tuple[list, dict[str, list[float]]]:
    """A grader's per-sample results of the batch just scored, and each of its sub-rewards per
    sample (0 where a sample was not graded); nothing for a built-in verifier."""
    results = getattr(scorer, "last_results", None)
    if results is None:
        return [], {}
    sub = {key: [r.sub_rewards.get(key, 0.0) if r is not None else 0.0 for r in results]
           for key in scorer.sub_reward_keys}
    return list(results), sub


def encode_prompts(tokenizer: Any, examples: Sequence[Any], template: str | None) -> list[list[int]]:
    """Each example's prompt as token ids: rendered (`trainer.tasks.prompts.render_example`),
    then tokenised; a chat template already adds the special tokens it wants."""
    from trainer.tasks.prompts import render_example  # lazily: engines import this room

    special = not getattr(tokenizer, "chat_template", None)
    return [tokenizer(render_example(ex, template, tokenizer), add_special_tokens=special)["input_ids"]
            for ex in examples]
