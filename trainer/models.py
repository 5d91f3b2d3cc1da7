"""Loading the policy the trainer optimises: a Hugging Face causal LM and its tokenizer.

`builtin:tiny` is resolved to a folder by `trainer.tiny_model.ensure_tiny_model` before this is
called; here every model is just an HF folder (or a hub id when the worker can reach a hub).
"""
from __future__ import annotations

from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device() -> torch.device:
    """cuda if a GPU is visible, else cpu."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str, device: torch.device | str) -> str:
    """The spec's dtype as a concrete name: `auto` = bfloat16 on CUDA, float32 on CPU.

    float32 on CPU because bf16 matmuls there are slow on most CPUs and the engine/trainer
    log-prob agreement (the weight-sync check) is much tighter in float32.
    """
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def load_policy(path_or_dir: str | Path, dtype: str = "auto",
                device: torch.device | str | None = None):
    """(model, tokenizer) from an HF folder or hub id, on `device`, in train mode.

    The pad token is set to EOS when the tokenizer has none (batched scoring pads; the
    attention mask makes the choice of filler irrelevant).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device) if device is not None else resolve_device()
    name = resolve_dtype(dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path_or_dir), dtype=_DTYPES[name])
    model.to(device)
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.train()
    return model, tokenizer
