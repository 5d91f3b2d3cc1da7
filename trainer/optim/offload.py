"""AdamW with its state offloaded to the CPU (`optim.optimizer_state: cpu_offload`).

ZeRO-Offload's split, as DeepSpeed users know it: the device holds the weights in the compute
dtype (bf16 on a GPU: 2 bytes/param) and their gradients; the CPU holds the float32 master
weights and both Adam moments (12 bytes/param). Each step copies the gradients down (as
float32), runs AdamW on the CPU, and copies the updated masters back up, cast to the device
weights' dtype. A 1e-6 step is therefore taken on float32 masters, never lost to bf16 spacing.

It is a `torch.optim.AdamW` over the masters, so `param_groups` (the lr the loop sets each
step), `zero_grad` and the checkpoint's `state_dict` work as for the plain optimizer; the
state dict carries the masters too, so a resumed run continues from the float32 values rather
than from the (bf16) weights of the saved model folder.
"""
from __future__ import annotations

from typing import Iterable

import torch

MASTERS_KEY = "cpu_offload_masters"


class CPUOffloadAdamW(torch.optim.AdamW):
    def __init__(self, params: Iterable[torch.nn.Parameter], *, device_dtype: torch.dtype | None = None,
                 **adamw_kwargs):
        self.device_params = [p for p in params if p.requires_grad]
        if not self.device_params:
            raise ValueError("CPUOffloadAdamW: no trainable parameters")
        # Pinned host memory makes the per-step copies asynchronous DMA on a GPU.
        pin = torch.cuda.is_available() and any(p.is_cuda for p in self.device_params)
        masters = []
        for p in self.device_params:
            m = torch.empty(p.shape, dtype=torch.float32, device="cpu", pin_memory=pin)
            m.copy_(p.detach())
            masters.append(m)
        # 'foreach' multi-tensor kernels on the CPU: one pass over all masters per step.
        super().__init__(masters, foreach=True, **adamw_kwargs)
        self.masters = masters
        if device_dtype is not None:  # the device keeps only the compute-dtype copy
            for p in self.device_params:
                p.data = p.data.to(device_dtype)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("CPUOffloadAdamW.step takes no closure")
        for p, m in zip(self.device_params, self.masters):
            m.grad = None if p.grad is None else p.grad.detach().to("cpu", torch.float32)
        super().step()
        self._copy_masters_up()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p in self.device_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict:
        out = super().state_dict()
        out[MASTERS_KEY] = [m.clone() for m in self.masters]
        return out

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop(MASTERS_KEY, None)
        if masters is None:
            raise ValueError("optimizer state has no float32 masters: it was not saved with "
                             "optim.optimizer_state cpu_offload")
        if len(masters) != len(self.masters) or any(a.shape != b.shape for a, b in zip(masters, self.masters)):
            raise ValueError("optimizer state's masters do not match this model's parameters")
        super().load_state_dict(state_dict)
        for m, saved in zip(self.masters, masters):
            m.copy_(saved)
        self._copy_masters_up()

    def _copy_masters_up(self) -> None:
        for p, m in zip(self.device_params, self.masters):
            p.data.copy_(m, non_blocking=True)
