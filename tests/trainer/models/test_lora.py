"""LoRA (peft) pieces on a small Qwen2: a float32 adapter on a frozen base, the update moving
the adapter only, the reference (base, then a snapshot), the shared-prefix path, the merged
weights and PEFT's files loading back with the trainer's log-probs."""
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.trainer.optim.test_update_fast import _batch
from trainer.checkpoints.io import write_merged
from trainer.models.lora import (AdapterReference, LoraTargetError, apply_lora, load_adapter,
                                 merged_state_dict, reference_model, trainable_parameters)
from trainer.models.tiny import build_tokenizer
from trainer.optim.update import UpdateConfig, ppo_update, sequence_logprobs
from trainer.spec import LoraSpec

VOCAB = 64


def _base(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).to(dtype).train()


def _lora(dtype=torch.float32, **kw):
    return apply_lora(_base(dtype=dtype), LoraSpec(rank=4, alpha=8, **kw))


def _small_batch():
    return _batch(groups=((8, 6), (8, 9)), seed=1)


def _logprobs(model, batch, shared=True):
    return sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 1.0, 4096, shared_prefix=shared)


def _kick(model, scale=0.05):
    """Give the adapter a non-zero B, as training does, so it changes the logits."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, scale)


def test_adapter_float32_on_a_frozen_compute_dtype_base():
    model = _lora(dtype=torch.bfloat16)
    trainable = dict((n, p) for n, p in model.named_parameters() if p.requires_grad)
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in trainable.values())
    frozen = [p for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    # all-linear: attention and MLP of every layer, not the (tied) output head
    targets = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n in trainable if "lora_A" in n}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(trainable_parameters(model)) == len(trainable)


def test_unknown_target_module_names_the_field():
    with pytest.raises(LoraTargetError, match="model.lora.target_modules"):
        apply_lora(_base(), LoraSpec(target_modules=["qkv_proj"]))


def test_update_moves_the_adapter_and_not_the_base():
    model = _lora()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    batch = _small_batch()
    ref = AdapterReference(model)
    with reference_model(model, ref) as m:
        ref_lp = _logprobs(m, batch)
    stats = ppo_update(model, opt, batch, None, ref_lp, UpdateConfig(kl_coef=0.1), 4096)
    assert stats["skipped"] == 0
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert moved and all("lora_" in n for n in moved)
    assert any("lora_B" in n for n in moved)  # B starts at 0: the adapter now changes the output
    base = [n for n in before if "lora_" not in n]
    assert all(torch.equal(dict(model.named_parameters())[n], before[n]) for n in base)
    # AdamW holds float32 moments for the adapter only
    state = opt.state_dict()["state"]
    assert len(state) == len(trainable_parameters(model))
    assert all(s["exp_avg"].dtype == torch.float32 for s in state.values())


def test_reference_is_the_base_then_the_snapshot_of_a_reset():
    plain = _base()
    model = _lora()
    batch = _small_batch()
    ref = AdapterReference(model)
    _kick(model)
    policy_lp = _logprobs(model, batch)
    assert ref.is_base
    with reference_model(model, ref) as m:
        ref_lp = _logprobs(m, batch)
    base_lp = _logprobs(plain, batch)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ref_lp, base_lp))
    assert max(float((a - b).abs().max()) for a, b in zip(policy_lp, base_lp)) > 1e-3

    ref.load_state_dict(model.state_dict())  # a reference reset: the policy as it is now
    assert not ref.is_base
    snapshot_lp = policy_lp
    _kick(model, scale=0.08)  # the policy moves on
    moved_lp = _logprobs(model, batch)
    with reference_model(model, ref) as m:
        ref_lp = _logprobs(m, batch)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ref_lp, snapshot_lp))
    after = _logprobs(model, batch)  # the swap put the policy's own adapter back
    assert all(torch.equal(a, b) for a, b in zip(after, moved_lp))


def test_shared_prefix_path_matches_the_plain_one_with_an_adapter():
    model = _lora()
    _kick(model)
    batch = _small_batch()
    fast, plain = _logprobs(model, batch, shared=True), _logprobs(model, batch, shared=False)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fast, plain))


def test_peft_files_and_merged_folder_load_with_the_trainers_logprobs(tmp_path):
    from peft import PeftModel

    model = _lora()
    _kick(model)
    batch = _small_batch()
    expected = _logprobs(model, batch)
    model.save_pretrained(tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "adapter").iterdir()}
    write_merged(model, build_tokenizer(), tmp_path / "merged")

    base = _base()  # the same base weights (seeded)
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").train()
    got = _logprobs(loaded, batch)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").train()
    got = _logprobs(merged, batch)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got, expected))
    weights, tied = merged_state_dict(model)
    assert tied and "lm_head.weight" not in weights

    other = _lora()  # exact resume: the adapter's weights restored bit for bit
    load_adapter(other, tmp_path / "adapter")
    a = {n: p for n, p in model.named_parameters() if "lora_" in n}
    b = {n: p for n, p in other.named_parameters() if "lora_" in n}
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
