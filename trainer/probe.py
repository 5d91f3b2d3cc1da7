"""Before training: sample a model n times on each eval prompt and read its pass@k curve.

The question a probe answers is BroRL's regime question (docs/probe.md): how many prompts does
a N = 16 batch leave all-wrong although the model can solve them? It runs the eval split
through the same rollout seam, engine, prompt rendering and scorer as training and evaluation
(`rollout_chunk`: `trainer.rollouts.generate_and_score`, or `run_episodes` against the job's
environment when its task has a `task.env`, with the job's reward mode, max_turns and episode
budget; `trainer.evaluate.opened` builds that environment once and closes it), at the training rollout's
temperature by default, and turns the per-prompt correct counts into figures
(`trainer.algo.probe_stats`) and a recommended schedule (`trainer.algo.recommend`).

Generation goes in chunks of at most `chunk_samples` samples (several prompts x n when n is
small, one prompt in pieces when n is large), so memory does not grow with n (up to 4096); the
stop callable is checked before each chunk, so a cancel reaches a probe within one chunk, and
`on_progress` hears after each one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trainer.algo.probe_stats import figures
from trainer.algo.recommend import recommend
from trainer.evaluate import EvalContext, opened
from trainer.prompt_stream import mix_seed
from trainer.rollouts import Episodes, SamplingConfig, generate_and_score, run_episodes
from trainer.spec import JobSpec
from trainer.stop import stop_check
from trainer.probe_spec import ProbeSpec

Progress = Callable[[dict], None]


def chunk_plan(prompts: int, n: int, chunk: int) -> list[tuple[list[int], int]]:
    """Generate calls as (prompt indices, samples per prompt), each at most `chunk` samples
    samples, covering every prompt n times (a prompt whose n exceeds `chunk` is split)."""
    if n <= chunk:
        per = max(1, chunk // n)
        return [(list(range(p, min(p + per, prompts))), n) for p in range(0, prompts, per)]
    calls = []
    for p in range(prompts):
        left = n
        while left:
            take = min(chunk, left)
            calls.append(([p], take))
            left -= take
    return calls


@dataclass
class Tally:
    """What the chunks add up to, per prompt and overall."""

    correct: list[int]
    reward_sum: list[float]
    samples: int = 0
    tokens: int = 0
    truncated: int = 0
    timeouts: int = 0
    gen_s: float = 0.0
    score_s: float = 0.0
    # Multi-turn episodes (task.env): sums over the samples (docs/metrics.md's env/* names).
    episodes: bool = False
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    budget_truncated: int = 0
    env_errors: int = 0
    env_s: float = 0.0

    def add(self, owners: list[int], episodes: Episodes) -> None:
        """One chunk's episodes; `owners[i]`: the prompt (of all) that sample i answers."""
        for p, ok, r in zip(owners, episodes.correct, episodes.rewards):
            self.correct[p] += int(ok)
            self.reward_sum[p] += float(r)
        self.samples += len(episodes)
        self.tokens += sum(episodes.lengths())
        self.truncated += sum(episodes.truncated)
        self.timeouts += episodes.timeouts
        self.gen_s += episodes.gen_s
        self.score_s += episodes.score_s
        if episodes.turns:  # run_episodes' samples
            self.episodes = True
            self.turns += sum(episodes.turns)
            self.tool_calls += sum(episodes.tool_calls)
            self.tool_errors += sum(episodes.tool_errors)
            self.budget_truncated += sum(episodes.budget_truncated)
            self.env_errors += episodes.env_errors
            self.env_s += episodes.env_s

    def env_figures(self) -> dict | None:
        """The episodes' figures (None for single-turn samples): per sample means of model
        turns, tool calls and tool errors, the share ended by the episode budget, the
        trajectories the environment itself broke, and the seconds awaiting it."""
        if not self.episodes:
            return None
        n = max(self.samples, 1)
        return {"turns_mean": self.turns / n, "tool_calls_mean": self.tool_calls / n,
                "tool_errors_mean": self.tool_errors / n, "budget_truncated_frac": self.budget_truncated / n,
                "errors": self.env_errors, "seconds": self.env_s}


def rollout_chunk(ctx: EvalContext, job: JobSpec, idx: list[int], sampling: SamplingConfig,
                  check: Callable[[], None]) -> Episodes:
    """`sampling.n` samples of each prompt `idx` of `ctx`, scored, through the rollout seam:
    single completions, or, when `job` has a `task.env`, episodes against `ctx.env` with the
    job's reward mode, max_turns and episode budget (as a training step runs them). An
    environment's task is never sampled single-turn: without `ctx.env` it is an error."""
    examples = [ctx.examples[i] for i in idx]
    env = job.task.env
    if env is None:
        return generate_and_score(ctx.engine, ctx.tokenizer, ctx.scorer, [ctx.prompt_ids[i] for i in idx],
                                  examples, sampling, check=check)
    if ctx.env is None:
        raise RuntimeError(f"task.env (type {env.type}) has no environment opened: its prompts are "
                           "episodes, never single completions")
    from trainer.run import env_budget

    return run_episodes(ctx.engine, ctx.tokenizer, ctx.env, ctx.scorer, examples, sampling,
                        max_turns=env.max_turns, max_total_tokens=env_budget(job),
                        reward_mode=env.reward_mode, check=check, max_context=ctx.max_context)


