"""LoRA training (`model.lora`): a peft adapter on a frozen base, and what the trainer needs
around it (the KL reference, checkpoints, the merged download).

Why peft and not hand-written adapters: its checkpoints (`adapter_config.json` +
`adapter_model.safetensors`) are the format users, vLLM and transformers already load.

Precision: the base is loaded in the compute dtype (bf16 on CUDA, float32 on CPU) and frozen;
the adapter weights are float32 (peft's `autocast_adapter_dtype`, then checked here), so AdamW
keeps float32 moments for them only and the update lands on float32 weights.

The KL reference is the same model object, never a copy:
- until the first reference reset it is the base itself: `disable_adapter()` for the
  reference pass (LoRA's B starts at zero, so base == policy at step 0);
- a reset (`algo.ref_reset_every`) snapshots the adapter (`AdapterReference`, adapter-sized,
  float32); the reference pass swaps those weights in and back out. The reference is then
  exactly the policy at the reset step, as in full fine-tuning, and the optimizer state is
  kept. We do not merge the adapter into the base at a reset: merging into a bf16 base rounds
  small updates away, and a merged base would no longer be the user's model that the
  downloaded adapter applies to.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from trainer.spec import LoraSpec

ADAPTER = "default"            # peft's adapter name; the trainer trains exactly one


class LoraTargetError(ValueError):
    """`model.lora.target_modules` names modules the model does not have."""


def has_an_adapter(model) -> bool:
    """Whether `model` is a PeftModel (carries a LoRA adapter)."""
    return hasattr(model, "peft_config")


def apply_lora(model: torch.nn.Module, lora: LoraSpec) -> torch.nn.Module:
    """`model` (already in the compute dtype) frozen, with a float32 LoRA adapter: a PeftModel."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=lora.target_modules, bias="none", task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=True)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        if "target" in str(exc).lower():
            raise LoraTargetError(f"model.lora.target_modules: {exc}") from None
        raise
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            if "lora_" not in name:
                raise RuntimeError(f"{name} is trainable but not part of the LoRA adapter")
            p.data = p.data.float()  # peft casts bf16/fp16 adapters up; make float32 certain
    return peft_model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer updates: the adapter under LoRA, every weight otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's trainable tensors by their names in the PeftModel."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n}


def load_lora_policy(spec, model_dir: Path, resume: Path | None, device: torch.device):
    """(policy, tokenizer, reference) for a LoRA job: the base from `model_dir` in the compute
    dtype, the adapter fresh or from the checkpoint `resume`; the reference (kl_coef > 0) is an
    `AdapterReference` that `trainer.checkpoints.io.load_state` may restore later."""
    from trainer.models.loading import load_policy

    base, tokenizer = load_policy(model_dir, spec.model.dtype, device, master_fp32=False,
                                  gradient_checkpointing=spec.model.gradient_checkpointing)
    policy = apply_lora(base, spec.model.lora)
    policy.train()
    ref = AdapterReference(policy) if spec.algo.kl_coef > 0 else None  # the base, until a reset
    if resume is not None:
        load_adapter(policy, Path(resume))
    return policy, tokenizer, ref


# --------------------------------------------------------------------------- reference


def _buffer_name(param_name: str) -> str:
    return param_name.replace(".", "__")


class AdapterReference(torch.nn.Module):
    """The KL reference under LoRA: the base plus a frozen snapshot of the adapter.

    A module (buffers only) so the checkpoint code saves and restores it like the full
    reference (`trainer_state/ref.safetensors`). `load_state_dict` also takes the policy's
    own state dict: that is how a reference reset snapshots the adapter.
    """

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        for name, p in adapter_state(policy).items():
            self.register_buffer(_buffer_name(name), p.detach().clone())
        self.is_base = self._adapter_is_zero()

    def _adapter_is_zero(self) -> bool:
        # B == 0 makes the adapter's update zero: the reference is then the base exactly.
        return all(not bool(b.any()) for n, b in self.named_buffers() if "lora_B" in n)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        mine = {n for n, _ in self.named_buffers()}
        picked = {}
        for key, value in state_dict.items():
            name = key if key in mine else _buffer_name(key)
            if name in mine:
                picked[name] = value
        result = super().load_state_dict(picked, strict=strict, assign=assign)
        self.is_base = self._adapter_is_zero()
        return result

    def copy_weights_from(self, policy: torch.nn.Module) -> None:
        """A reference reset (`trainer.collectives.copy_weights`): snapshot the adapter."""
        self.load_state_dict(policy.state_dict())

    @contextlib.contextmanager
    def active(self, policy: torch.nn.Module):
        """`policy` acting as the reference for the duration (weights restored after)."""
        if self.is_base:
            with policy.disable_adapter():
                yield policy
            return
        params = adapter_state(policy)
        saved = {}
        with torch.no_grad():
            for name, p in params.items():
                saved[name] = p.detach().clone()
                p.copy_(getattr(self, _buffer_name(name)))
        try:
            yield policy
        finally:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(saved[name])


@contextlib.contextmanager
def reference_model(policy: torch.nn.Module, ref: torch.nn.Module):
    """The module whose forward is the KL reference: `ref` itself under full fine-tuning,
    the policy with its adapter off or swapped under LoRA."""
    if isinstance(ref, AdapterReference):
        with ref.active(policy) as m:
            yield m
    else:
        yield ref


# --------------------------------------------------------------------------- checkpoints


def load_adapter(model: torch.nn.Module, folder: Path) -> None:
    """Restore the adapter weights saved by `save_pretrained` in `folder` (exact resume)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(Path(folder) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights, adapter_name=ADAPTER)
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if missing or getattr(result, "unexpected_keys", []):
        raise ValueError(f"{folder}: the adapter does not fit this model (missing {missing[:3]}, "
                         f"unexpected {list(getattr(result, 'unexpected_keys', []))[:3]})")


def merged_state_dict(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], bool]:
    """The base's weights with the adapter folded in (W + B A x alpha / r), in the base's
    dtype and names, on the CPU; and whether tied embeddings still hold (both equal)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    modules = dict(base.named_modules())
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}
    duplicates: dict[str, str] = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        if value.data_ptr() in seen:
            duplicates[name] = seen[value.data_ptr()]
        seen.setdefault(value.data_ptr(), name)
        owner = modules.get(key.rsplit(".base_layer.", 1)[0]) if ".base_layer." in key else None
        if isinstance(owner, LoraLayer) and key.endswith("base_layer.weight"):
            with torch.no_grad():
                value = (value.float() + owner.get_delta_weight(ADAPTER).float()).to(value.dtype)
        out[name] = value.detach().to("cpu").clone()
    tied = True
    for name, first in duplicates.items():
        if torch.equal(out[name], out[first]):
            del out[name]  # transformers re-ties it on load
        else:
            tied = False
    return out, tied
