"""The job spec's `model` section: the policy and, optionally, its LoRA adapter (trainer/spec.py)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from trainer.spec_base import FieldError, _Frozen

# --------------------------------------------------------------------------- model

TINY_MODEL = "builtin:tiny"
TINY_MIN_NEW_TOKENS = 24


# Linear layers of builtin:tiny (Qwen2), so that a LoRA target it lacks is a 422, not a job error.
TINY_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_LORA_RANK = 1024
MAX_VLLM_LORA_RANK = 512  # vLLM's largest max_lora_rank (trainer/engines/vllm_lora.py)


class LoraSpec(_Frozen):
    """A LoRA adapter (peft) instead of full fine-tuning: the base stays frozen in the compute
    dtype and only the adapter (and its AdamW state) is trained, in float32."""

    rank: int = Field(16, ge=1, le=MAX_LORA_RANK, description="The adapter's rank r (Tinker's "
                      "default is 32; LoRA matches full fine-tuning in RL even at small ranks).")
    alpha: float = Field(32.0, gt=0, le=16_384, description="peft's lora_alpha: the adapter's "
                         "update is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, le=0.5, description="Dropout on the adapter's input during the "
                           "PPO forwards (peft's lora_dropout); 0 keeps every log-prob of a sample "
                           "the same across forwards, as the rest of the trainer does.")
    target_modules: Literal["all-linear"] | Annotated[list[Annotated[str, Field(
        min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.]+$")]], Field(min_length=1, max_length=64)] = Field(
        "all-linear",
        description="all-linear (every linear layer but the output head, MLP included, as "
                    "'LoRA Without Regret' advises) or a list of module names (e.g. q_proj, v_proj); "
                    "a name the model lacks is refused (a 422 for builtin:tiny, a job error naming "
                    "this field otherwise).")


class ModelSpec(_Frozen):
    path: str = Field("builtin:tiny", min_length=1, max_length=4096,
                      description="builtin:tiny (a 0.6 M-parameter model built on the worker, no download); "
                      "an absolute path to a Hugging Face model folder under one of the deployment's "
                      "BRORL_MODEL_ROOTS; or a hub id, where the deployment sets BRORL_ALLOW_HUB_MODELS.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute dtype (auto = bf16 on CUDA, float32 on CPU); trainable "
                            "weights and optimizer state are float32 either way (on the CPU "
                            "with optim.optimizer_state cpu_offload).")
    fp32_lm_head: bool = Field(
        False, description="Under a bf16 compute dtype, project to the vocabulary and take the "
        "log-softmax in float32 in the trainer's log-probs (the rest stays bf16): ScaleRL reports "
        "it lowers the trainer/engine mismatch and raises the asymptote, for one more float32 "
        "matmul of the head. The log-softmax is float32 always; with float32 compute it changes "
        "nothing. The rollout engine keeps its own head precision.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute each layer's activations in the backward: about 30 % more "
                           "update compute for the activations of one layer at a time.")
    lora: LoraSpec | None = Field(
        None, description="null: full fine-tuning. Else train a LoRA adapter (peft) on the frozen "
        "base: the KL reference is the base with the adapter off (no second copy), checkpoints "
        "hold the adapter in PEFT's format, and start from about 10x the full fine-tuning "
        "optim.lr. vLLM serves the adapter with its own LoRA support (each step sends only the "
        "adapter). On many ranks (resources.gpus_per_node) every rank holds the whole base and "
        "the adapter's gradients are all-reduced. Needs optim.optimizer_state fp32.")

    @model_validator(mode="after")
    def _tiny_has_targets(self) -> "ModelSpec":
        lora = self.lora
        if lora is None or self.path != TINY_MODEL or lora.target_modules == "all-linear":
            return self
        missing = [m for m in lora.target_modules if m.rsplit(".", 1)[-1] not in TINY_LINEAR_MODULES]
        if missing:
            raise FieldError("model.lora.target_modules", f"{missing} are not linear layers of "
                             f"builtin:tiny; it has {', '.join(TINY_LINEAR_MODULES)}")
        return self


# --------------------------------------------------------------------------- task
