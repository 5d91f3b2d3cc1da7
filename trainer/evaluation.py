"""An evaluation: several models of one job on the same held-out prompts, side by side.

Each model (the base the job started from, then each checkpoint) is loaded in turn with
`trainer.evaluate.opened` (the engine, prompt rendering and scorer of training's own
evaluation) and sampled through the rollout seam (`trainer.probe.rollout_chunk`: single
completions, or episodes against the job's environment when its task has a `task.env`), in
chunks of at most `chunk_samples` samples (`trainer.probe.chunk_plan`), with the same seed for
every model, so the models see the same prompts and the same random draws. A cancel is looked
at before each chunk; `on_progress` hears after each one. The per-prompt correct counts become
pass@k with intervals, deltas against the base and the prompts gained or lost
(`trainer.algo.eval_compare`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trainer.algo.eval_compare import (INTERVAL, best_of, delta_intervals, pass_at_k_intervals,
                                       prompt_changes)
from trainer.evaluate import EvalContext, opened
from trainer.evaluation_spec import EvaluationSpec
from trainer.probe import Tally, chunk_plan, rollout_chunk
from trainer.probe_spec import PROBE_MAX_PROMPTS
from trainer.prompt_stream import mix_seed
from trainer.rollouts import SamplingConfig
from trainer.spec import JobSpec
from trainer.stop import stop_check

Progress = Callable[[dict], None]
PROMPT_PREVIEW = 300  # characters of each prompt kept in the result, for the per-prompt table


@dataclass(frozen=True)
class Model:
    """One model to evaluate: its label, its step (None: the base), its folder (None: the job's
    own model, builtin:tiny warm-started as the job was)."""

    label: str
    step: int | None
    folder: Path | None


def _sample(ctx: EvalContext, spec: EvaluationSpec, job: JobSpec, check: Callable[[], None],
            done: int, total: int, label: str, on_progress: Progress | None) -> Tally:
    prompts = len(ctx.prompt_ids)
    tally = Tally(correct=[0] * prompts, reward_sum=[0.0] * prompts)
    for call, (idx, count) in enumerate(chunk_plan(prompts, spec.n, spec.chunk_samples)):
        check()
        sampling = SamplingConfig(n=count, max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                                  top_p=spec.top_p, seed=mix_seed(spec.seed, 7919, call))
        episodes = rollout_chunk(ctx, job, idx, sampling, check)
        tally.add([idx[g] for g in episodes.prompt_index], episodes)
        if on_progress:
            on_progress({"samples_done": done + tally.samples, "samples_total": total, "model": label})
    return tally


def _model_row(model: Model, tally: Tally, spec: EvaluationSpec, seconds: float) -> dict:
    samples = max(tally.samples, 1)
    row = {"label": model.label, "step": model.step, "correct": tally.correct,
           "pass_at_k": pass_at_k_intervals(tally.correct, spec.n, spec.ks(), seed=spec.seed),
           "mean_reward": sum(tally.reward_sum) / samples,
           "response_len_mean": tally.tokens / samples, "truncated_frac": tally.truncated / samples,
           "samples": tally.samples, "tokens": tally.tokens, "seconds": seconds}
    if (env := tally.env_figures()) is not None:  # a task.env's episodes
        row["env"] = env
    return row


def compare(rows: list[dict], spec: EvaluationSpec) -> None:
    """Add each checkpoint's delta and prompt changes against the base row (when there is one)."""
    base = next((r for r in rows if r["step"] is None), None)
    for row in rows:
        if base is None or row is base:
            row["delta"] = row["changes"] = None
            continue
        row["delta"] = delta_intervals(base["correct"], row["correct"], spec.n, spec.ks(), seed=spec.seed)
        row["changes"] = prompt_changes(base["correct"], row["correct"])


def task_label(job: JobSpec) -> dict[str, str]:
    """Where the prompts came from, in the result: {"dataset": id}, {"reasoning_gym": name} or
    {"env": type}."""
    task = job.task
    if task.dataset is not None:
        return {"dataset": task.dataset.id}
    if task.reasoning_gym is not None:
        return {"reasoning_gym": task.reasoning_gym.name}
    return {"env": task.env.type if task.env is not None else "none"}


def evaluate_models(spec: EvaluationSpec, job: JobSpec, models: list[Model], should_stop: Callable[[], bool],
                    *, dataset_path: Path | None = None, on_progress: Progress | None = None,
                    name: str | None = None) -> dict:
    """Sample each of `models` on the held-out prompts of `job` (the spec from
    `trainer.evaluation_spec.sampling_job_spec`); the whole result. Raises
    `trainer.stop.StopRequested` when `should_stop()` turns true. `name` (the evaluation's id
    and attempt) tags a task.env's sandboxes and sessions."""
    from trainer.threads import configure_threads

    if not spec.resolved:
        raise ValueError("an evaluation runs resolved (trainer.evaluation_spec.filled)")
    configure_threads()
    check = stop_check(should_stop)
    t0, rows, prompts_text = time.perf_counter(), [], []
    total = None
    # "The whole eval split" stops at PROBE_MAX_PROMPTS: a dataset's split can be far larger, and
    # the result keeps every prompt's counts and opening.
    prompts = spec.prompts or PROBE_MAX_PROMPTS
    for model in models:
        started = time.perf_counter()
        with opened(job, model.folder, dataset_path, prompts=prompts,
                    max_num_seqs=min(spec.chunk_samples, spec.n * prompts), stop_check=check,
                    env_name=name) as ctx:
            if total is None:
                total = len(ctx.prompt_ids) * spec.n * len(models)
                prompts_text = [e.question[:PROMPT_PREVIEW] for e in ctx.examples]
            done = sum(r["samples"] for r in rows)
            tally = _sample(ctx, spec, job, check, done, total, model.label, on_progress)
        rows.append(_model_row(model, tally, spec, time.perf_counter() - started))
    compare(rows, spec)
    best = best_of(rows)
    return {
        "job": spec.job, "task": task_label(job), "n": spec.n, "k": spec.ks(), "prompts": len(prompts_text), "interval": INTERVAL,
        "temperature": spec.temperature, "top_p": spec.top_p, "max_new_tokens": spec.max_new_tokens,
        "models": rows, "prompt_texts": prompts_text,
        "best": None if best is None else {"step": best["step"], "label": best["label"],
                                           "pass@1": best["pass_at_k"]["1"]["mean"],
                                           "rule": "highest pass@1 of the checkpoints evaluated; ties: earlier step"},
        "picked": [p.model_dump(mode="json") for p in spec.picked],
        "samples": sum(r["samples"] for r in rows), "tokens": sum(r["tokens"] for r in rows),
        "seconds": time.perf_counter() - t0,
    }
