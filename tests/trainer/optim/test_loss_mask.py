"""The loss mask through the update: an environment's tokens (mask 0) are context only.

A multi-turn sample's response is the model's turns with the environment's replies between
them. The update must put loss, importance ratios, KL and entropy on the model's tokens only,
and count only them. Checked on every forward (plain padded, shared prefix, packed, packed
shared prefix) against a batch that says the same thing without a mask: each model turn a
sample of its own, whose prompt is everything before it (the environment's tokens are then
prompt, which never carries loss). Same loss, statistics and gradient to float tolerance.
"""
import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.optim.update import UpdateConfig, _chunks, model_token_mask, ppo_update
from trainer.rollouts import Episodes, Rollouts, concat_rollouts

VOCAB = 64
PATHS = [(False, False), (True, False), (False, True), (True, True)]  # (shared, pack)
STATS = ("loss", "entropy", "kl", "is_ratio_mean", "is_truncated_frac", "pg_clipfrac_low",
         "pg_clipfrac_high", "mismatch_kl", "n_tokens")


def _model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return Qwen2ForCausalLM(cfg).float().train()


def _multiturn(seed=0, groups=((4, 7), (3, 11))):
    """Groups of (N, prompt length); each response: model turn, env reply, model turn, [env reply,
    model turn], maybe a trailing env reply. Returns the batch and, per sample, its segments
    [(ids, engine logps, ref logps, is_model)]."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(1, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    prompts, segs, group = [], [], []
    for gi, (n, plen) in enumerate(groups):
        prompt = rand(plen)
        for _ in range(n):
            turns = int(torch.randint(2, 4, (), generator=g))
            parts = []
            for t in range(turns):
                parts.append((rand(int(torch.randint(1, 9, (), generator=g))), True))
                if t < turns - 1 or bool(torch.rand((), generator=g) < 0.5):
                    parts.append((rand(int(torch.randint(1, 6, (), generator=g))), False))
            segs.append([(ids, (-3.0 + 0.3 * torch.randn(len(ids), generator=g)).tolist(),
                          (-3.2 + 0.3 * torch.randn(len(ids), generator=g)).tolist(), own) for ids, own in parts])
            prompts.append(prompt)
            group.append(gi)
    S = len(segs)
    batch = Rollouts(prompt_ids=prompts, response_ids=[[t for s in ss for t in s[0]] for ss in segs],
                     engine_logprobs=[[x for s in ss for x in s[1]] for ss in segs],
                     group=torch.tensor(group), rewards=torch.zeros(S), truncated=torch.zeros(S, dtype=torch.bool),
                     advantages=torch.randn(S, generator=g),
                     loss_mask=[[int(s[3]) for s in ss for _ in s[0]] for ss in segs])
    ref = [torch.tensor([x for s in ss for x in s[2]]) for ss in segs]
    return batch, segs, ref


def _split(batch: Rollouts, segs, ref):
    """The same samples without a mask: each model turn is a sample whose prompt is the prompt and
    every token before the turn (environment tokens included)."""
    prompts, responses, engine, refs, adv, group = [], [], [], [], [], []
    for i, ss in enumerate(segs):
        before = list(batch.prompt_ids[i])
        for ids, elp, rlp, own in ss:
            if own:
                prompts.append(list(before))
                responses.append(ids)
                engine.append(elp)
                refs.append(torch.tensor(rlp))
                adv.append(float(batch.advantages[i]))
                group.append(i)
            before += ids
    S = len(responses)
    return Rollouts(prompt_ids=prompts, response_ids=responses, engine_logprobs=engine, group=torch.tensor(group),
                    rewards=torch.zeros(S), truncated=torch.zeros(S, dtype=torch.bool),
                    advantages=torch.tensor(adv)), refs


def _step(model, batch, ref, *, shared, pack, max_tokens=100_000, loss="ppo"):
    cfg = UpdateConfig(kl_coef=0.1, grad_clip=None, shared_prefix=shared, pack=pack, loss=loss,
                       is_band=(0.9, 1.1))  # a narrow band: some tokens are truncated
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = ppo_update(model, optim, batch, None, ref, cfg, max_tokens)
    return stats, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("shared,pack", PATHS)
def test_masked_update_equals_env_tokens_as_prompt(shared, pack):
    batch, segs, ref = _multiturn()
    split, split_ref = _split(batch, segs, ref)
    base = _model()
    chunks, used_shared = _chunks(base, batch.prompt_ids, batch.response_ids, 100_000, shared, pack)
    assert used_shared == shared
    masked, w_masked = _step(copy.deepcopy(base), batch, ref, shared=shared, pack=pack)
    plain, w_plain = _step(copy.deepcopy(base), split, split_ref, shared=shared, pack=pack)
    assert masked["n_tokens"] == sum(len(r) for r in split.response_ids) < sum(len(r) for r in batch.response_ids)
    for key in STATS:
        assert masked[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-6), key
    assert masked["grad_norm"] > 0 and masked["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    for a, b in zip(w_plain, w_masked):  # SGD, lr 1: the weights moved by minus the gradient
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shared,pack", PATHS)
def test_env_tokens_logprobs_do_not_enter_the_update(shared, pack):
    """Wild engine and reference log-probs on the environment's tokens change nothing: they are
    in no ratio, KL, clip count or mismatch statistic."""
    batch, _, ref = _multiturn(seed=1)
    wild = copy.deepcopy(batch)
    g = torch.Generator().manual_seed(5)
    wild_ref = []
    for i, m in enumerate(batch.loss_mask):
        noise = (40 * torch.randn(len(m), generator=g)).tolist()
        wild.engine_logprobs[i] = [e if own else n for e, n, own in zip(batch.engine_logprobs[i], noise, m)]
        wild_ref.append(torch.where(torch.tensor(m, dtype=torch.bool), ref[i], torch.tensor(noise) - 60))
    base = _model()
    a, wa = _step(copy.deepcopy(base), batch, ref, shared=shared, pack=pack)
    b, wb = _step(copy.deepcopy(base), wild, wild_ref, shared=shared, pack=pack)
    for key in STATS + ("grad_norm", "is_ess"):
        assert a[key] == b[key], key
    for x, y in zip(wa, wb):
        assert torch.equal(x, y)


@pytest.mark.parametrize("shared,pack", [(False, False), (False, True)])
def test_trailing_env_tokens_get_no_gradient(shared, pack):
    """Environment tokens after the last model turn are context for nothing: whatever their ids,
    the update is the same, so no gradient reaches the model through them."""
    batch, _, ref = _multiturn(seed=2)
    other = copy.deepcopy(batch)
    changed = 0
    for i, m in enumerate(batch.loss_mask):
        last = max(j for j, own in enumerate(m) if own)
        for j in range(last + 1, len(m)):
            other.response_ids[i][j] = (batch.response_ids[i][j] + 7) % (VOCAB - 1) + 1
            changed += 1
    assert changed
    base = _model()
    a, wa = _step(copy.deepcopy(base), batch, ref, shared=shared, pack=pack)
    b, wb = _step(copy.deepcopy(base), other, ref, shared=shared, pack=pack)
    for key in STATS + ("grad_norm",):
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key
    for x, y in zip(wa, wb):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_gspo_sequence_ratio_counts_model_tokens_only():
    """GSPO's per-sequence ratio averages over the model's tokens: wild old log-probs on the
    environment's tokens leave its loss and gradient unchanged."""
    batch, _, ref = _multiturn(seed=3)
    base = _model()
    from trainer.optim.update import sequence_logprobs
    old = sequence_logprobs(base, batch.prompt_ids, batch.response_ids, 1.0, 100_000)
    old = [o - 0.05 for o in old]  # the policy moved a little since: ratios != 1
    wild = [torch.where(torch.tensor(m, dtype=torch.bool), o, o + 3.0) for o, m in zip(old, batch.loss_mask)]
    cfg = UpdateConfig(kl_coef=0.0, grad_clip=None, loss="gspo", is_band=None, clip_low=10.0, clip_high=10.0)
    out = []
    for o in (old, wild):
        model = copy.deepcopy(base)
        stats = ppo_update(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, o, None, cfg, 100_000)
        out.append((stats["loss"], stats["grad_norm"]))
    assert out[0][1] > 0
    assert out[0] == pytest.approx(out[1], rel=1e-6)


