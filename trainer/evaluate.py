"""Held-out evaluation: pass@1 (mean over samples), unbiased pass@k, mean response length.

Runs the eval split through the rollout seam (`trainer.rollouts.generate_and_score`, or
`run_episodes` against the job's environment when it has a `task.env`) and the run's engine
at the spec's eval temperature / top-p (the paper's: 0.6 / 0.95, pass@1 averaged over 16
samples).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from trainer.algo.passk import pass_at_k_mean
from trainer.rollouts import SamplingConfig, encode_prompts, generate_and_score, run_episodes
from trainer.spec import JobSpec
from trainer.stop import never


@dataclass
class EvalContext:
    """What sampling a fixed set of prompts needs: the engine, the tokenizer that decodes its
    samples, the scorer, and the prompts with their examples (`prompt_ids[i]` asks `examples[i]`)."""

    engine: object
    tokenizer: object
    scorer: object
    examples: list            # trainer.tasks.base.Example
    prompt_ids: list[list[int]]
    env: object | None = None         # the job's multi-turn Environment (task.env), else None
    max_context: int | None = None    # the engine's longest sequence (bounds an episode)


def evaluate(ctx: EvalContext, spec: JobSpec, seed: int) -> dict[str, float]:
    """Return {"eval/pass@1", "eval/pass@K"..., "eval/response_len_mean"}."""
    n = spec.eval.samples_per_prompt
    sampling = SamplingConfig(n=n, max_new_tokens=spec.rollout.max_new_tokens,
                              temperature=spec.eval.temperature, top_p=spec.eval.top_p, seed=seed)
    env = spec.task.env
    if env is not None and ctx.env is not None:
        from trainer.run import env_budget

        episodes = run_episodes(ctx.engine, ctx.tokenizer, ctx.env, ctx.scorer, ctx.examples, sampling,
                                max_turns=env.max_turns, max_total_tokens=env_budget(spec),
                                reward_mode=env.reward_mode, max_context=ctx.max_context)
    else:
        episodes = generate_and_score(ctx.engine, ctx.tokenizer, ctx.scorer, ctx.prompt_ids, ctx.examples, sampling)
    counts = episodes.correct_counts(len(ctx.examples))
    out = {f"eval/pass@{k}": pass_at_k_mean(counts, n, k) for k in sorted(set(spec.eval.k) | {1})}
    out["eval/response_len_mean"] = sum(episodes.lengths()) / max(len(episodes), 1)
    return out


@contextmanager
def opened(spec: JobSpec, model_dir=None, dataset_path=None, *, prompts: int | None = None,
           max_num_seqs: int | None = None, stop_check: Callable[[], None] = never,
           env_name: str | None = None) -> Iterator[EvalContext]:
    """An `EvalContext` over the spec's held-out split (its first `prompts` examples when
    given), with the model of `model_dir`, or the spec's own model when None (builtin:tiny is
    warm-started then); engine and scorer are closed on exit. `max_num_seqs`: the most samples
    one generate call will ask for (default: every eval prompt x eval.samples_per_prompt).
    `env_name`: what a task.env's sandboxes and sessions are tagged with (`job_environment`)."""
    from trainer.engines import make_engine
    from trainer.models.loading import load_policy, resolve_device
    from trainer.run import ENV_PROMPT_ROOM, env_budget, job_environment, job_task, model_dir_for
    from trainer.graders.scorer import make_scorer

    from trainer.checkpoints.format import MERGED_DIR, holds_an_adapter

    if model_dir is not None and holds_an_adapter(model_dir):  # a LoRA checkpoint: its merged/ folder, no peft
        model_dir = Path(model_dir) / MERGED_DIR
    task = job_task(spec, dataset_path)
    examples = task.eval[:prompts] if prompts is not None else task.eval
    with make_scorer(spec, task, stop_check) as scorer:
        model_dir = Path(model_dir) if model_dir is not None else model_dir_for(spec, task, scorer, stop_check)
        policy, tokenizer = load_policy(model_dir, spec.model.dtype, resolve_device(), master_fp32=False)
        prompt_ids = encode_prompts(tokenizer, examples, spec.task.prompt_template)
        max_len = max(len(p) for p in prompt_ids) + spec.rollout.max_new_tokens
        if spec.task.env is not None:  # an episode: its opening, then model and environment tokens
            max_len = max(len(p) for p in prompt_ids) + ENV_PROMPT_ROOM + env_budget(spec)
        engine = make_engine(spec.rollout.engine, model_dir, policy, tokenizer, dtype=spec.model.dtype,
                             seed=spec.seed, max_model_len=max_len,
                             max_num_seqs=max_num_seqs or len(prompt_ids) * spec.eval.samples_per_prompt)
        env = None
        try:
            env = job_environment(spec, name=env_name)
            yield EvalContext(engine, tokenizer, scorer, examples, prompt_ids, env=env, max_context=max_len)
        finally:
            try:
                if env is not None:
                    env.close()
            finally:
                engine.close()


def evaluate_checkpoint(spec: JobSpec, model_dir, dataset_path=None) -> dict[str, float]:
    """`brorl eval`: load a checkpoint folder and evaluate it on the spec's held-out split."""
    with opened(spec, model_dir, dataset_path) as ctx:
        return evaluate(ctx, spec, seed=spec.seed)
