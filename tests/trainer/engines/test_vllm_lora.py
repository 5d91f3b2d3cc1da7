"""vLLM's own LoRA support on its CPU engine: the base loaded once, each sync sends only the
adapter (a new LoRARequest per weight version) and the engine's log-probs match the trainer's
PeftModel, for the sync check's tokens and for sampled tokens."""
import pytest
import torch

from trainer.models.lora import apply_lora
from trainer.rollouts import SamplingConfig
from trainer.spec import LoraSpec
from tests.support.services import require_module

pytestmark = pytest.mark.slow


def _kick(model, shift=0.0):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05).add_(shift)


def test_vllm_serves_each_adapter_version_with_the_trainers_logprobs(tmp_path):
    require_module("vllm")
    from trainer.engines import make_engine
    from trainer.engines.base import trainer_token_logprobs
    from trainer.models.tiny import build_untrained, save_folder
    from trainer.optim.update import sequence_logprobs

    base, tok = build_untrained(seed=0, size="tiny", max_position_embeddings=256)
    base_dir = save_folder(base, tok, tmp_path / "base")
    model = apply_lora(base, LORASPEC)
    engine = make_engine("vllm", base_dir, model, tok, dtype="float32", seed=0, max_model_len=128,
                         max_num_seqs=16, lora_rank=LORASPEC.rank)
    try:
        for version, shift in ((2, 0.0), (3, 0.02)):  # version 1: the zero adapter at start-up
            _kick(model, shift)
            assert 0 < engine.sync_weights(model) < 60 and engine.version == version  # seconds
            sent = {p.name for p in (engine.adapters / f"v{version}").iterdir()}
            assert "adapter_model.safetensors" in sent and "model.safetensors" not in sent  # adapter only
            assert engine.sync_check_diff(model) < 1e-4
            with model.disable_adapter():  # the adapter matters: the base alone is far off
                assert engine.sync_check_diff(model) > 1e-2
        prompts = [[5, 6, 7, 8], [9, 10, 11]]
        gen = engine.generate(prompts, SamplingConfig(n=4, max_new_tokens=8, seed=1), ignore_eos=True)
        mine = sequence_logprobs(model, [prompts[i] for i in gen.prompt_index], gen.token_ids, 1.0, 4096)
        diff = max(float((torch.tensor(e) - m).abs().max()) for e, m in zip(gen.logprobs, mine))
        assert diff < 1e-3, diff
        assert trainer_token_logprobs(model, engine.sync_check).numel() == len(engine.sync_check) - 1
    finally:
        engine.close()


LORASPEC = LoraSpec(rank=8, alpha=16)
