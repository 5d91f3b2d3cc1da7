"""Rollout engines: vLLM (in-process, production) and plain transformers (no vLLM needed).

Both satisfy `RolloutEngine` (engines/base.py). `make_engine` builds one from the spec's
`rollout.engine`; the vLLM module is imported only when asked for, so machines without vLLM
can still use the HF engine.
"""
from __future__ import annotations

from pathlib import Path

import torch

from trainer.engines.base import RolloutEngine, WeightSyncError

__all__ = ["RolloutEngine", "WeightSyncError", "make_engine"]


def make_engine(kind: str, model_dir: Path, model: torch.nn.Module, tokenizer, *,
                dtype: str, seed: int, max_model_len: int, max_num_seqs: int,
                kv_cache_gib: float | None = None, lora_rank: int | None = None) -> RolloutEngine:
    """An engine of `kind` ("vllm" | "hf") holding the weights of `model` (saved in `model_dir`).

    `dtype` may be "auto" (resolved like the trainer's: bf16 on CUDA, float32 on CPU); it must
    be the trainer's dtype for the vLLM sync check to be meaningful. `max_num_seqs` is the
    step's concurrency (see `vllm_engine.size_max_num_seqs`); the HF engine ignores it and
    bounds memory by tokens per chunk instead. The vLLM engine is verified against `model`
    right away, so a folder that does not hold `model`'s weights fails here, not mid-run.
    `lora_rank` (a LoRA job: `model` is a PeftModel on the base in `model_dir`): vLLM serves
    the adapter through its own LoRA support (`trainer/engines/vllm_lora.py`); the HF engine
    runs the PeftModel itself.
    """
    from trainer.precision import DTYPES, resolve_dtype

    device = next(model.parameters()).device
    dtype = resolve_dtype(dtype, device)
    if kind == "auto":
        kind = default_engine(device)
    if kind == "hf":
        from trainer.engines.hf_engine import HFEngine

        # The HF engine runs the trainer's float32 master weights under the compute dtype's
        # autocast: the same bf16 numerics the trainer's forwards use.
        return HFEngine(model, tokenizer, seed=seed, compute_dtype=DTYPES[dtype])
    if kind == "vllm":
        from trainer.engines.vllm_engine import VLLMEngine, size_max_num_seqs

        if lora_rank is not None:
            from trainer.engines.vllm_lora import VLLMLoraEngine

            engine = VLLMLoraEngine(model_dir, rank=lora_rank, dtype=dtype, seed=seed,
                                    max_model_len=max_model_len, kv_cache_gib=kv_cache_gib,
                                    max_num_seqs=size_max_num_seqs(max_num_seqs))
            engine.sync_weights(model)  # the current adapter (a resumed one is not zero)
            return engine
        # Capped: vLLM queues the rest, and the KV cache is sized for max_num_seqs sequences.
        engine = VLLMEngine(model_dir, dtype=dtype, seed=seed, max_model_len=max_model_len,
                            max_num_seqs=size_max_num_seqs(max_num_seqs), kv_cache_gib=kv_cache_gib)
        engine.verify(model)
        return engine
    raise ValueError(f"unknown rollout engine {kind!r} (expected 'auto', 'vllm' or 'hf')")


def default_engine(device: torch.device) -> str:
    """`rollout.engine: auto`: vLLM on CUDA; the HF engine on a CPU.

    On a CPU the HF engine measured as fast as vLLM-CPU on builtin:tiny and 1.3-4x faster on a
    25 M-parameter model (bench/rollouts.py, docs/results.md section 2), starts instantly and needs no
    weight sync; on a GPU vLLM's paged attention and continuous batching are the point.
    """
    if device.type == "cuda":
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:
            return "vllm"
    return "hf"
