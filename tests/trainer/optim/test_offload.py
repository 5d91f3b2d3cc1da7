"""`optim.optimizer_state: cpu_offload`: the same AdamW, its masters and moments on the CPU, a
bf16 device copy that still takes 1e-6 steps, and an exact checkpoint round trip."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.checkpoints import io as checkpoint
from trainer.optim.offload import CPUOffloadAdamW
from trainer.rollouts import Rollouts
from trainer.optim.optimizer import make_optimizer
from trainer.spec import OptimSpec
from trainer.models.tiny import build_tokenizer
from trainer.optim.update import UpdateConfig, ppo_update, sequence_logprobs

VOCAB = 64
OFFLOAD = OptimSpec(optimizer_state="cpu_offload", weight_decay=0.01)


def _qwen(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float()


def _rollouts(seed):
    g = torch.Generator().manual_seed(seed)
    n = 8
    return Rollouts(prompt_ids=[torch.randint(1, VOCAB, (5,), generator=g).tolist() for _ in range(n)],
                    response_ids=[torch.randint(1, VOCAB, (6,), generator=g).tolist() for _ in range(n)],
                    engine_logprobs=[[-4.0] * 6 for _ in range(n)], group=torch.arange(n) // 2,
                    rewards=torch.arange(n) % 2 * 1.0, truncated=torch.zeros(n, dtype=torch.bool),
                    advantages=torch.tensor([1.0, -1.0] * (n // 2)))


def _steps(model, opt, seeds, dtype=torch.float32):
    """PPO updates through the production path (micro-batches, grad clip, finite check)."""
    cfg = UpdateConfig(is_band=None, kl_coef=0.0, compute_dtype=dtype)
    for s in seeds:
        ro = _rollouts(s)
        old = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, 4096, compute_dtype=dtype)
        assert ppo_update(model, opt, ro, old, None, cfg, 4096)["skipped"] == 0.0


def test_same_parameters_as_plain_adamw():
    plain, offl = _qwen(), _qwen()
    _steps(plain, make_optimizer(plain.parameters(), OptimSpec(weight_decay=0.01), 1e-3), range(4))
    opt = make_optimizer(offl.parameters(), OFFLOAD, 1e-3)
    assert isinstance(opt, CPUOffloadAdamW)
    _steps(offl, opt, range(4))
    for (name, a), b in zip(plain.named_parameters(), offl.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=name)
    moved = _qwen()
    assert any(not torch.equal(a, b) for a, b in zip(moved.parameters(), offl.parameters()))


def test_masters_and_moments_live_on_the_cpu_apart_from_the_device_weights():
    model = _qwen()
    opt = make_optimizer(model.parameters(), OFFLOAD, 1e-3, device_dtype=torch.bfloat16)
    _steps(model, opt, [0], torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the device copy
    assert all(m.device.type == "cpu" and m.dtype == torch.float32 for m in opt.masters)
    ptrs = {p.data_ptr() for p in model.parameters()}
    assert not ptrs & {m.data_ptr() for m in opt.masters}
    moments = [t for st in opt.state.values() for k, t in st.items() if k in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(opt.masters)
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in moments)
    assert all(p.grad is None for p in model.parameters())  # zero_grad reached the device copy


def test_bf16_device_weights_still_take_1e6_steps_on_the_masters():
    model = _qwen()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    opt = make_optimizer(model.parameters(), OptimSpec(optimizer_state="cpu_offload", weight_decay=0.0),
                         1e-6, device_dtype=torch.bfloat16)
    before = [m.clone() for m in opt.masters]
    _steps(model, opt, [0], torch.bfloat16)
    moved = sum(int((a != b).sum()) for a, b in zip(before, opt.masters))
    assert moved / sum(m.numel() for m in before) > 0.9
    for p, m in zip(model.parameters(), opt.masters):
        assert torch.equal(p, m.to(torch.bfloat16))  # the device holds the masters, rounded


def test_checkpoint_resume_continues_from_the_float32_masters(tmp_path):
    model, tok = _qwen(), build_tokenizer()
    opt = make_optimizer(model.parameters(), OFFLOAD, 1e-3, device_dtype=torch.bfloat16)
    _steps(model, opt, [0, 1], torch.bfloat16)
    state = checkpoint.TrainerState(step=2, stage=0, data_cursor=0, ref_step=2, spec_sha256="x")
    saved = checkpoint.save(tmp_path, state, model, tok, opt, None, keep_last=2)
    _steps(model, opt, [2, 3], torch.bfloat16)  # the uninterrupted run

    # As build_run resumes: float32 weights from the (bf16) folder, then the trainer state.
    resumed = Qwen2ForCausalLM.from_pretrained(saved.path, dtype=torch.float32)
    opt2 = make_optimizer(resumed.parameters(), OFFLOAD, 1e-3, device_dtype=torch.bfloat16)
    assert checkpoint.load_state(saved.path, opt2, None).step == 2
    _steps(resumed, opt2, [2, 3], torch.bfloat16)
    for a, b in zip(opt.masters, opt2.masters):
        assert torch.equal(a, b)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_loading_a_plain_adamw_state_is_a_clear_error():
    model = _qwen()
    plain = torch.optim.AdamW(model.parameters())
    opt = make_optimizer(_qwen().parameters(), OFFLOAD, 1e-3)
    try:
        opt.load_state_dict(plain.state_dict())
    except ValueError as e:
        assert "cpu_offload" in str(e)
    else:
        raise AssertionError("loaded a state without masters")


@pytest.mark.slow  # 128 bf16 forward/backward pairs on a CPU: 15-80 s on 2 shared cores
def test_micro_batch_gradients_add_up_in_float32_on_bf16_device_weights():
    """128 micro-batches on bf16 device weights: the gradient the step (and the clip) sees is
    their float32 sum, not a running bf16 sum (which is ~1 % off)."""
    model = _qwen()
    opt = make_optimizer(model.parameters(), OFFLOAD, 0.0, device_dtype=torch.bfloat16)
    params = list(model.parameters())
    want = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    g = torch.Generator().manual_seed(0)
    for _ in range(128):
        x = torch.randint(1, VOCAB, (1, 6), generator=g)
        loss = model(input_ids=x).logits.float().logsumexp(-1).mean()
        for w, gr in zip(want, torch.autograd.grad(loss, params, retain_graph=True)):
            w += gr.double()  # each micro-batch's own bf16 gradient, summed exactly
        loss.backward()
    opt.step()  # lr 0: the masters keep the gradient AdamW was given
    got = [m.grad.double() for m in opt.masters]
    err = max(float((a - b).norm() / b.norm()) for a, b in zip(got, want))
    assert err < 1e-5, err
    assert all(p.grad is None for p in params)  # the bf16 copies were freed after each backward
    opt.zero_grad()
    assert all(m.grad is None for m in opt.masters)


def test_update_clips_the_float32_sum_with_cpu_offload():
    """Through ppo_update, micro-batched: grad_norm is the norm of the masters' float32 sum."""
    model = _qwen()
    opt = make_optimizer(model.parameters(), OFFLOAD, 1e-3, device_dtype=torch.bfloat16)
    ro = _rollouts(0)
    cfg = UpdateConfig(is_band=None, kl_coef=0.0, compute_dtype=torch.bfloat16, grad_clip=1e-3)
    seen = {}
    real_step = opt.step

    def step():
        seen["norm"] = float(torch.nn.utils.get_total_norm([m.grad for m in opt.masters]))
        real_step()
    opt.step = step
    stats = ppo_update(model, opt, ro, None, None, cfg, 11)  # one sample per micro-batch
    assert stats["grad_norm"] > 1e-3
    assert seen["norm"] == pytest.approx(1e-3, rel=1e-3)  # clipped before AdamW saw it
