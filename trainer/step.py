"""One BroRL step: generate N rollouts per prompt, score, filter and refill, update, sync.

Generation and scoring go through the rollout seam (`trainer.rollouts.generate_and_score`, or
`run_episodes` for a job with a multi-turn `task.env`);
`collect` produces the step's scored, filtered batch (dynamic sampling with bounded refill
rounds); `update` runs the PPO mini-batches on it; `run_step` times both plus the weight sync
and returns the step's metrics under the names in docs/metrics.md.
"""
from __future__ import annotations

import math
import resource
import time
from typing import Callable
import dataclasses
from dataclasses import dataclass, field

import torch

from trainer import collectives as distributed
from trainer.malloc import release_freed
from trainer.run import Run, env_budget
from trainer.samples import step_samples
from trainer.graders.scorer import step_metrics as grader_step_metrics
from trainer.prompt_stream import mix_seed
from trainer.algo.difficulty import record_draws
from trainer.algo.filtering import filter_rollouts, solve_fractions
from trainer.algo.shaping import overlong_penalty
from trainer.models.lora import reference_model
from trainer.optim.update import ppo_update, sequence_logprobs
from trainer.rollouts import Rollouts, SamplingConfig, concat_rollouts, generate_and_score, run_episodes
from trainer.algo.schedule import StagePlan, lr_at


@dataclass
class SampleCounts:
    """A step's generation statistics: what each round adds, summed over the step's rounds."""

    samples: int = 0
    lengths: list[int] = field(default_factory=list)
    truncated: int = 0
    groups: int = 0
    all_correct: int = 0
    all_wrong: int = 0
    gen_s: float = 0.0
    score_s: float = 0.0
    grades: list = field(default_factory=list)   # a grader's per-sample GradeResults (or None)
    # Multi-turn episodes (task.env): sums over the round's samples.
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    budget_truncated: int = 0
    env_errors: int = 0
    env_s: float = 0.0

    def add(self, other: SampleCounts) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Collected:
    """One step's scored batch after filtering and refills, with the counts of every round."""

    batch: Rollouts | None                       # informative groups only (when filtering)
    counts: SampleCounts = field(default_factory=SampleCounts)
    rounds: int = 0
    correct: list[torch.Tensor] = field(default_factory=list)
    rewards: list[torch.Tensor] = field(default_factory=list)
    kept_groups: int = 0
    positions: torch.Tensor | None = None        # each sample's place in the one-process batch
    first_round: Rollouts | None = None          # unfiltered: where the stored samples come from

    def add_round(self, rollouts: Rollouts, counts: SampleCounts) -> None:
        self.counts.add(counts)
        self.correct.append(rollouts.correct)
        self.rewards.append(rollouts.rewards)


