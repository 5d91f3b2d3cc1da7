"""model.fp32_lm_head: under a bf16 autocast the head's projection (and the log-softmax) run in
float32, whether the log-probs apply the head a slice at a time or the model applies its own;
the layers stay bf16. On a CUDA machine the same checks run on the GPU too."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.optim.logprobs import token_logp
from trainer.optim.model_io import fp32_output_head

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_sliced_head_projects_in_float32_under_bf16_autocast(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 64, generator=g).to(device)
    head = (torch.randn(300, 64, generator=g) * 0.5).to(device)
    targets = torch.randint(0, 300, (2, 7), generator=g).to(device)
    exact = token_logp([(x, None, head)], targets, 1.0)  # no autocast: float32 throughout
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        fp32 = token_logp([(x, None, head)], targets, 1.0, fp32_head=True)
        bf16 = token_logp([(x, None, head)], targets, 1.0)
    torch.testing.assert_close(fp32, exact, rtol=1e-5, atol=1e-5)
    # bf16 keeps 8 bits of mantissa: logits of ~5 are off by ~0.02, and so are the log-probs
    assert (bf16 - exact).abs().max() > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_model_head_runs_in_float32_and_the_layers_in_bf16(device):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).to(device)
    ids = torch.randint(0, 96, (2, 9), device=device)
    head = model.get_output_embeddings()
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        with fp32_output_head(model, True):
            out = model(input_ids=ids, output_hidden_states=True)
        plain = model(input_ids=ids).logits
    assert model.get_output_embeddings() is head  # put back
    # the residual stream may stay float32 (float32 weights); autocast makes every matmul bf16,
    # the head's too unless fp32_output_head takes it out
    assert out.logits.dtype == torch.float32 and plain.dtype == torch.bfloat16
    exact = model(input_ids=ids).logits  # no autocast at all: the layers' matmuls in float32
    assert (out.logits - exact).abs().max() > 1e-4  # the layers did run in bf16
    want = torch.nn.functional.linear(out.hidden_states[-1].float(), head.weight.float())
    torch.testing.assert_close(out.logits, want, rtol=1e-6, atol=1e-6)
    out.logits.sum().backward()  # the head's float32 gradient reaches its weight
    assert head.weight.grad is not None and torch.isfinite(head.weight.grad).all()


def test_fp32_head_off_is_a_no_op():
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))
    head = model.get_output_embeddings()
    with fp32_output_head(model, False):
        assert model.get_output_embeddings() is head
