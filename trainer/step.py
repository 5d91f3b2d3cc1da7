"""One BroRL step: generate N rollouts per prompt, score, filter and refill, update, sync.

`collect` produces the step's scored, filtered batch (dynamic sampling with bounded refill
rounds); `update` runs the PPO mini-batches on it; `run_step` times both plus the weight sync
and returns the step's metrics under the names in JOBSPEC.md.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field

import torch

from trainer.advantages import ADVANTAGES
from trainer.components import Run
from trainer.data import mix_seed
from trainer.filtering import filter_rollouts, group_solve_stats
from trainer.policy import UpdateConfig, ppo_update, sequence_logprobs
from trainer.rollouts import Rollouts, SamplingConfig, concat_rollouts
from trainer.schedule import StagePlan, lr_at


@dataclass
class Collected:
    batch: Rollouts                              # informative groups only (when filtering)
    rounds: int = 0
    samples: int = 0
    correct: list[torch.Tensor] = field(default_factory=list)
    rewards: list[torch.Tensor] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    truncated: int = 0
    groups: int = 0
    all_correct: int = 0
    all_wrong: int = 0
    gen_s: float = 0.0
    score_s: float = 0.0


def _generate_round(run: Run, plan: StagePlan, step: int, rnd: int, k: int, acc: Collected) -> Rollouts:
    spec = run.spec
    idx = run.stream.take(k)
    prompts = [run.train_ids[i] for i in idx]
    sampling = SamplingConfig(n=plan.n, max_new_tokens=spec.rollout.max_new_tokens,
                              temperature=spec.rollout.temperature, top_p=spec.rollout.top_p,
                              seed=mix_seed(spec.seed, step, rnd))
    t = time.perf_counter()
    gen = run.engine.generate(prompts, sampling)
    acc.gen_s += time.perf_counter() - t

    t = time.perf_counter()
    texts = run.tokenizer.batch_decode(gen.token_ids, skip_special_tokens=True)
    examples = [run.task.train[idx[g]] for g in gen.prompt_index]
    truncated = [not f for f in gen.finished]
    scored = run.scorer.score(texts, examples, truncated)
    acc.score_s += time.perf_counter() - t

    group = torch.tensor(gen.prompt_index, dtype=torch.long)
    correct = torch.tensor(scored.correct, dtype=torch.bool)
    rewards = torch.tensor(scored.rewards, dtype=torch.float32)
    solve = group_solve_stats(correct, group)
    solve = solve[~solve.isnan()]
    acc.samples += len(gen)
    acc.correct.append(correct)
    acc.rewards.append(rewards)
    acc.lengths += [len(t) for t in gen.token_ids]
    acc.truncated += sum(truncated)
    acc.groups += int(solve.numel())
    acc.all_correct += int((solve == 1).sum())
    acc.all_wrong += int((solve == 0).sum())
    return Rollouts(prompt_ids=[prompts[g] for g in gen.prompt_index], response_ids=gen.token_ids,
                    engine_logprobs=gen.logprobs, group=group, rewards=rewards,
                    truncated=torch.tensor(truncated, dtype=torch.bool), extras={"correct": correct})


def collect(run: Run, plan: StagePlan, step: int) -> Collected:
    """Generate and score; with dynamic sampling, refill dropped prompts for a few rounds."""
    acc = Collected(batch=None)  # type: ignore[arg-type]
    algo = run.spec.algo
    parts, have = [], 0
    for rnd in range(algo.max_refill_rounds + 1):
        rollouts = _generate_round(run, plan, step, rnd, plan.prompts_per_step - have, acc)
        acc.rounds = rnd
        if not algo.dynamic_sampling:
            parts = [rollouts]
            break
        kept, stats = filter_rollouts(rollouts, rollouts.extras["correct"])
        if len(kept):
            kept.extras.pop("orig_group", None)
            parts.append(kept)
            have += stats["kept_groups"]
        if have >= plan.prompts_per_step:
            break
    acc.batch = concat_rollouts(parts) if parts else None  # type: ignore[assignment]
    return acc


def update(run: Run, batch: Rollouts, step: int) -> dict[str, float]:
    """Advantages, then `mini_batches` PPO updates over the batch (micro-batched backward)."""
    spec, algo = run.spec, run.spec.algo
    batch.advantages = ADVANTAGES[algo.advantage](batch.rewards, batch.group)
    temp = spec.rollout.temperature
    old = sequence_logprobs(run.policy, batch.prompt_ids, batch.response_ids, temp, run.micro_batch_tokens)
    ref = None
    if run.ref is not None:
        ref = sequence_logprobs(run.ref, batch.prompt_ids, batch.response_ids, temp, run.micro_batch_tokens)
    cfg = UpdateConfig(clip_low=algo.clip_low, clip_high=algo.clip_high, kl_coef=algo.kl_coef,
                       kl_estimator=algo.kl_estimator, is_band=algo.is_truncation,
                       temperature=temp, grad_clip=spec.optim.grad_clip)
    gen = torch.Generator().manual_seed(mix_seed(spec.seed, step, 7919))
    order = torch.randperm(len(batch), generator=gen)
    stats: list[dict[str, float]] = []
    for chunk in order.chunk(min(algo.mini_batches, len(batch))):
        ids = chunk.tolist()
        stats.append(ppo_update(run.policy, run.optimizer, batch.select(chunk), [old[i] for i in ids],
                                None if ref is None else [ref[i] for i in ids], cfg, run.micro_batch_tokens))
    return {k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # CPU: the process's peak resident set so far (Linux reports KiB).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


UPDATE_KEYS = ("loss", "pg_clipfrac_low", "pg_clipfrac_high", "kl", "entropy", "is_ratio_mean",
               "is_truncated_frac", "grad_norm")


def run_step(run: Run, plan: StagePlan, step: int) -> dict[str, float | int | None]:
    """Run 0-based global `step`; return its metrics (JOBSPEC.md names)."""
    t0 = time.perf_counter()
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.device)
    lr = lr_at(run.plans, step, run.spec.optim.warmup_steps)
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    acc = collect(run, plan, step)
    run.stop_check()  # generation and scoring may have taken minutes

    t = time.perf_counter()
    upd: dict[str, float | None] = dict.fromkeys(UPDATE_KEYS)
    updated = acc.batch is not None and len(acc.batch) > 0
    if updated:  # else every prompt was filtered out: nothing to learn from this step
        run.policy.train()
        upd = update(run, acc.batch, step)
        run.policy.eval()
    train_s = time.perf_counter() - t
    sync_s = run.engine.sync_weights(run.policy) if updated else 0.0
    step_s = time.perf_counter() - t0

    rewards = torch.cat(acc.rewards)
    correct = torch.cat(acc.correct).float()
    kept = len(acc.batch) if acc.batch is not None else 0
    return {
        "stage": plan.index, "n": plan.n, "prompts": plan.prompts_per_step, "lr": lr,
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "pass_rate": float(correct.mean()),
        "frac_all_correct": acc.all_correct / max(acc.groups, 1),
        "frac_all_wrong": acc.all_wrong / max(acc.groups, 1),
        "keep_rate": kept / acc.samples, "refill_rounds": acc.rounds,
        "response_len_mean": sum(acc.lengths) / len(acc.lengths), "response_len_max": max(acc.lengths),
        "truncated_frac": acc.truncated / acc.samples,
        **upd,
        "weight_sync_s": sync_s, "gen_s": acc.gen_s, "score_s": acc.score_s, "train_s": train_s,
        "step_s": step_s, "samples_per_s": acc.samples / step_s,
        "tokens_per_s": sum(acc.lengths) / step_s, "peak_mem_mb": _peak_mem_mb(run.device),
        "samples": acc.samples,
    }