@pytest.mark.parametrize("shared,pack", PATHS)
def test_single_turn_all_ones_mask_is_no_mask(shared, pack):
    """Single-turn: a mask of ones gives the very parameters that no mask does."""
    batch, _, ref = _multiturn(seed=4)
    batch.loss_mask = None
    ones = copy.deepcopy(batch)
    ones.loss_mask = [[1] * len(r) for r in batch.response_ids]
    base = _model()
    a, wa = _step(copy.deepcopy(base), batch, ref, shared=shared, pack=pack, max_tokens=300)
    b, wb = _step(copy.deepcopy(base), ones, ref, shared=shared, pack=pack, max_tokens=300)
    for key in STATS + ("grad_norm",):
        assert a[key] == b[key], key
    for x, y in zip(wa, wb):
        assert torch.equal(x, y)


def test_model_token_mask():
    valid = torch.tensor([[True, True, True, False], [True, True, False, False]])
    assert torch.equal(model_token_mask(valid, None, [0, 1]), valid)
    mask = [[1, 0], [1, 0, 1], [0, 1, 1]]
    out = model_token_mask(valid, mask, [2, 0])  # the order of idx
    assert out.tolist() == [[False, True, True, False], [True, False, False, False]]


def test_select_concat_and_episodes_keep_the_mask():
    batch, _, _ = _multiturn(seed=6)
    sel = batch.select(torch.tensor([3, 0]))
    assert sel.loss_mask == [batch.loss_mask[3], batch.loss_mask[0]]
    plain = copy.deepcopy(sel)
    plain.loss_mask = None
    both = concat_rollouts([sel, plain])
    assert both.loss_mask == sel.loss_mask + [[1] * len(r) for r in plain.response_ids]
    assert concat_rollouts([plain, plain]).loss_mask is None
    assert both.model_lengths()[:2] == [sum(m) for m in sel.loss_mask]
    ep = Episodes(prompt_index=[0, 0], prompt_ids=[[1], [1]], completion_ids=[[2, 3], [4]], logprobs=[[0.0, 0.0], [0.0]],
                  texts=["", ""], truncated=[False, False], rewards=[1.0, 0.0], correct=[True, False],
                  loss_mask=[[1, 0], [1]])
    assert ep.to_rollouts().loss_mask == [[1, 0], [1]]


@pytest.mark.parametrize("shared,pack", PATHS)
def test_a_masked_batch_split_into_micro_batches_updates_as_one(shared, pack):
    """Under a micro-batch token budget the masked batch runs in several micro-batches; the loss
    is still normalised by the whole mini-batch's model tokens, so the update is the same."""
    batch, _, ref = _multiturn(seed=2)
    base = _model()
    small = 40  # a few samples per micro-batch
    assert len(_chunks(base, batch.prompt_ids, batch.response_ids, small, shared, pack)[0]) > 2
    one, w_one = _step(copy.deepcopy(base), batch, ref, shared=shared, pack=pack)
    many, w_many = _step(copy.deepcopy(base), batch, ref, shared=shared, pack=pack, max_tokens=small)
    for key in STATS + ("grad_norm",):
        assert many[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    for a, b in zip(w_one, w_many):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
