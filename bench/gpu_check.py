"""One-command check of the trainer at real scale on one GPU: a few PPO steps of a
~0.5 B Qwen2-architecture model, bf16 compute over float32 master weights, the HF engine.

    python bench/gpu_check.py                 # CUDA: ~0.5 B model (Qwen2-0.5B's shape), < 8 min
    python bench/gpu_check.py --size tiny     # the same path on a CPU in seconds (tested)
    python bench/gpu_check.py --optimizer-state cpu_offload   # masters and moments on the CPU

No download: the model is built locally with random weights (its architecture is what costs
memory and time; the weights' values do not), the prompts are random tokens. Each step is
generate (HF engine, autocast bf16) -> old log-probs -> `--mini-batches` PPO updates with AdamW
at lr 1e-6, using the trainer's own functions. Prints (and writes with --json) the figures
docs/results.md quotes: fraction of parameters moved, loss finite, samples/s, tokens/s, peak
GPU memory and the update's MFU against the card's bf16 dense peak.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.optim.optimizer import make_optimizer  # noqa: E402
from trainer.engines.hf_engine import HFEngine  # noqa: E402
from trainer.models.loading import disable_dropout  # noqa: E402
from trainer.optim.update import (UpdateConfig, auto_micro_batch_tokens, ppo_update,  # noqa: E402
                            sequence_logprobs)
from trainer.rollouts import Rollouts, SamplingConfig  # noqa: E402
from trainer.spec import OptimSpec  # noqa: E402

SIZES = {  # Qwen2-0.5B's shape, and a toy one for the CPU test
    "0.5b": dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}
# Dense bf16 peak FLOP/s by device name (H100 SXM and H200 share the Hopper SXM figure).
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def bf16_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in BF16_PEAK.items() if k in name), None)


def build_model(size: str, device: torch.device) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SIZES[size])).float().to(device)  # fp32 masters
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return disable_dropout(model)


def run(size: str, steps: int, prompts: int, n: int, prompt_len: int, new_tokens: int,
        mini_batches: int, lr: float, device: torch.device, micro_batch_tokens: int | None = None,
        optimizer_state: str = "fp32") -> dict:
    cdtype = torch.bfloat16
    model = build_model(size, device)
    n_params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    engine = HFEngine(model, vocab - 1, seed=0, compute_dtype=cdtype)  # EOS never sampled in practice
    # cpu_offload casts the device weights to bf16 here: the masters it keeps are the fp32 ones.
    opt = make_optimizer(model.parameters(), OptimSpec(lr=lr, weight_decay=0.0, optimizer_state=optimizer_state),
                         lr, device_dtype=cdtype)
    cfg = UpdateConfig(is_band=None, kl_coef=0.0, compute_dtype=cdtype)
    masters = getattr(opt, "masters", None) or list(model.parameters())  # the float32 weights
    first = [p.detach().clone() for p in masters]
    g = torch.Generator().manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    samples = tokens = 0
    losses, gen_s, train_s, train_tokens = [], 0.0, 0.0, 0
    for step in range(steps):
        prompt_ids = [torch.randint(0, vocab - 1, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
        t = time.perf_counter()
        gen = engine.generate(prompt_ids, SamplingConfig(n=n, max_new_tokens=new_tokens, seed=step),
                              ignore_eos=True)
        _sync(device)
        gen_s += time.perf_counter() - t
        S = len(gen)
        ro = Rollouts(prompt_ids=[prompt_ids[i] for i in gen.prompt_index], response_ids=gen.token_ids,
                      engine_logprobs=gen.logprobs, group=torch.tensor(gen.prompt_index),
                      rewards=torch.rand(S, generator=g), truncated=torch.zeros(S, dtype=torch.bool),
                      advantages=torch.randn(S, generator=g))
        t = time.perf_counter()
        model.train()
        # The trainer's `auto` budget (4 GiB of activations) gives ~900 tokens at this vocab;
        # an 80-141 GB card takes far more, and MFU needs the larger chunks.
        mbt = micro_batch_tokens or auto_micro_batch_tokens(model, prompt_len + new_tokens)
        old = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, mbt, compute_dtype=cdtype)
        for chunk in torch.tensor_split(torch.randperm(S, generator=g), mini_batches):
            ids = chunk.tolist()
            stats = ppo_update(model, opt, ro.select(chunk), [old[i] for i in ids], None, cfg, mbt)
            losses.append(stats["loss"])
        _sync(device)
        train_s += time.perf_counter() - t
        samples += S
        tokens += sum(map(len, gen.token_ids))
        train_tokens += sum(len(p) + len(r) for p, r in zip(ro.prompt_ids, ro.response_ids))
    moved = sum(int((a != b).sum()) for a, b in zip(first, masters)) / n_params
    # Update FLOPs: forward + backward of the PPO pass (6 N T) plus the old log-prob forward (2 N T).
    flops = 8 * n_params * train_tokens
    peak = bf16_peak(device)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "size": size, "optimizer_state": optimizer_state, "params": n_params, "steps": steps, "samples_per_step": prompts * n,
        "params_moved_frac": moved, "loss_finite": all(math.isfinite(x) for x in losses),
        "samples_per_s": samples / (gen_s + train_s), "gen_tokens_per_s": tokens / gen_s,
        "train_tokens_per_s": train_tokens / train_s,
        "peak_gpu_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "update_tflops": flops / train_s / 1e12,
        "update_mfu": flops / train_s / peak if peak else None,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default=None, help="default: 0.5b on CUDA, tiny on CPU")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--mini-batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--micro-batch-tokens", type=int, default=None,
                    help="default: 16384 on CUDA, the trainer's auto rule on CPU")
    ap.add_argument("--optimizer-state", choices=["fp32", "8bit", "cpu_offload"], default="fp32")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = a.size or ("0.5b" if device.type == "cuda" else "tiny")
    mbt = a.micro_batch_tokens or (16_384 if device.type == "cuda" else None)
    out = run(size, a.steps, a.prompts, a.n, a.prompt_len, a.new_tokens, a.mini_batches, a.lr, device, mbt,
              a.optimizer_state)
    for k, v in out.items():
        print(f"{k:>20}: {v:.4g}" if isinstance(v, float) else f"{k:>20}: {v}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
