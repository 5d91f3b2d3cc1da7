"""What float32 gradient sums cost `optim.optimizer_state: cpu_offload`, and what they fix.

bf16 device weights make bf16 `.grad`s; the optimizer now adds each micro-batch's gradient
into a float32 sum (trainer/optim/offload.py) instead of letting autograd add them up in bf16.
Times K backward passes of a 25 M-parameter Qwen2 (bf16 weights, one torch thread) both ways
on the same inputs, interleaved, and measures each sum's relative error against the exact
(float64) sum of the same per-micro-batch gradients. Figures: docs/data/offload_accum.json.

    .venv/bin/python bench/offload_accum.py [--micro-batches 128] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from trainer.optim.offload import CPUOffloadAdamW  # noqa: E402

VOCAB = 512


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float()


def inputs(k: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, VOCAB, (1, 32), generator=g) for _ in range(k)]


def backward_all(m, xs) -> float:
    t = time.perf_counter()
    for x in xs:
        m(input_ids=x).logits.float().logsumexp(-1).mean().backward()
    return time.perf_counter() - t


def exact_sum(m, xs) -> list[torch.Tensor]:
    params = list(m.parameters())
    out = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    for x in xs:
        loss = m(input_ids=x).logits.float().logsumexp(-1).mean()
        for o, g in zip(out, torch.autograd.grad(loss, params)):
            o += g.double()
    return out


def rel_err(got, want) -> float:
    num = sum(float((a.double() - b).pow(2).sum()) for a, b in zip(got, want))
    return (num / sum(float(b.pow(2).sum()) for b in want)) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro-batches", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "docs" / "data" / "offload_accum.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    xs = inputs(args.micro_batches)
    bf16 = model()  # autograd's own accumulation: bf16 .grad
    for p in bf16.parameters():  # weights only, as the optimizer casts them (buffers stay float32)
        p.data = p.data.to(torch.bfloat16)
    off = model()
    opt = CPUOffloadAdamW(off.parameters(), device_dtype=torch.bfloat16, lr=0.0)
    want = exact_sum(bf16, xs)
    times = {"bf16_grad": [], "float32_sum": []}
    for _ in range(args.repeats):
        bf16.zero_grad(set_to_none=True)
        times["bf16_grad"].append(backward_all(bf16, xs))
        opt.zero_grad()
        times["float32_sum"].append(backward_all(off, xs))
    errs = {"bf16_grad": rel_err([p.grad for p in bf16.parameters()], want),
            "float32_sum": rel_err([m.grad for m in opt.grad_params()], want)}
    out = {"model": "Qwen2 8x512 (25 M params), bf16 weights", "micro_batches": args.micro_batches,
           "threads": 1, "repeats": args.repeats,
           "arms": {k: {"backward_s_median": statistics.median(times[k]), "backward_s": times[k],
                        "rel_error_vs_exact_sum": errs[k]} for k in times}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["arms"], indent=1))


if __name__ == "__main__":
    main()