def sample_counts(ctx: EvalContext, probe: ProbeSpec, job: JobSpec, check: Callable[[], None],
                  on_progress: Progress | None = None) -> Tally:
    """Correct counts of `probe.n` samples on each prompt of `ctx`, chunk by chunk (`job`: the
    spec sampled, whose `task.env` makes each sample an episode)."""
    prompts = len(ctx.prompt_ids)
    tally = Tally(correct=[0] * prompts, reward_sum=[0.0] * prompts)
    total = prompts * probe.n
    for call, (idx, count) in enumerate(chunk_plan(prompts, probe.n, probe.chunk_samples)):
        check()
        sampling = SamplingConfig(n=count, max_new_tokens=probe.max_new_tokens, temperature=probe.temperature,
                                  top_p=probe.top_p, seed=mix_seed(probe.seed, 7919, call))
        episodes = rollout_chunk(ctx, job, idx, sampling, check)
        tally.add([idx[g] for g in episodes.prompt_index], episodes)
        if on_progress:
            on_progress({"samples_done": tally.samples, "samples_total": total})
    return tally


def result_of(tally: Tally, probe: ProbeSpec, base: JobSpec, seconds: float) -> dict:
    """The probe's whole result: figures, run totals and the recommendation."""
    n = probe.n
    out = figures(tally.correct, n, [r / n for r in tally.reward_sum], seed=probe.seed)
    samples = max(tally.samples, 1)
    out.update({
        "response_len_mean": tally.tokens / samples,
        "truncated_frac": tally.truncated / samples,
        "tokens": tally.tokens,
        "samples": tally.samples,
        "seconds": seconds,
        "gen_seconds": tally.gen_s,
        "score_seconds": tally.score_s,
        # Sampling throughput (generation + scoring), without the model's load or warm start.
        "samples_per_s": tally.samples / max(tally.gen_s + tally.score_s, 1e-9),
        "temperature": probe.temperature,
        "max_new_tokens": probe.max_new_tokens,
    })
    if (env := tally.env_figures()) is not None:
        out["env"] = env
    out["recommendation"] = recommend(out, base)
    return out


def probe(spec: ProbeSpec, base: JobSpec, should_stop: Callable[[], bool], *, model_dir: Path | None = None,
          dataset_path: Path | None = None, on_progress: Progress | None = None,
          name: str | None = None) -> dict:
    """Probe the model of `base` (or the checkpoint folder `model_dir`) on `base`'s task.
    `name` (the probe's id and attempt) tags a task.env's sandboxes and sessions.

    `base` is the job spec the recommendation builds on: the user's own, or
    `trainer.probe_spec.base_job_spec(spec)`. Raises `trainer.stop.StopRequested` when
    `should_stop()` turns true (between chunks, and during builtin:tiny's warm start).
    """
    from trainer.threads import configure_threads

    configure_threads()
    check = stop_check(should_stop)
    t0 = time.perf_counter()
    with opened(base, model_dir, dataset_path, prompts=spec.prompts,
                max_num_seqs=min(spec.chunk_samples, spec.n * spec.prompts), stop_check=check,
                env_name=name) as ctx:
        tally = sample_counts(ctx, spec, base, check, on_progress)
    result = result_of(tally, spec, base, time.perf_counter() - t0)
    if result["prompts"] < spec.prompts:
        result["note"] = f"the eval split has {result['prompts']} prompts; {spec.prompts} were asked for"
    return result


def probe_policy(ctx: EvalContext, spec: JobSpec, n: int, prompts: int, at_n: int,
                 check: Callable[[], None], seed: int) -> dict:
    """Mid-training probe (`rollout.broaden.trigger: probe`): the running policy's engine, `n`
    samples on the first `prompts` eval prompts at the rollout's sampling, summarised for the
    decision: the share of prompts all-wrong at the stage's `at_n` yet solved within `n`."""
    from trainer.algo.probe_stats import decision_figures

    pspec = ProbeSpec(model=spec.model, task=spec.task, n=n, prompts=prompts, seed=seed,
                      max_new_tokens=spec.rollout.max_new_tokens, temperature=spec.rollout.temperature,
                      top_p=spec.rollout.top_p)
    sub = EvalContext(ctx.engine, ctx.tokenizer, ctx.scorer, ctx.examples[:prompts], ctx.prompt_ids[:prompts],
                      env=ctx.env, max_context=ctx.max_context)
    t0 = time.perf_counter()
    tally = sample_counts(sub, pspec, spec, check)
    return {**decision_figures(tally.correct, n, at_n), "truncated_frac": tally.truncated / max(tally.samples, 1),
            "seconds": time.perf_counter() - t0}
