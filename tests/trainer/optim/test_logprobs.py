"""Sliced token log-probs and entropies against the whole-tensor formulas: same values and the
same gradient into the model's logits, whatever the slice length."""
import pytest
import torch

from trainer.optim.logprobs import chunk_positions, token_logp


def _reference(logits, pos, targets, T):
    z = logits if pos is None else logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
    lp = torch.log_softmax(z.float() / T, -1)
    ent = -(lp.exp() * lp).sum(-1)
    return lp.gather(-1, targets[..., None]).squeeze(-1), ent


@pytest.mark.parametrize("chunk", [1, 3, None])
@pytest.mark.parametrize("gathered", [False, True])
def test_token_logp_matches_log_softmax(chunk, gathered):
    g = torch.Generator().manual_seed(0)
    b, K, R, V, T = 3, 9, 7, 50, 0.7
    logits = (3 * torch.randn(b, K if gathered else R, V, generator=g)).requires_grad_()
    # Rows pick positions of their own (repeats included, as padded positions do).
    pos = torch.randint(0, K, (b, R), generator=g) if gathered else None
    targets = torch.randint(0, V, (b, R), generator=g)
    weights = torch.randn(b, R, generator=g)

    ref_lp, ref_ent = _reference(logits, pos, targets, T)
    (ref_lp * weights).sum().backward()
    ref_grad, logits.grad = logits.grad.clone(), None

    # The entropies come from the same slices as the log-probs, without a gradient of their own.
    lp, ent = token_logp([(logits, pos, None)], targets, T, chunk, with_entropy=True)
    assert not ent.requires_grad
    torch.testing.assert_close(ent, ref_ent.detach(), rtol=1e-5, atol=1e-5)
    (lp * weights).sum().backward()
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits.grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert ref_grad.abs().sum() > 0


def test_segments_concatenate_in_order():
    g = torch.Generator().manual_seed(1)
    first, rest = torch.randn(4, 1, 30, generator=g), torch.randn(4, 5, 30, generator=g)
    targets = torch.randint(0, 30, (4, 6), generator=g)
    whole, _ = _reference(torch.cat([first, rest], 1), None, targets, 1.0)
    torch.testing.assert_close(token_logp([(first, None, None), (rest, None, None)], targets, 1.0, 2), whole)


def test_chunk_positions_bounds_the_float32_slice():
    assert chunk_positions(8, 150_000, budget=64 * 2**20) * 8 * 150_000 * 4 <= 64 * 2**20
    assert chunk_positions(4096, 150_000, budget=1) == 1


@pytest.mark.parametrize("chunk", [2, None])
@pytest.mark.parametrize("gathered", [False, True])
def test_sliced_head_matches_projected_logits(chunk, gathered):
    """Hidden states + the head weight: the same log-probs, entropies and gradients (into the
    hidden states and into the head) as projecting everything first."""
    g = torch.Generator().manual_seed(2)
    b, K, R, H, V, T = 3, 8, 6, 16, 40, 1.3
    x = torch.randn(b, K if gathered else R, H, generator=g).requires_grad_()
    head = torch.randn(V, H, generator=g).requires_grad_()
    pos = torch.randint(0, K, (b, R), generator=g) if gathered else None
    targets = torch.randint(0, V, (b, R), generator=g)
    weights = torch.randn(b, R, generator=g)

    ref_lp, ref_ent = _reference(torch.nn.functional.linear(x, head), pos, targets, T)
    (ref_lp * weights).sum().backward()
    ref_gx, ref_gh = x.grad.clone(), head.grad.clone()
    x.grad = head.grad = None

    lp, ent = token_logp([(x, pos, head)], targets, T, chunk, with_entropy=True)
    torch.testing.assert_close(ent, ref_ent.detach(), rtol=1e-5, atol=1e-5)
    (lp * weights).sum().backward()
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, ref_gx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(head.grad, ref_gh, rtol=1e-4, atol=1e-5)
