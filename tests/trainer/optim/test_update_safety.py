"""The update at real scale: float32 master weights under bf16 autocast move at lr 1e-6,
dropout is off, extreme log-ratios stay finite, non-finite updates are skipped and then fail
the job, and the mini-batch split is even."""
import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from trainer.algo.advantages import ADVANTAGES
from trainer.algo.losses import KL_ESTIMATORS, is_weights, ppo_clip_terms
from trainer.models.loading import disable_dropout, load_policy
from trainer.optim.update import UpdateConfig, ppo_update, sequence_logprobs
from trainer.rollouts import Rollouts
from trainer.spec import JobSpec
from trainer.step import NonFiniteError, split_mini_batches, train_on_batch
from tests.support.services import require_module

VOCAB = 64


def _qwen(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():  # N(0, 0.02) weights, as the measurement
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model


def _rollouts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (5,), generator=g).tolist() for _ in range(n)]
    responses = [torch.randint(1, VOCAB, (6,), generator=g).tolist() for _ in range(n)]
    return Rollouts(prompt_ids=prompts, response_ids=responses,
                    engine_logprobs=[[-4.0] * 6 for _ in range(n)], group=torch.arange(n) // 2,
                    rewards=torch.arange(n) % 2 * 1.0, truncated=torch.zeros(n, dtype=torch.bool),
                    advantages=torch.tensor([1.0, -1.0] * (n // 2)))


def _fraction_moved(model, compute_dtype):
    ro = _rollouts(8)
    old = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, 4096, compute_dtype=compute_dtype)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    cfg = UpdateConfig(is_band=None, kl_coef=0.0, compute_dtype=compute_dtype)
    stats = ppo_update(model, opt, ro, old, None, cfg, 4096)
    changed = sum(int((a != b).sum()) for a, b in zip(before, model.parameters()))
    return changed / sum(p.numel() for p in before), stats


def test_fp32_master_weights_move_at_lr_1e6_under_bf16_autocast():
    frac_master, stats = _fraction_moved(_qwen(), torch.bfloat16)   # the production path
    frac_bf16, _ = _fraction_moved(_qwen().to(torch.bfloat16), torch.bfloat16)  # the old one
    assert stats["skipped"] == 0.0 and torch.isfinite(torch.tensor(stats["loss"]))
    assert frac_master > 0.9, frac_master
    assert frac_bf16 < 0.2, frac_bf16  # a bf16 weight cannot take a 1e-6 step: why fp32 masters


def _save_folder(model, folder):
    """An HF folder load_policy can read: the model and a two-word tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(folder)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1}, "a")),
                                  eos_token="b")
    tok.save_pretrained(folder)


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    _save_folder(_qwen(), tmp_path)
    ro = _rollouts(4)
    grads = []
    for checkpointing in (False, True):
        model, _ = load_policy(tmp_path, "bfloat16", "cpu", gradient_checkpointing=checkpointing)
        assert next(model.parameters()).dtype == torch.float32  # masters stay fp32
        assert model.is_gradient_checkpointing == checkpointing
        old = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, 4096)

        class Capture:
            def step(self):
                grads.append([p.grad.clone() for p in model.parameters()])

            def zero_grad(self, set_to_none=True):
                model.zero_grad(set_to_none=True)

        ppo_update(model, Capture(), ro, old, None, UpdateConfig(is_band=None, kl_coef=0.0), 4096)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_dropout_is_off_in_train_mode(tmp_path):
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                     resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)
    _save_folder(GPT2LMHeadModel(cfg), tmp_path)
    model, _ = load_policy(tmp_path, "float32", "cpu")
    assert model.training
    ids = torch.randint(0, VOCAB, (2, 10))
    torch.testing.assert_close(model(ids).logits, model(ids).logits, rtol=0, atol=0)
    fresh = GPT2LMHeadModel(cfg).train()
    assert not torch.equal(fresh(ids).logits, fresh(ids).logits)  # the check can fail
    disable_dropout(fresh)
    assert torch.equal(fresh(ids).logits, fresh(ids).logits)


def test_extreme_log_ratios_stay_finite():
    logp = torch.tensor([[-1.0, -200.0]], requires_grad=True)
    old = torch.tensor([[-300.0, -1.0]])
    loss, _, _ = ppo_clip_terms(logp, old, torch.tensor([-1.0]), 0.2, 0.27)
    (loss.sum() + KL_ESTIMATORS["k3"](logp, old).sum() + KL_ESTIMATORS["k2"](logp, old).sum()).backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    w, _ = is_weights(torch.tensor([[0.0]]), torch.tensor([[-1000.0]]), None)
    assert torch.isfinite(w).all()


def test_kl_gradient_matches_finite_difference():
    # d/dlogp of each estimator, against a central difference (not against its own formula).
    logp = torch.tensor([-1.3, -0.2, -2.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.0, -0.9, -2.0], dtype=torch.float64)
    eps = 1e-6
    for name, fn in KL_ESTIMATORS.items():
        (grad,) = torch.autograd.grad(fn(logp, ref).sum(), logp)
        fd = (fn(logp.detach() + eps, ref) - fn(logp.detach() - eps, ref)) / (2 * eps)
        torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-7, msg=name)
        if name != "k1":  # descent moves logp toward the reference, from either side
            assert torch.equal(torch.sign(grad), torch.sign(logp.detach() - ref))


def test_nonfinite_update_is_skipped_and_leaves_weights():
    model = _qwen()
    ro = _rollouts(4)
    ro.advantages = torch.tensor([float("nan"), 1.0, -1.0, 1.0])
    old = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, 4096)
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = ppo_update(model, opt, ro, old, None, UpdateConfig(is_band=None), 4096)
    assert stats["skipped"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not opt.state  # the optimizer never stepped


def _fake_run(model, mini_batches=2, max_nonfinite=2):
    spec = JobSpec.model_validate({
        "name": "t", "task": {"dataset": {"id": "ds_x"}},
        "rollout": {"schedule": [{"n": 2, "prompts_per_step": 4, "steps": 1}]},
        "algo": {"mini_batches": mini_batches, "kl_coef": 0.0, "is_truncation": None},
        "optim": {"max_nonfinite_steps": max_nonfinite}})
    return SimpleNamespace(spec=spec, policy=model, ref=None, micro_batch_tokens=4096,
                           optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                           compute_dtype=torch.float32, nonfinite_in_row=0,
                           update_cfg=UpdateConfig.from_spec(spec),
                           advantage_fn=ADVANTAGES[spec.algo.advantage])


def test_update_counts_skips_then_fails_with_a_clear_message():
    run = _fake_run(_qwen(), mini_batches=2, max_nonfinite=3)
    ro = _rollouts(8)
    ro.rewards = torch.full((8,), float("nan"))  # NaN advantages for every sample
    out = train_on_batch(run, ro, index=0)
    assert out["skipped_updates"] == 2 and out["mini_batch_updates"] == 2
    with pytest.raises(NonFiniteError, match="non-finite loss or gradient"):
        train_on_batch(run, ro, index=1)


@pytest.mark.parametrize("n,m,want", [(6, 4, [2, 2, 1, 1]), (8, 4, [2, 2, 2, 2]), (3, 4, [1, 1, 1])])
def test_mini_batch_split_is_even(n, m, want):
    parts = split_mini_batches(n, m, torch.Generator().manual_seed(0))
    assert [len(p) for p in parts] == want
    assert sorted(torch.cat(parts).tolist()) == list(range(n))
    assert len(torch.arange(6).chunk(4)) == 3  # why not chunk: 6 samples in 4 gives 3


def test_old_logprobs_are_not_changed_by_the_mini_batch_updates():
    run = _fake_run(_qwen(), mini_batches=4)
    ro = _rollouts(8)
    calls = []
    import trainer.step as step_mod
    real = step_mod.ppo_update

    def spy(model, opt, mb, old, ref, cfg, mbt):
        calls.append([o.clone() for o in old])
        return real(model, opt, mb, old, ref, cfg, mbt)

    step_mod.ppo_update = spy
    try:
        want = sequence_logprobs(run.policy, ro.prompt_ids, ro.response_ids, 1.0, 4096)
        train_on_batch(run, ro, index=0)
    finally:
        step_mod.ppo_update = real
    assert len(calls) == 4
    got = {tuple(o.tolist()) for mb in calls for o in mb}
    assert got == {tuple(o.tolist()) for o in want}  # computed once, before any update


def test_8bit_optimizer_state_steps_the_fp32_masters():
    require_module("bitsandbytes")
    from trainer.optim.optimizer import make_optimizer
    from trainer.spec import OptimSpec

    model = _qwen()
    opt = make_optimizer(model.parameters(), OptimSpec(optimizer_state="8bit"), 1e-6)
    assert "8bit" in type(opt).__name__
    frac_before = [p.detach().clone() for p in model.parameters()]
    ro = _rollouts(8)
    old = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, 4096, compute_dtype=torch.bfloat16)
    ppo_update(model, opt, ro, old, None, UpdateConfig(is_band=None, kl_coef=0.0,
                                                       compute_dtype=torch.bfloat16), 4096)
    moved = sum(int((a != b).sum()) for a, b in zip(frac_before, model.parameters()))
    assert moved / sum(p.numel() for p in frac_before) > 0.5
