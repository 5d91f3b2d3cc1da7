"""The optimizer the spec asks for (`optim.optimizer_state`): AdamW in float32, 8-bit or offloaded."""
from __future__ import annotations

import torch

from trainer.spec import OptimSpec


def make_optimizer(params, optim_spec: OptimSpec, lr: float,
                   device_dtype: torch.dtype | None = None) -> torch.optim.Optimizer:
    """AdamW over the float32 master weights; `8bit` keeps its moments in 8 bits (bitsandbytes);
    `cpu_offload` keeps masters and moments on the CPU and casts the device weights to
    `device_dtype` (the compute dtype), as ZeRO-Offload does (`trainer/optim/offload.py`)."""
    if optim_spec.optimizer_state == "cpu_offload":
        from trainer.optim.offload import CPUOffloadAdamW

        return CPUOffloadAdamW(params, device_dtype=device_dtype, lr=lr, betas=optim_spec.betas,
                               weight_decay=optim_spec.weight_decay)
    if optim_spec.optimizer_state == "8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr, betas=optim_spec.betas, weight_decay=optim_spec.weight_decay)
    return torch.optim.AdamW(params, lr=lr, betas=optim_spec.betas, weight_decay=optim_spec.weight_decay)
