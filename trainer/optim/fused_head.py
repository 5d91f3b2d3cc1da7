"""The loss's gradient with respect to the LM head and its inputs, computed in the log-prob
forward (`fused_loss`), in the style of Liger-Kernel's fused linear cross-entropy.

Why: `token_logp` (trainer/optim/logprobs.py) projects each slice of positions to the
vocabulary in the forward and again in the backward, then multiplies the slice's logit
gradient by the head (the hidden states' gradient) and by the slice's hidden states (the
head's gradient): four vocabulary-size matmuls per token, which dominate the update at a
150 k vocabulary (docs/results.md 11c). Where the loss's gradient with respect to a token's
log-prob depends on that token alone (`Objective.per_token`: ppo, cispo, dr_grpo, with or
without the KL term), that gradient is known as soon as the slice's log-probs are, so the
forward does it all on the slice it has just projected: log-sum-exp, log-prob, entropy,
g = d loss / d logp, the logits' gradient dz = g (onehot - softmax) / T, then dz @ W and
dz^T @ rows, accumulated. Three head matmuls instead of four (two with a frozen head, LoRA),
and no second pass over the saved hidden states; the backward only scales the stored
gradients by the loss's grad_output.

g comes from `torch.autograd.grad` of the caller's own `loss_of` (the objective's functions,
not a second copy of their formulas) on the [b, R] log-probs in the segments' layout with the
slice's entries as the leaf; the other entries hold whatever earlier slices wrote (zeros
before), which cannot change the slice's gradient because the loss is a sum of per-token
terms. That costs an elementwise pass over the micro-batch's [b, R] tokens per slice, nothing
next to a slice's [b, chunk, V] projection.

GSPO's ratio is a mean over the whole sequence, so its token gradients need every slice's
log-prob first: it keeps `token_logp` (chosen once, `UpdateConfig`).
"""
from __future__ import annotations

from typing import Callable

import torch

from trainer.algo.losses import entropy_from_logits
from trainer.optim.logprobs import Segment, _put, _rows, _slice, _vocab, chunk_positions

# [b, R] float32 log-probs in the segments' layout (concatenated along dim 1) -> the scalar loss
LossOf = Callable[[torch.Tensor], torch.Tensor]


def _slice_grad(loss_of: LossOf, logp: torch.Tensor, s: int, e: int) -> torch.Tensor:
    """d loss / d logp[:, s:e], with `logp`'s other entries held fixed (the loss is a sum of
    per-token terms, so they do not enter the slice's gradient)."""
    with torch.enable_grad():
        leaf = logp[:, s:e].detach().requires_grad_()
        full = torch.cat([logp[:, :s], leaf, logp[:, e:]], 1)
        return torch.autograd.grad(loss_of(full), leaf)[0]


def _segment_grads(x, head, pos, targets, temperature: float, chunk: int, fp32_head: bool,
                   logp_all: torch.Tensor, ent_all: torch.Tensor, offset: int, loss_of: LossOf,
                   want_x: bool, want_head: bool):
    """One segment's slices: writes its log-probs and entropies into `logp_all` / `ent_all`
    from column `offset` on; returns its inputs' gradients (None where not wanted)."""
    grad_x = torch.zeros_like(x) if want_x else None
    grad_head = torch.zeros_like(head) if want_head else None
    R = targets.shape[1]
    for s in range(0, R, chunk):
        e = min(s + chunk, R)
        z = _slice(x, head, pos, s, e, temperature, fp32_head)  # the slice's only projection
        lse = torch.logsumexp(z, -1)
        t = targets[:, s:e, None]
        logp_all[:, offset + s:offset + e] = z.gather(-1, t).squeeze(-1) - lse
        ent_all[:, offset + s:offset + e] = entropy_from_logits(z, lse)
        g = _slice_grad(loss_of, logp_all, offset + s, offset + e)[..., None]
        # d logp[target] / dz = onehot(target) - softmax(z), z = logits / T (in place on z).
        dz = z.sub_(lse[..., None]).exp_().mul_(-g)
        dz.scatter_add_(-1, t, g).div_(temperature)
        if head is None:
            if grad_x is not None:
                _put(grad_x, pos, s, e, dz)
            continue
        # float32, as the unfused backward (which runs outside any autocast)
        with torch.autocast(device_type=dz.device.type, enabled=False):
            if grad_x is not None:
                _put(grad_x, pos, s, e, dz @ head.float())
            if grad_head is not None:
                rows = _rows(x, pos, s, e).float()
                grad_head += (dz.flatten(0, 1).T @ rows.flatten(0, 1)).to(grad_head.dtype)
    return grad_x, grad_head


class _FusedLoss(torch.autograd.Function):
    """Inputs after the settings: each segment's (x, pos, head), flattened. Outputs: the loss
    (differentiable), the [b, R] log-probs and entropies (not)."""

    @staticmethod
    def forward(ctx, loss_of: LossOf, targets, temperature: float, fp32_head: bool, chunks: tuple, *flat):
        b, R = targets.shape
        logp = torch.zeros(b, R, dtype=torch.float32, device=targets.device)
        ent = torch.zeros_like(logp)
        grads, offset = [], 0
        for k, chunk in enumerate(chunks):
            x, pos, head = flat[3 * k:3 * k + 3]
            r = x.shape[1] if pos is None else pos.shape[1]
            want_x = ctx.needs_input_grad[5 + 3 * k]
            want_head = head is not None and ctx.needs_input_grad[5 + 3 * k + 2]
            gx, gh = _segment_grads(x, head, pos, targets[:, offset:offset + r], temperature, chunk, fp32_head,
                                    logp, ent, offset, loss_of, want_x, want_head)
            grads += [gx, None, gh]
            offset += r
        ctx.grads = grads
        ctx.mark_non_differentiable(logp, ent)
        return loss_of(logp).detach(), logp, ent

    @staticmethod
    def backward(ctx, grad_loss, _grad_logp, _grad_ent):
        scaled = [None if g is None else g * grad_loss.to(g.dtype) for g in ctx.grads]
        ctx.grads = None
        return (None, None, None, None, None, *scaled)


def fused_loss(segments: list[Segment], targets: torch.Tensor, temperature: float, loss_of: LossOf,
               chunk: int | None = None, fp32_head: bool = False):
    """(loss, [b, R] log-probs, [b, R] entropies) over the segments (as `token_logp`'s), the
    loss `loss_of(log-probs)` with its gradient into the segments' tensors computed in this
    forward. Exact only where `loss_of` is a sum of per-token terms (`Objective.per_token`)."""
    flat, chunks = [], []
    for x, pos, head in segments:
        flat += [x, pos, head]
        chunks.append(chunk or chunk_positions(x.shape[0], _vocab(x, head)))
    return _FusedLoss.apply(loss_of, targets, temperature, fp32_head, tuple(chunks), *flat)
