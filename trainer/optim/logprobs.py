"""Token log-probs and entropies from the model's logits, a slice of the sequence at a time.

Why: at a real vocabulary the logits dominate a long response's memory. A [b, R, V] float32
tensor is 8.4 GB for an 8 k-token answer at a 256 k vocabulary, and the straightforward
`logits.gather(...).float() / T` then `logsumexp` makes three or four such copies, plus two
more for the entropy statistic and one per step of the backward. Here the model's own logits
are the only full-size tensor in the forward (and their gradient the only one in the
backward): the position gather, the float32 cast, the temperature division, the
log-sum-exp and the softmax of the backward run on slices of `chunk` positions whose float32
size stays under `LOGIT_CHUNK_BYTES`.

`token_logp` is an autograd Function whose backward recomputes each slice's softmax from the
saved logits and its log-sum-exp (a [b, R] tensor) instead of keeping the slices alive, and
writes the slice's gradient straight into the logits' gradient. Same values and gradients as
`log_softmax(logits[pos] / T)[target]` up to float rounding (tests/trainer/optim/test_logprobs.py).

Logits come as segments `(x [b, K, D], pos [b, r] | None, head)`: `pos` picks, for each
sample, the r positions of its dim 1 that predict its response tokens (None: all K, in
order). The shared-prompt update has two segments (the prompt's last position, then the
response pass), so the response logits are never concatenated into one tensor.

`head` None: `x` are the model's logits. `head` a weight [V, H] (the LM head, no bias): `x`
are the last hidden states, and each slice's logits are projected here, so no tensor of all
the response's logits exists at all (a 150 k vocabulary costs a slice, not [b, R, V]); the
backward recomputes the slice's projection and returns the hidden states' and the head's
gradients (`hidden_states_out` in trainer/optim/model_io.py makes the model return hidden
states). The projection runs under the caller's autocast in the forward and in float32 in
the backward.

The update takes this path only for GSPO (or with `UpdateConfig.fused_head` off); the other
objectives compute the same gradients inside the forward (trainer/optim/fused_head.py).
"""
from __future__ import annotations

import torch

from trainer.algo.losses import entropy_from_logits

# Float32 bytes of one slice of logits; a few such temporaries are alive at once. 256 MiB is
# ~440 positions at a 152k vocabulary: the head's matmuls run at ~75 % of the CPU's rate there
# against ~60 % at 64 MiB's ~110 (the v150k update: 104.7 s against 122.6 s, the step's peak
# RSS +208 MiB, docs/results.md 11c); on a GPU it is a rounding error of its memory.
LOGIT_CHUNK_BYTES = 256 * 2**20

Segment = tuple  # (x, pos | None, head weight | None); see the module docstring


def _vocab(x: torch.Tensor, head: torch.Tensor | None) -> int:
    return x.shape[-1] if head is None else head.shape[0]


