"""AdamW with its state offloaded to the CPU (`optim.optimizer_state: cpu_offload`).

ZeRO-Offload's split, as DeepSpeed users know it: the device holds the weights in the compute
dtype (bf16 on a GPU: 2 bytes/param) and their gradients; the CPU holds the float32 master
weights and both Adam moments (12 bytes/param). Each step copies the gradients down (as
float32), runs AdamW on the CPU, and copies the updated masters back up, cast to the device
weights' dtype. A 1e-6 step is therefore taken on float32 masters, never lost to bf16 spacing.

Gradients are summed over a mini-batch's micro-batches in float32: bf16 device weights get
bf16 `.grad`s, and adding 128 of them in bf16 is off by ~1.4 % (2.6 % at 512) against the
float32 sum. So each parameter's hook (run after every backward) adds the micro-batch's
gradient into a float32 buffer on the device and frees the bf16 `.grad`, as Megatron's
`main_grad` does: the device holds 4 bytes/param of gradient instead of 2 (no extra transfer;
the sum goes down once per step). The update clips these sums (`grad_params`), not `.grad`.

It is a `torch.optim.AdamW` over the masters, so `param_groups` (the lr the loop sets each
step), `zero_grad` and the checkpoint's `state_dict` work as for the plain optimizer; the
state dict carries the masters too, so a resumed run continues from the float32 values rather
than from the (bf16) weights of the saved model folder.
"""
from __future__ import annotations

from functools import partial
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
        self._sums: list[torch.Tensor | None] = [None] * len(self.device_params)
        for i, p in enumerate(self.device_params):
            p.register_post_accumulate_grad_hook(partial(self._accumulate, i))

    @torch.no_grad()
    def _accumulate(self, i: int, p: torch.nn.Parameter) -> None:
        """After a backward: add p's micro-batch gradient to its float32 sum; free p.grad."""
        if self._sums[i] is None:
            self._sums[i] = p.grad.float()  # float32 .grad (no device_dtype): taken as is
        else:
            self._sums[i].add_(p.grad)
        p.grad = None

    def _grads_down(self) -> None:
        """The float32 sums become the masters' gradients (on the CPU), once per step."""
        for i, (m, g) in enumerate(zip(self.masters, self._sums)):
            if g is not None:
                m.grad = g.to("cpu", torch.float32)
                self._sums[i] = None

    def grad_params(self) -> list[torch.Tensor]:
        """The tensors whose `.grad` hold this step's gradient (float32 masters): what the
        update measures and clips before `step`."""
        self._grads_down()
        return [m for m in self.masters if m.grad is not None]

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("CPUOffloadAdamW.step takes no closure")
        self._grads_down()
        super().step()
        self._copy_masters_up()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self._sums = [None] * len(self.device_params)
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
