"""What a packed row's attention costs the update's body (docs/results.md section 13).

The update packs several samples into one row (trainer/optim/packing.py) under a block-diagonal
causal mask. On the CPU, SDPA with a boolean mask computes every query against every key of
the row, so a row of W positions pays W^2 attention whatever its samples' lengths, where the
roofline's bound counts each sample's own (p + r)^2. This times the forward and backward of
the v150k model's body (Qwen2, hidden 512, 8 layers, the 24 M shape of bench/vs_trl.py; a
100-entry vocabulary so the head is negligible) on the same tokens both ways, one thread,
median of `--repeats`, and counts the FLOPs each way:

- `packed`: one row of `--samples` x `--length` positions with the product's block-causal mask;
- `separate`: the same samples as rows of their own (plain causal attention, no padding).

    OMP_NUM_THREADS=1 .venv/bin/python bench/packed_attention.py
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.optim.packing import _block_causal

OUT = Path(__file__).resolve().parent / "out"


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--length", type=int, default=293, help="prompt + response of one sample (v150k: 37 + 256)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=100, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                      attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).train()
    n, L = args.samples, args.length
    ids = torch.randint(0, 100, (n, L))
    seg = torch.arange(n).repeat_interleave(L).view(1, n * L)
    mask = _block_causal(seg).unsqueeze(1)
    pos = torch.arange(L).repeat(n).view(1, n * L)

    def packed():
        model(input_ids=ids.view(1, n * L), attention_mask=mask, position_ids=pos).logits.sum().backward()

    def separate():
        model(input_ids=ids).logits.sum().backward()

    packed(), separate()  # warm-up
    t_packed, t_sep = _timed(packed, args.repeats), _timed(separate, args.repeats)
    q_dim, layers = cfg.hidden_size, cfg.num_hidden_layers
    # Per forward: QK^T and AV, 2 FLOPs a multiply-add each; the backward twice that.
    attn_row = 3 * 4 * layers * q_dim * (n * L) ** 2            # what the packed row computes
    attn_own = 3 * 4 * layers * q_dim * n * L * L / 2          # each sample's causal share
    body = 3 * 2 * sum(p.numel() for n_, p in model.named_parameters() if "embed" not in n_ and "lm_head" not in n_) * n * L
    res = {"samples": n, "length": L, "repeats": args.repeats, "packed_s": t_packed, "separate_s": t_sep,
           "packed_over_separate": t_packed / t_sep, "body_gflop": body / 1e9,
           "attention_gflop_packed_row": attn_row / 1e9, "attention_gflop_own_causal": attn_own / 1e9}
    OUT.mkdir(exist_ok=True)
    (OUT / "packed_attention.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