def chunk_positions(rows: int, vocab: int, budget: int = LOGIT_CHUNK_BYTES) -> int:
    """Positions per slice so that a [rows, chunk, vocab] float32 slice fits `budget` bytes."""
    return max(1, budget // max(4 * rows * vocab, 1))


def _rows(x: torch.Tensor, pos: torch.Tensor | None, s: int, e: int) -> torch.Tensor:
    """[b, e - s, D]: the rows of `x` for response positions s .. e-1."""
    if pos is None:
        return x[:, s:e]
    return x.gather(1, pos[:, s:e, None].expand(-1, -1, x.shape[-1]))


def _slice(x: torch.Tensor, head: torch.Tensor | None, pos: torch.Tensor | None, s: int, e: int,
           temperature: float, fp32_head: bool = False) -> torch.Tensor:
    """[b, e - s, V] float32 logits / T of response positions s .. e-1 (a fresh tensor).
    `fp32_head`: the projection in float32 whatever the ambient autocast."""
    z = _rows(x, pos, s, e)
    if head is not None:
        if fp32_head:
            with torch.autocast(device_type=z.device.type, enabled=False):
                z = torch.nn.functional.linear(z.float(), head.float())
        else:
            z = torch.nn.functional.linear(z, head)
    return z.float() / temperature


def _put(grad: torch.Tensor, pos: torch.Tensor | None, s: int, e: int, g: torch.Tensor) -> None:
    """Adds the gradient `g` of rows s .. e-1 into `grad` (the inverse of `_rows`)."""
    if pos is None:
        grad[:, s:e] += g
    else:
        grad.scatter_add_(1, pos[:, s:e, None].expand(-1, -1, g.shape[-1]), g.to(grad.dtype))


class _TokenLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, head, pos, targets, temperature: float, chunk: int, with_entropy: bool,
                fp32_head: bool = False):
        b, R = targets.shape
        out = torch.empty(b, R, dtype=torch.float32, device=x.device)
        lse = torch.empty_like(out)
        # The entropy statistic from the same slices: at a large vocabulary a second pass
        # would cost one more projection of every position to the vocabulary.
        ent = torch.empty_like(out) if with_entropy else out.new_empty(0)
        for s in range(0, R, chunk):
            e = min(s + chunk, R)
            z = _slice(x, head, pos, s, e, temperature, fp32_head)
            lse[:, s:e] = torch.logsumexp(z, -1)
            out[:, s:e] = z.gather(-1, targets[:, s:e, None]).squeeze(-1) - lse[:, s:e]
            if with_entropy:
                ent[:, s:e] = entropy_from_logits(z, lse[:, s:e])
        ctx.save_for_backward(x, head, pos, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad_out, _grad_ent):
        x, head, pos, targets, lse = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk
        grad_x = torch.zeros_like(x)
        grad_head = None if head is None or not ctx.needs_input_grad[1] else torch.zeros_like(head)
        R = targets.shape[1]
        for s in range(0, R, chunk):
            e = min(s + chunk, R)
            g = grad_out[:, s:e, None].float()
            rows = None if head is None else _rows(x, pos, s, e).float()
            z = (_rows(x, pos, s, e) if head is None else torch.nn.functional.linear(rows, head.float()))
            # d logp[target] / dz = onehot(target) - softmax(z), z = logits / T.
            dz = (z.float() / T).sub_(lse[:, s:e, None]).exp_().mul_(-g)
            dz.scatter_add_(-1, targets[:, s:e, None], g).div_(T)
            if head is None:
                _put(grad_x, pos, s, e, dz)
                continue
            _put(grad_x, pos, s, e, dz @ head.float())
            if grad_head is not None:
                grad_head += (dz.flatten(0, 1).T @ rows.flatten(0, 1)).to(grad_head.dtype)
        return grad_x, grad_head, None, None, None, None, None, None


def token_logp(segments: list[Segment], targets: torch.Tensor, temperature: float,
               chunk: int | None = None, with_entropy: bool = False, fp32_head: bool = False):
    """[b, R] float32 log softmax(logits / T)[target] over the segments, in order; with
    `with_entropy`, (log-probs, [b, R] entropies without gradient) from the same slices.
    `fp32_head`: a sliced head (segments holding hidden states) projects in float32 under a
    bf16 autocast too (the log-softmax is float32 always, the backward's projection too);
    segments of the model's own logits come from `fp32_output_head`."""
    parts, ents, s = [], [], 0
    for x, pos, head in segments:
        r = x.shape[1] if pos is None else pos.shape[1]
        c = chunk or chunk_positions(x.shape[0], _vocab(x, head))
        lp, ent = _TokenLogp.apply(x, head, pos, targets[:, s:s + r], temperature, c, with_entropy, fp32_head)
        parts.append(lp)
        ents.append(ent)
        s += r
    logp = torch.cat(parts, 1) if len(parts) != 1 else parts[0]
    if not with_entropy:
        return logp
    return logp, (torch.cat(ents, 1) if len(ents) != 1 else ents[0])