def _generate_round(run: Run, plan: StagePlan, index: int, round_index: int, k: int) -> tuple[Rollouts, SampleCounts]:
    spec = run.spec
    # Every rank draws the same k prompts (the stream stays in step) and keeps its share:
    # whole prompts, so a group is never split across ranks.
    drawn = run.stream.take(k, run.difficulty.is_retired if run.difficulty is not None else None)
    idx = distributed.share(drawn)
    if not idx:
        if run.difficulty is not None:  # the others' all-reduce of their groups
            record_draws(run.difficulty, drawn, torch.zeros(0), torch.zeros(0, dtype=torch.long))
        return _empty_round()
    seed = mix_seed(spec.seed, index, round_index, distributed.rank()) if distributed.active() else mix_seed(spec.seed, index, round_index)
    sampling = SamplingConfig(n=plan.n, max_new_tokens=spec.rollout.max_new_tokens,
                              temperature=spec.rollout.temperature, top_p=spec.rollout.top_p, seed=seed)
    examples = [run.task.train[i] for i in idx]
    if spec.task.env is None:
        episodes = generate_and_score(run.engine, run.tokenizer, run.scorer, [run.train_ids[i] for i in idx],
                                      examples, sampling)
    else:  # episodes of model turns and environment replies (trainer/rollouts/multiturn.py)
        episodes = run_episodes(run.engine, run.tokenizer, run.env, run.scorer, examples, sampling,
                                max_turns=spec.task.env.max_turns, max_total_tokens=env_budget(spec),
                                reward_mode=spec.task.env.reward_mode, check=run.stop_check,
                                max_context=run.max_seq_len)
    rollouts = episodes.to_rollouts()
    if spec.algo.overlong is not None:
        # The model's tokens against the completion's budget (an episode's: task.env.max_total_tokens).
        o, lengths = spec.algo.overlong, torch.tensor(rollouts.model_lengths())
        rollouts.rewards = rollouts.rewards + overlong_penalty(lengths, env_budget(spec), o.buffer, o.penalty)
    if run.difficulty is not None:
        record_draws(run.difficulty, drawn, rollouts.correct, rollouts.group)
    solved, wrong = solve_fractions(rollouts.correct, rollouts.rewards, rollouts.group)
    counts = SampleCounts(samples=len(episodes), lengths=episodes.lengths(),
                         truncated=sum(episodes.truncated), groups=int(solved.numel()),
                         all_correct=int((solved == 1).sum()), all_wrong=int(wrong.sum()),
                         gen_s=episodes.gen_s, score_s=episodes.score_s, grades=episodes.grades,
                         turns=sum(episodes.turns), tool_calls=sum(episodes.tool_calls),
                         tool_errors=sum(episodes.tool_errors), budget_truncated=sum(episodes.budget_truncated),
                         env_errors=episodes.env_errors, env_s=episodes.env_s)
    return rollouts, counts


def _empty_round() -> tuple[Rollouts, SampleCounts]:
    """A rank whose share of a small round is no prompt."""
    none = torch.zeros(0, dtype=torch.bool)
    return (Rollouts(prompt_ids=[], response_ids=[], engine_logprobs=[], group=torch.zeros(0, dtype=torch.long),
                     rewards=torch.zeros(0), truncated=none, correct=none),
            SampleCounts())


def prompts_to_ask(deficit: int, keep_rate: float, max_oversample: float) -> int:
    """Prompts to generate for `deficit` missing groups at the running keep rate.

    Asking only for the deficit fills ~88 % of the batch at a 41 % keep rate (the paper's at N = 16);
    asking deficit / keep_rate (capped at `max_oversample` x) fills it in about one round,
    as NeMo-RL's batch multiplier does.
    """
    factor = min(1.0 / max(keep_rate, 1e-6), max_oversample)
    return max(deficit, math.ceil(deficit * factor))


def collect(run: Run, plan: StagePlan, index: int) -> Collected:
    """Generate and score; with dynamic sampling, oversample and refill for a few rounds.

    Kept groups beyond `prompts_per_step` are dropped (the batch shape stays the spec's);
    fewer than asked after the last round is reported as a shortfall, never hidden.
    """
    collected = Collected(batch=None)
    algo = run.spec.algo
    parts, have = [], 0
    kept_sizes = []  # samples this rank keeps from each round (0 too: the ranks' rounds align)
    for round_index in range(algo.max_refill_rounds + 1):
        deficit = plan.prompts_per_step - have
        ask = prompts_to_ask(deficit, run.keep_rate_running, algo.max_oversample) \
            if algo.dynamic_sampling else deficit
        rollouts, counts = _generate_round(run, plan, index, round_index, ask)
        collected.add_round(rollouts, counts)
        if round_index == 0:
            collected.first_round = rollouts
        collected.rounds = round_index
        if not algo.dynamic_sampling:
            parts, have, kept_sizes = [rollouts], plan.prompts_per_step, [len(rollouts)]
            break
        kept, stats = filter_rollouts(rollouts) if len(rollouts) else (rollouts, {"kept_groups": 0})
        # Many ranks: the counts are every rank's (the same decisions on each), and the first
        # `deficit` kept groups in rank order are taken, as one process would take them.
        kept_by_rank = distributed.all_gather_int(stats["kept_groups"])
        groups = int(distributed.all_sum_floats([counts.groups])[0])
        before = sum(kept_by_rank[:distributed.rank()])
        # Running keep rate of groups: a plain mean over the first rounds, then an EMA (so
        # one odd round does not swing the next ask, and the rate can follow training).
        run.keep_rounds_seen += 1
        w = max(1.0 / run.keep_rounds_seen, 0.3)
        rate = sum(kept_by_rank) / max(groups, 1)
        run.keep_rate_running = (1 - w) * run.keep_rate_running + w * rate
        take = min(stats["kept_groups"], max(deficit - before, 0))
        if take:
            kept.extras.pop("orig_group", None)
            if take < stats["kept_groups"]:
                kept = kept.select((kept.group < take).nonzero(as_tuple=True)[0])
            parts.append(kept)
        kept_sizes.append(len(kept) if take else 0)
        have += min(sum(kept_by_rank), deficit)
        if have >= plan.prompts_per_step:
            break
    collected.kept_groups = have
    collected.batch = concat_rollouts(parts) if parts else None
    collected.positions = one_process_positions(kept_sizes)
    return collected


