"""What a job spec will cost, computed without a database: samples and tokens per stage and for
the evaluations, the model's memory on a worker, and wall time from a throughput.

api/estimates.py feeds it the deployment's measurements (store/estimates.py) and the model's
shape; everything here is arithmetic, so tests check it against hand-computed figures.

Token figures count response tokens at their upper bound, `rollout.max_new_tokens` per sample:
prompt lengths are not known before the task is built, and most responses stop earlier. Wall
time uses the same unit ("budget tokens": samples x max_new_tokens), so the bound cancels out
between the measurement and the estimate.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.spec import TINY_MODEL, JobSpec

GIB = 2**30
# Mirrors trainer/optim/update.py (which imports torch, too heavy for the API): the activation
# budget of `micro_batch_tokens: auto` and its upper bound.
ACTIVATION_BUDGET_BYTES = 4 * GIB
MAX_AUTO_TOKENS = 65_536
# builtin:tiny's shape (trainer/models/tiny.py SIZES["tiny"], 100-token character vocabulary,
# tied embeddings): about 0.6 M parameters.
TINY_SHAPE = dict(model_type="qwen2", vocab_size=100, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
# Defaults when the deployment has measured nothing for a model yet: rough figures, said so
# in the answer. Small models run on CPU workers (bench/step.py measured builtin:tiny at ~75
# samples/s of 24 tokens on 2 cores); larger ones on a GPU, where a step's cost grows with
# the parameters: ~1.2e13 / params budget tokens per second (a 1.5 B model: ~8,000/s on one
# H100 class card, generation and update together), generation alone about 3x that.
SMALL_MODEL_PARAMS = 50_000_000
DEFAULT_SMALL = (1 / 1_800, 1 / 10_000, 20.0)   # s per budget token: step, generation; startup s
GPU_STEP_TOKENS_X_PARAMS = 1.2e13
GPU_STARTUP_S_PER_B_PARAMS = 20.0
GPU_STARTUP_S = 60.0


# --------------------------------------------------------------------------- the model's shape

@dataclass(frozen=True)
class ModelShape:
    params: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    kv_dim: int
    source: str  # where the figures come from: builtin, config.json, or the name


def shape_from_config(cfg: dict[str, Any], source: str) -> ModelShape | None:
    """Parameters of a decoder-only transformer (Llama/Qwen shapes) from its HF config."""
    cfg = cfg.get("text_config") or cfg
    try:
        h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    inter = int(cfg.get("intermediate_size") or 4 * h)
    heads = int(cfg.get("num_attention_heads") or 1)
    head_dim = int(cfg.get("head_dim") or h // heads)
    kv_dim = int(cfg.get("num_key_value_heads") or heads) * head_dim
    per_layer = 2 * h * heads * head_dim + 2 * h * kv_dim + 3 * h * inter + 2 * h
    if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":  # q, k and v biases
        per_layer += heads * head_dim + 2 * kv_dim
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return ModelShape(embeddings + layers * per_layer + h, h, inter, layers, vocab, kv_dim, source)


_SIZE_IN_NAME = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])")


def shape_from_name(path: str) -> ModelShape | None:
    """A size written in the name (Qwen2.5-1.5B, SmolLM-135M), shaped like a Qwen2 model of
    that size (hidden = sqrt(params / 288), 24 layers, 150k vocabulary): a rough stand-in."""
    found = _SIZE_IN_NAME.findall(path.rsplit("/", 1)[-1])
    if not found:
        return None
    value, unit = found[-1]
    params = int(float(value) * (1e9 if unit in "bB" else 1e6))
    if params <= 0:
        return None
    hidden = max(64, int(math.sqrt(params / 288)))
    return ModelShape(params, hidden, 4 * hidden, 24, 151_936, hidden // 4, "the size in its name")


def read_model_shape(path: str) -> ModelShape | None:
    """builtin:tiny's known shape; a folder's config.json; else a size in the name; else None."""
    if path == TINY_MODEL:
        return shape_from_config(TINY_SHAPE, "builtin")
    config = Path(path).expanduser() / "config.json"
    if path.startswith(("/", "~")) and config.is_file():
        try:
            shape = shape_from_config(json.loads(config.read_text()), "config.json")
        except (OSError, ValueError):
            shape = None
        if shape is not None:
            return shape
    return shape_from_name(path)


# --------------------------------------------------------------------------- samples and tokens

def evaluation_count(total_steps: int, every: int) -> int:
    """Evaluations a run makes: before the first update, every `every` steps, and at the end
    (trainer/loop.py)."""
    if every <= 0:
        return 2
    return 1 + total_steps // every + (1 if total_steps % every else 0)


def work(spec: JobSpec, eval_prompts: int) -> dict[str, Any]:
    """Samples and response tokens (at most) per stage, for the evaluations and in all."""
    budget = spec.rollout.max_new_tokens
    stages = []
    for i, st in enumerate(spec.rollout.schedule):
        samples = st.steps * st.prompts_per_step * st.n
        stages.append({"stage": i, "n": st.n, "prompts_per_step": st.prompts_per_step,
                       "steps": st.steps, "samples": samples, "response_tokens_max": samples * budget})
    evals = evaluation_count(spec.total_steps, spec.eval.every)
    eval_samples = evals * eval_prompts * spec.eval.samples_per_prompt
    train_samples = sum(s["samples"] for s in stages)
    return {
        "steps": spec.total_steps, "stages": stages,
        "evaluation": {"count": evals, "prompts": eval_prompts,
                       "samples_per_prompt": spec.eval.samples_per_prompt,
                       "samples": eval_samples, "response_tokens_max": eval_samples * budget},
        "samples": train_samples + eval_samples,
        "response_tokens_max": (train_samples + eval_samples) * budget,
    }


# --------------------------------------------------------------------------- memory

def _compute_bytes(spec: JobSpec) -> int:
    # auto is bf16 on a CUDA worker, the deployments that train models big enough to matter.
    return 4 if spec.model.dtype == "float32" else 2


def _lora_params(spec: JobSpec, shape: ModelShape) -> int:
    lora = spec.model.lora
    assert lora is not None
    h, i, kv = shape.hidden, shape.intermediate, shape.kv_dim
    dims = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    names = dims if lora.target_modules == "all-linear" else \
        [m.rsplit(".", 1)[-1] for m in lora.target_modules]
    # A name outside the Llama/Qwen set counts as a hidden x hidden projection.
    return shape.layers * sum(lora.rank * sum(dims.get(m, (h, h))) for m in names)


def activation_bytes(spec: JobSpec, shape: ModelShape) -> tuple[int, int]:
    """(tokens per micro-batch, their activation bytes), by trainer/optim/update.py's rule:
    logits vocab x 12 bytes, each layer (16 hidden + 3 intermediate) elements per token."""
    per_token = shape.vocab * 12 + shape.layers * (16 * shape.hidden + 3 * shape.intermediate) * _compute_bytes(spec)
    if spec.model.gradient_checkpointing:  # one layer's activations at a time
        per_token = shape.vocab * 12 + (16 * shape.hidden + 3 * shape.intermediate) * _compute_bytes(spec)
    tokens = spec.algo.micro_batch_tokens
    if tokens == "auto":
        tokens = max(min(ACTIVATION_BUDGET_BYTES // per_token, MAX_AUTO_TOKENS), spec.rollout.max_new_tokens)
    return int(tokens), int(tokens) * per_token


def memory(spec: JobSpec, shape: ModelShape, worker_gb: float | None) -> dict[str, Any]:
    """The trainer's memory per rank, from a simple model (docs/api.md, "Estimates"):
    weights in the compute dtype; full fine-tuning adds float32 master weights (bf16 only),
    float32 gradients, AdamW's two states (float32, 1 byte each with 8bit, none on the device
    with cpu_offload) and a reference copy when kl_coef > 0; LoRA adds only the adapter's
    float32 weights, gradients and states. Activations: one micro-batch. FSDP over several
    ranks divides the full fine-tuning state by their number. The rollout engine's KV cache
    is not counted."""
    elem = _compute_bytes(spec)
    ranks = spec.resources.world_size
    parts: dict[str, int] = {"weights": shape.params * elem}
    if spec.model.lora is not None:
        adapter = _lora_params(spec, shape)
        parts["adapter_and_optimizer"] = adapter * 16
    else:
        state = {"fp32": 8, "8bit": 2, "cpu_offload": 0}[spec.optim.optimizer_state]
        master = 4 if elem == 2 and spec.optim.optimizer_state != "cpu_offload" else 0
        parts["gradients_and_optimizer"] = shape.params * (4 + state + master)
        if spec.algo.kl_coef > 0:
            parts["reference_model"] = shape.params * elem
        if ranks > 1:
            parts = {k: v // ranks for k, v in parts.items()}
    tokens, parts["activations"] = activation_bytes(spec, shape)
    total = sum(parts.values())
    fits = None if not worker_gb else total <= worker_gb * GIB
    return {"params": shape.params, "params_from": shape.source, "micro_batch_tokens": tokens,
            "bytes": parts, "total_gb": round(total / GIB, 3), "worker_gb": worker_gb or None,
            "fits": fits}


# --------------------------------------------------------------------------- time

@dataclass(frozen=True)
class Throughput:
    """Seconds per budget token (a scheduled sample x max_new_tokens) of a whole step and of
    generation alone, and seconds before the first step; `jobs` = 0 for the defaults."""

    step_s_per_token: float
    gen_s_per_token: float
    startup_s: float
    jobs: int = 0


def default_throughput(params: int | None) -> Throughput:
    if params is None or params <= SMALL_MODEL_PARAMS:
        return Throughput(*DEFAULT_SMALL)
    step = params / GPU_STEP_TOKENS_X_PARAMS
    return Throughput(step, step / 3, GPU_STARTUP_S + GPU_STARTUP_S_PER_B_PARAMS * params / 1e9)


def wall_seconds(figures: dict[str, Any], budget: int, rate: Throughput) -> dict[str, float]:
    """Start-up + steps (scheduled samples x budget x step rate) + evaluations (generation)."""
    train_samples = sum(s["samples"] for s in figures["stages"])
    parts = {"startup": rate.startup_s,
             "steps": train_samples * budget * rate.step_s_per_token,
             "evaluation": figures["evaluation"]["samples"] * budget * rate.gen_s_per_token}
    return {k: round(v, 1) for k, v in parts.items()} | {"total": round(sum(parts.values()), 1)}


@dataclass(frozen=True)
class PastJob:
    """A finished job's measured figures (store/estimates.py): its budget tokens and step
    seconds over its step rows, generated tokens and generation seconds, its wall time."""

    model: str
    budget_tokens: float
    step_s: float
    gen_tokens: float
    gen_s: float
    eval_tokens: float
    wall_s: float


def measured_throughput(jobs: list[PastJob]) -> Throughput | None:
    """Pooled rates over `jobs` (one model's); start-up is the median of what each job's wall
    time leaves after its steps and evaluations."""
    usable = [j for j in jobs if j.budget_tokens > 0 and j.step_s > 0]
    if not usable:
        return None
    step = sum(j.step_s for j in usable) / sum(j.budget_tokens for j in usable)
    gen_tokens = sum(j.gen_tokens for j in usable)
    gen = sum(j.gen_s for j in usable) / gen_tokens if gen_tokens else step / 3
    startup = median([max(0.0, j.wall_s - j.step_s - j.eval_tokens * gen) for j in usable])
    return Throughput(step, gen, startup, len(usable))


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def past_accuracy(jobs: list[PastJob], defaults: dict[str, Throughput]) -> dict[str, Any]:
    """How far off the estimate was on past jobs: each job's wall time against the estimate
    from the other jobs of its model (leave one out; the default without any)."""
    ratios = []
    for j in jobs:
        if j.wall_s <= 0 or j.budget_tokens <= 0:
            continue
        others = [o for o in jobs if o is not j and o.model == j.model]
        rate = measured_throughput(others) or defaults[j.model]
        guess = rate.startup_s + j.budget_tokens * rate.step_s_per_token + j.eval_tokens * rate.gen_s_per_token
        if guess > 0:
            ratios.append(j.wall_s / guess)
    if not ratios:
        return {"jobs": 0, "median_actual_over_estimate": None,
                "note": "no finished jobs to compare with yet"}
    return {"jobs": len(ratios), "median_actual_over_estimate": round(median(ratios), 3),
            "min": round(min(ratios), 3), "max": round(max(ratios), 3)}
