"""What the update needs to know of an HF causal LM: whether its head can be applied a slice at
a time and how to take its last hidden states instead of its logits (its autocast:
`trainer.precision`)."""
from __future__ import annotations

import contextlib

import torch

from trainer import collectives as distributed


# Model types whose causal-LM forward is exactly `lm_head(last hidden state)` (no logit
# soft-capping or scaling after the head), so the head can be applied slice by slice outside.
PLAIN_HEAD_MODELS = ("qwen2", "qwen3", "llama", "mistral")


def sliced_head(model) -> torch.Tensor | None:
    """The LM head's weight when the log-probs can project hidden states to the vocabulary a
    slice at a time (trainer/optim/logprobs.py); None: take the model's own logits."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if (getattr(model.config, "model_type", None) not in PLAIN_HEAD_MODELS or distributed.is_sharded(model)
            or type(head) is not torch.nn.Linear or head.bias is not None):
        return None
    return head.weight


@contextlib.contextmanager
def hidden_states_out(model, on: bool):
    """With `on`, the model's forward returns its last hidden states in place of the logits
    (the head is swapped for an identity and put back afterwards)."""
    if not on:
        yield
        return
    head = model.get_output_embeddings()
    model.set_output_embeddings(torch.nn.Identity())
    try:
        yield
    finally:
        model.set_output_embeddings(head)


class _Fp32Head(torch.nn.Module):
    """An output head that runs in float32 under any autocast (`fp32_output_head`)."""

    def __init__(self, head: torch.nn.Module):
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.head.bias is None else self.head.bias.float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            return torch.nn.functional.linear(x.float(), self.head.weight.float(), bias)


@contextlib.contextmanager
def fp32_output_head(model, on: bool):
    """With `on`, the model's own output head (a Linear) projects in float32 during the block,
    so its logits are float32 while the layers run in the autocast's bf16 (`model.fp32_lm_head`
    for models whose head is not applied a slice at a time, `sliced_head`)."""
    head = model.get_output_embeddings() if on and hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        yield
        return
    model.set_output_embeddings(_Fp32Head(head))
    try:
        yield
    finally:
        model.set_output_embeddings(head)
