"""The PPO update with a LoRA adapter (rank 8 and 64) against full fine-tuning: peak memory
and time, on the 24 M-parameter builtin-family model (`SIZES["25m"]`) at N = 512.

What is measured: the trainer's own update (`ppo_update`, one mini-batch, micro-batched
backward, AdamW step) with the KL reference's pass before it, on one prompt x N = 512
responses of 24 tokens (random tokens: memory and time do not depend on skill). Full
fine-tuning holds float32 weights, gradients, AdamW moments and a reference copy; LoRA holds
the same base (float32 on a CPU, the compute dtype), no reference copy (the adapter is
switched off for the reference pass) and float32 weights, gradients and moments for the
adapter only. Generation is left out: the HF engine samples with the same model either way.

Each configuration runs in a fresh subprocess (ru_maxrss is a process-lifetime peak) with one
torch thread and `MALLOC_MMAP_THRESHOLD_` fixed at 128 KiB: glibc otherwise raises its mmap
threshold after the first large frees and serves later tensors from a heap it does not give
back, so the peak RSS measured the allocator's history more than the live tensors (a first
run without it put LoRA above full fine-tuning). Reported: resident memory after building
(model, optimizer, reference), the peak during the updates and its growth over the build;
the bytes autograd saves for the backward of the largest micro-batch (`saved_tensors_hooks`,
unique storages other than the weights: exact, no allocator in it); the bytes of trainable state (weights, gradients,
AdamW moments: 16 per trainable parameter) plus the reference copy; and the mean update time
over `--steps` after one warm-up update. Timings on shared cores drift: compare within one run.

    .venv/bin/python bench/lora_update.py [--steps 2] [--n 512] [--out bench/out]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {"full": None, "lora-r8": 8, "lora-r64": 64}
MAX_NEW = 24


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _batch(n: int, vocab: int):
    import torch

    from trainer.rollouts import Rollouts

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (40,), generator=g).tolist()
    responses = [torch.randint(3, vocab, (MAX_NEW,), generator=g).tolist() for _ in range(n)]
    return Rollouts(prompt_ids=[prompt] * n, response_ids=responses,
                    engine_logprobs=[[-3.0] * MAX_NEW for _ in range(n)], group=torch.zeros(n, dtype=torch.long),
                    rewards=torch.zeros(n), truncated=torch.ones(n, dtype=torch.bool),
                    advantages=torch.randn(n, generator=g))


def saved_for_backward_mb(model, batch, micro_tokens: int) -> float:
    """MB autograd keeps for the backward of the largest micro-batch (unique storages, the
    model's own weights left out)."""
    import torch

    from trainer.optim.logprobs import token_logp
    from trainer.optim.update import _chunks, _logits

    chunks, shared = _chunks(model, batch.prompt_ids, batch.response_ids, micro_tokens, True)
    seen: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # held anyway

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits, b = _logits(model, batch.prompt_ids, batch.response_ids, chunks[0], torch.float32, shared)
        token_logp(logits, b["targets"], 1.0).sum()
    return sum(seen.values()) / 2**20


def measure(name: str, n: int, steps: int, micro_tokens: int) -> dict:
    """One configuration, in this process."""
    import torch

    torch.set_num_threads(1)
    from trainer.models.lora import AdapterReference, apply_lora, reference_model, trainable_parameters
    from trainer.models.tiny import build_untrained
    from trainer.optim.update import UpdateConfig, ppo_update, sequence_logprobs
    from trainer.spec import LoraSpec

    model, _ = build_untrained(seed=0, size="25m", max_position_embeddings=1024)
    model.train()
    rank = CONFIGS[name]
    if rank is None:
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    else:
        model = apply_lora(model, LoraSpec(rank=rank, alpha=2 * rank))
        ref = AdapterReference(model)
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=1e-6)
    batch = _batch(n, model.config.vocab_size)
    cfg = UpdateConfig(kl_coef=1e-4)
    built = _rss_mb()
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        with reference_model(model, ref) as m:
            ref_lp = sequence_logprobs(m, batch.prompt_ids, batch.response_ids, 1.0, micro_tokens)
        ppo_update(model, opt, batch, None, ref_lp, cfg, micro_tokens)
        if i:  # the first update is a warm-up (allocator, AdamW state)
            times.append(time.perf_counter() - t0)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in params)
    ref_bytes = sum(t.numel() * t.element_size() for t in ref.state_dict().values()) if rank is None else \
        sum(b.numel() * b.element_size() for b in ref.buffers())
    peak = _rss_mb()
    return {"config": name, "trainable_params": trainable, "params": total,
            "rss_built_mb": round(built, 1), "rss_peak_mb": round(peak, 1),
            "update_peak_growth_mb": round(peak - built, 1),
            "saved_for_backward_mb": round(saved_for_backward_mb(model, batch, micro_tokens), 1),
            "state_mb": round((16 * trainable + ref_bytes) / 2**20, 1),
            "update_s": round(sum(times) / len(times), 3), "n": n, "micro_batch_tokens": micro_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.n, args.steps, args.micro_batch_tokens)))
        return
    rows = []
    for name in args.configs.split(","):
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        out = subprocess.run([sys.executable, __file__, "--one", name, "--n", str(args.n), "--steps",
                              str(args.steps), "--micro-batch-tokens", str(args.micro_batch_tokens)],
                             capture_output=True, text=True, env=env)
        if out.returncode:
            sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora_update.json").write_text(json.dumps(rows, indent=1))
    print("| config | trainable params | RSS built (MB) | RSS peak (MB) | update peak growth (MB) | "
          "saved for backward (MB) | trainable state + reference (MB) | update (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['config']} | {r['trainable_params']:,} | {r['rss_built_mb']} | {r['rss_peak_mb']} | "
              f"{r['update_peak_growth_mb']} | {r['saved_for_backward_mb']} | {r['state_mb']} | {r['update_s']} |")


if __name__ == "__main__":
    main()
