"""Held-out evaluation: pass@1 (mean over samples), unbiased pass@k, mean response length.

Runs the eval split through the same rollout engine at the spec's eval temperature / top-p
(the paper's: 0.6 / 0.95, pass@1 averaged over 16 samples).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.algo.passk import pass_at_k_mean
from trainer.rollouts import SamplingConfig
from trainer.spec import JobSpec


@dataclass
class EvalContext:
    engine: object
    tokenizer: object
    scorer: object
    examples: list            # trainer.tasks.base.Example
    prompt_ids: list[list[int]]


def evaluate(ctx: EvalContext, spec: JobSpec, seed: int) -> dict[str, float]:
    """Return {"eval/pass@1", "eval/pass@K"..., "eval/response_len_mean"}."""
    n = spec.eval.samples_per_prompt
    sampling = SamplingConfig(n=n, max_new_tokens=spec.rollout.max_new_tokens,
                              temperature=spec.eval.temperature, top_p=spec.eval.top_p, seed=seed)
    gen = ctx.engine.generate(ctx.prompt_ids, sampling)
    texts = ctx.tokenizer.batch_decode(gen.token_ids, skip_special_tokens=True)
    examples = [ctx.examples[i] for i in gen.prompt_index]
    result = ctx.scorer.score(texts, examples, [not f for f in gen.finished])
    counts = [0] * len(ctx.prompt_ids)
    for i, ok in zip(gen.prompt_index, result.correct):
        counts[i] += int(ok)
    out = {f"eval/pass@{k}": pass_at_k_mean(counts, n, k) for k in sorted(set(spec.eval.k) | {1})}
    out["eval/response_len_mean"] = sum(len(t) for t in gen.token_ids) / max(len(gen), 1)
    return out


def evaluate_checkpoint(spec: JobSpec, model_dir, dataset_path=None) -> dict[str, float]:
    """`brorl eval`: load a checkpoint folder and evaluate it on the spec's held-out split."""
    from trainer.run import _encode
    from trainer.engines import make_engine
    from trainer.models.loading import load_policy, resolve_device
    from trainer.tasks import build_task
    from trainer.tasks.prompts import render_prompt
    from trainer.tasks.scoring import Scorer

    from trainer.checkpoints.format import MERGED_DIR, is_lora

    if is_lora(model_dir):  # a LoRA checkpoint: its merged/ folder is the same model, no peft
        model_dir = Path(model_dir) / MERGED_DIR
    task = build_task(spec.task, spec.seed, dataset_path)
    policy, tokenizer = load_policy(model_dir, spec.model.dtype, resolve_device(), master_fp32=False)
    prompt_ids = _encode(tokenizer, [render_prompt(ex.question, spec.task.prompt_template, tokenizer)
                                     for ex in task.eval])
    max_len = max(len(p) for p in prompt_ids) + spec.rollout.max_new_tokens
    engine = make_engine(spec.rollout.engine, model_dir, policy, tokenizer, dtype=spec.model.dtype,
                         seed=spec.seed, max_model_len=max_len,
                         max_num_seqs=len(prompt_ids) * spec.eval.samples_per_prompt)
    with Scorer(task, reward=spec.task.reward, truncated_reward=spec.algo.truncated_reward) as scorer:
        try:
            return evaluate(EvalContext(engine, tokenizer, scorer, task.eval, prompt_ids), spec, seed=spec.seed)
        finally:
            engine.close()
