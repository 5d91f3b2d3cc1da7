"""The dtypes a run computes in, and the autocast its forwards run under.

One home for what the model loader, the optimizer's forwards and the HF engine share: the
engine samples under the same autocast as the trainer's forwards (the same bf16 numerics),
and none of them needs to import the others for it.
"""
from __future__ import annotations

import contextlib

import torch

# Every dtype name a spec or an engine may use, and its torch dtype.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device | str) -> str:
    """The spec's dtype as a concrete name: `auto` = bfloat16 on CUDA, float32 on CPU.

    float32 on CPU because bf16 matmuls there are slow on most CPUs and the engine/trainer
    log-prob agreement (the weight-sync check) is much tighter in float32.
    """
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def compute_dtype(dtype: str, device: torch.device | str) -> torch.dtype:
    """The torch dtype forwards run in (under autocast when it is not float32)."""
    return DTYPES[resolve_dtype(dtype, device)]


def autocast(device: torch.device, compute_dtype: torch.dtype):
    """bf16 autocast around a forward when the compute dtype is not float32 (CPU too)."""
    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=compute_dtype)