def one_process_positions(kept_sizes: list[int]) -> torch.Tensor | None:
    """Where this rank's samples sit in the batch one process would have built: rounds in
    order, within a round rank 0's kept groups first (None in one process)."""
    if not distributed.active():
        return None
    out, base = [], 0
    for n in kept_sizes:  # every rank has the same number of rounds (the loop is global)
        sizes = distributed.all_gather_int(n)
        start = base + sum(sizes[:distributed.rank()])
        out.append(torch.arange(start, start + n))
        base += sum(sizes)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def train_on_batch(run: Run, batch: Rollouts, index: int, positions: torch.Tensor | None = None) -> dict[str, float]:
    """Advantages, then `mini_batches` PPO updates over the batch (micro-batched backward).

    The batch is split into exactly min(mini_batches, len(batch)) mini-batches whose sizes
    differ by at most one (`tensor_split`; `chunk` may give fewer, e.g. 6 samples in 4 -> 3).
    """
    spec, algo = run.spec, run.spec.algo
    lengths = torch.tensor(batch.model_lengths(), dtype=torch.float32)  # the model's tokens
    token_weights = lengths if algo.advantage_whitening == "token" else None
    reduce = distributed.all_sum if distributed.active() else None
    batch.advantages = run.advantage_fn(batch.rewards, batch.group, token_weights, reduce)
    temp = spec.rollout.temperature
    budget, dtype = run.micro_batch_tokens, run.compute_dtype
    cfg = run.update_cfg
    shared = cfg.shared_prefix
    gen = torch.Generator().manual_seed(mix_seed(spec.seed, index, 7919))
    chunks = local_mini_batches(len(batch), algo.mini_batches, gen, positions)
    # One mini-batch: old log-probs = the current ones, taken inside the update (no extra pass).
    old = None if len(chunks) == 1 else sequence_logprobs(
        run.policy, batch.prompt_ids, batch.response_ids, temp, budget, compute_dtype=dtype, shared_prefix=shared,
        fp32_head=cfg.fp32_head)
    ref = None  # run.ref is None when kl_coef is 0: no reference pass
    if run.ref is not None:
        with reference_model(run.policy, run.ref) as ref_model:  # LoRA: the same model, adapter off
            ref = sequence_logprobs(ref_model, batch.prompt_ids, batch.response_ids, temp, budget,
                                    compute_dtype=dtype, shared_prefix=shared, fp32_head=cfg.fp32_head)
    stats: list[dict[str, float]] = []
    for chunk in chunks:
        ids = chunk.tolist()
        s = ppo_update(run.policy, run.optimizer, batch.select(chunk), None if old is None else [old[i] for i in ids],
                       None if ref is None else [ref[i] for i in ids], cfg, budget)
        run.nonfinite_in_row = run.nonfinite_in_row + 1 if s["skipped"] else 0
        if run.nonfinite_in_row >= spec.optim.max_nonfinite_steps:
            raise NonFiniteError(
                f"{run.nonfinite_in_row} updates in a row had a non-finite loss or gradient "
                f"(step {index + 1}); stopping before NaN weights are written. Lower optim.lr, "
                f"set optim.grad_clip, or use model.dtype: float32 to find the cause.")
        stats.append(s)
    out = {k: sum(s[k] for s in stats) / len(stats) for k in stats[0] if k != "skipped"}
    out["skipped_updates"] = sum(s["skipped"] for s in stats)
    out["mini_batch_updates"] = len(stats)
    return out


