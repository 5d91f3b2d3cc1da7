"""Loading the policy the trainer optimises: a Hugging Face causal LM and its tokenizer.

`builtin:tiny` is resolved to a folder by `trainer.models.tiny.ensure_tiny_model` before this is
called; here every model is just an HF folder (or a hub id when the worker can reach a hub).
"""
from __future__ import annotations

from pathlib import Path

import torch

from trainer.precision import DTYPES, resolve_dtype

def resolve_device() -> torch.device:
    """cuda if a GPU is visible, else cpu."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout off everywhere, whatever train/eval mode says (as veRL and OpenRLHF do).

    RL log-probs must be the policy's, not a random sub-network's: old, reference and PPO
    forwards of one sample have to agree. Covers nn.Dropout modules (GPT-2, OPT) and the
    float `attention_dropout` / `dropout` attributes HF attention modules pass to SDPA.
    """
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for attr in ("attention_dropout", "dropout", "attn_dropout"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return model


def load_policy(path_or_dir: str | Path, dtype: str = "auto",
                device: torch.device | str | None = None, *, master_fp32: bool = True,
                gradient_checkpointing: bool = False):
    """(model, tokenizer) from an HF folder or hub id, on `device`, in train mode, dropout off.

    With `master_fp32` (training) the weights are float32 whatever `dtype` says: `dtype` is
    then the compute dtype (bf16 autocast), and AdamW updates float32 weights. Measured: 10
    AdamW steps at lr 1e-6 change ~2 % of bf16 weights (the step is below bf16's spacing)
    against ~100 % of float32 ones. `master_fp32=False` (evaluation) loads in `dtype`.
    The pad token is set to EOS when the tokenizer has none (batched scoring pads; the
    attention mask makes the choice of filler irrelevant).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device) if device is not None else resolve_device()
    name = "float32" if master_fp32 else resolve_dtype(dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path_or_dir), dtype=DTYPES[name])
    model.to(device)
    disable_dropout(model)
    if gradient_checkpointing:
        # Recompute each layer's activations in the backward: ~sqrt memory for ~30 % more compute.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.train()
    return model, tokenizer