def split_mini_batches(n: int, mini_batches: int, gen: torch.Generator) -> list[torch.Tensor]:
    """A random permutation of range(n) in exactly min(mini_batches, n) near-equal parts."""
    return list(torch.tensor_split(torch.randperm(n, generator=gen), min(mini_batches, n)))


def local_mini_batches(n: int, mini_batches: int, gen: torch.Generator,
                       positions: torch.Tensor | None = None) -> list[torch.Tensor]:
    """This rank's part of each mini-batch of the whole (all ranks') batch.

    The whole batch is split as one process would split it (same generator), and each rank
    keeps the indices it holds, in the same order (maybe none: it then still joins the
    mini-batch's collectives). `positions`: each local sample's place in the one-process batch
    (`one_process_positions`; default: every rank's samples in rank order).
    """
    sizes = distributed.all_gather_int(n)
    total = sum(sizes)
    if positions is None:
        offset = sum(sizes[:distributed.rank()])
        positions = torch.arange(offset, offset + n)
    local = torch.full((total,), -1, dtype=torch.long)
    local[positions] = torch.arange(n)
    parts = [local[c] for c in split_mini_batches(total, mini_batches, gen)]
    return [c[c >= 0] for c in parts]


class NonFiniteError(RuntimeError):
    """Too many updates in a row with a non-finite loss or gradient."""


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # CPU: the process's peak resident set so far (Linux reports KiB).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _global_step_counts(collected: Collected, rewards: torch.Tensor, correct: torch.Tensor) -> dict[str, float]:
    """Sums `collected`'s counts over ranks in place (generation and scoring times: the ranks'
    mean, they run side by side); returns the whole step's sample statistics."""
    r, k = rewards.double(), collected.counts
    (k.samples, k.truncated, k.groups, k.all_correct, k.all_wrong, n, s, sq, c,
     length_sum, gen_s, score_s) = distributed.all_sum_floats(
        [k.samples, k.truncated, k.groups, k.all_correct, k.all_wrong, len(r), float(r.sum()),
         float((r * r).sum()), float(correct.sum()), sum(k.lengths), k.gen_s, k.score_s])
    k.gen_s, k.score_s = gen_s / distributed.world_size(), score_s / distributed.world_size()
    mean = s / max(n, 1)
    return {"reward_mean": mean, "pass_rate": c / max(n, 1),
            "reward_std": max((sq - n * mean * mean) / (n - 1), 0.0) ** 0.5 if n > 1 else 0.0,
            "response_len_mean": length_sum / max(n, 1),
            "response_len_max": max(distributed.all_gather_int(max(k.lengths, default=0)))}


def _samples(run: Run, rollouts: Rollouts) -> list[dict]:
    """The step's stored samples (`trainer.samples`), with the advantages over their round."""
    lengths = torch.tensor(rollouts.model_lengths(), dtype=torch.float32)
    weights = lengths if run.spec.algo.advantage_whitening == "token" else None
    advantages = run.advantage_fn(rollouts.rewards, rollouts.group, weights, None)
    return step_samples(rollouts, advantages, run.tokenizer, run.spec.samples.per_step,
                        run.spec.samples.max_chars)


UPDATE_KEYS = ("loss", "pg_clipfrac_low", "pg_clipfrac_high", "kl", "entropy", "is_ratio_mean",
               "is_truncated_frac", "mismatch_kl", "is_ess", "grad_norm", "skipped_updates",
               "mini_batch_updates")


def run_step(run: Run, plan: StagePlan, index: int,
             on_samples: Callable[[list[dict]], None] | None = None) -> dict[str, float | int | None]:
    """Run the step of 0-based `index` (steps done before it: what the schedule, the learning
    rate and the seeds count; the job's metrics number it index + 1); return its metrics
    (docs/metrics.md names)."""
    t0 = time.perf_counter()
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.device)
    lr = lr_at(run.plans, index, run.spec.optim.warmup_steps)
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    collected = collect(run, plan, index)
    release_freed()  # BRORL_MALLOC=trim: the heap's free pages go back between phases (trainer/malloc.py)
    run.stop_check()  # generation and scoring may have taken minutes

    t = time.perf_counter()
    upd: dict[str, float | None] = dict.fromkeys(UPDATE_KEYS)
    if collected.batch is None:
        collected.batch = _empty_round()[0]
    # Many ranks: all update or none (the update's collectives need every rank), even one
    # whose share of the kept groups is empty.
    kept = int(distributed.all_sum_floats([len(collected.batch)])[0])
    updated = kept > 0
    if updated:  # else every prompt was filtered out: nothing to learn from this step
        run.policy.train()
        upd = train_on_batch(run, collected.batch, index, collected.positions)
        run.policy.eval()
        release_freed()
    train_s = time.perf_counter() - t
    sync_s = run.engine.sync_weights(run.policy) if updated else 0.0
    if sync_s:
        release_freed()
    if on_samples is not None and run.spec.samples.per_step and collected.first_round is not None:
        on_samples(_samples(run, collected.first_round))
    step_s = time.perf_counter() - t0

    grading = {}
    if hasattr(run.scorer, "last_results"):  # a grader: its errors, time and sub-rewards
        run.grader_watch.record(collected.counts.grades)
        grading = grader_step_metrics(collected.counts.grades)
    rewards = torch.cat(collected.rewards)
    correct = torch.cat(collected.correct).float()
    sample_stats = {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "pass_rate": float(correct.mean()),
        "response_len_mean": sum(collected.counts.lengths) / len(collected.counts.lengths), "response_len_max": max(collected.counts.lengths),
    } if not distributed.active() else _global_step_counts(collected, rewards, correct)  # all ranks' samples
    return {
        "stage": plan.index, "n": plan.n, "prompts": plan.prompts_per_step, "lr": lr,
        **sample_stats,
        "frac_all_correct": collected.counts.all_correct / max(collected.counts.groups, 1),
        "frac_all_wrong": collected.counts.all_wrong / max(collected.counts.groups, 1),
        "keep_rate": kept / collected.counts.samples, "refill_rounds": collected.rounds,
        "kept_groups": collected.kept_groups,
        "groups_shortfall": max(plan.prompts_per_step - collected.kept_groups, 0),
        "underfilled": int(collected.kept_groups < plan.prompts_per_step),
        "keep_rate_running": run.keep_rate_running,
        "truncated_frac": collected.counts.truncated / collected.counts.samples,
        **upd,
        "weight_sync_s": sync_s, "gen_s": collected.counts.gen_s, "score_s": collected.counts.score_s, "train_s": train_s,
        "step_s": step_s, "samples_per_s": collected.counts.samples / step_s,
        "tokens_per_s": sample_stats["response_len_mean"] * collected.counts.samples / step_s, "peak_mem_mb": _peak_mem_mb(run.device),
        "samples": collected.counts.samples,
        **(run.difficulty.metrics() if run.difficulty is not None else {}),
        **grading,
        **(env_metrics(collected.counts) if run.spec.task.env is not None else {}),
    }


def env_metrics(k: SampleCounts) -> dict[str, float]:
    """A multi-turn step's episode metrics (docs/metrics.md), over every rank's samples
    (`k.samples` is already every rank's on many ranks: `_global_step_counts` ran first)."""
    turns, calls, errors, cut, broken, env_s = distributed.all_sum_floats(
        [k.turns, k.tool_calls, k.tool_errors, k.budget_truncated, k.env_errors, k.env_s])
    n = max(k.samples, 1)
    return {"env/turns_mean": turns / n, "env/tool_calls_mean": calls / n, "env/tool_errors_mean": errors / n,
            "env/budget_truncated_frac": cut / n, "env/errors": broken,
            "time/env_s": env_s / distributed.world_size()}
