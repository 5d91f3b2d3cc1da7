"""What prefilling the shared opening once saves the HF engine at a later turn of a
multi-turn step.

At every turn after the first, `trainer/rollouts/multiturn.py` calls `engine.generate` with
each live trajectory's whole context (its prompt's opening + its own turns so far), n = 1. The
HF engine groups prompts by their common prefix and prefills each group's prefix once
(`HFEngine._plan_prefixes`); `min_shared_prefix=None` turns that off (every context prefilled
whole, as before). Arms, on one model, in one process, interleaved `--repeats` times (median):

- `turn_reuse` / `turn_plain`: 8 prompts x 8 trajectories whose contexts share a 200-token
  opening, each with its own 30-token suffix; 24 new tokens each (sampled, EOS ignored);
- `single_reuse` / `single_plain`: a single-turn call, 8 distinct 230-token prompts x n = 8
  (the grouping finds nothing and must not cost anything).

Model: a Qwen2-architecture model (full attention; 4 layers, hidden 256, vocabulary 8192)
built from its config, float32, one torch thread. The tokens of both arms are checked equal.
Figures go to docs/data/multiturn_prefill.json.

    OMP_NUM_THREADS=1 .venv/bin/python bench/multiturn_prefill.py [--repeats 3]
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

from trainer.engines.hf_engine import HFEngine  # noqa: E402
from trainer.rollouts import SamplingConfig  # noqa: E402

VOCAB = 8192


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      use_sliding_window=False)
    return Qwen2ForCausalLM(cfg).float().eval()


def turn_contexts(prompts: int, per: int, opening: int, own: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(prompts):
        head = torch.randint(1, VOCAB, (opening,), generator=g).tolist()
        out += [head + torch.randint(1, VOCAB, (own,), generator=g).tolist() for _ in range(per)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--per", type=int, default=8, help="trajectories per prompt")
    ap.add_argument("--opening", type=int, default=200)
    ap.add_argument("--own", type=int, default=30, help="each trajectory's own tokens")
    ap.add_argument("--new", type=int, default=24, help="tokens generated")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "data" / "multiturn_prefill.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build_model()
    engines = {"reuse": HFEngine(model, 0), "plain": HFEngine(model, 0, min_shared_prefix=None)}
    turn = turn_contexts(args.prompts, args.per, args.opening, args.own)
    g = torch.Generator().manual_seed(2)
    single = [torch.randint(1, VOCAB, (args.opening + args.own,), generator=g).tolist()
              for _ in range(args.prompts)]
    calls = {"turn": (turn, SamplingConfig(n=1, max_new_tokens=args.new, temperature=1.0, seed=3)),
             "single": (single, SamplingConfig(n=args.per, max_new_tokens=args.new, temperature=1.0, seed=3))}
    times: dict[str, list[float]] = {f"{c}_{e}": [] for c in calls for e in engines}
    tokens: dict[str, list] = {}
    for _ in range(args.repeats):
        for c, (prompts, sampling) in calls.items():
            for e, engine in engines.items():
                t0 = time.perf_counter()
                gen = engine.generate(prompts, sampling, ignore_eos=True)
                times[f"{c}_{e}"].append(time.perf_counter() - t0)
                tokens[f"{c}_{e}"] = gen.token_ids
    same = {c: tokens[f"{c}_reuse"] == tokens[f"{c}_plain"] for c in calls}
    t0 = time.perf_counter()
    planned = engines["reuse"]._plan_prefixes(single)
    plan_s = time.perf_counter() - t0
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "setup": {**vars(args), "out": str(args.out.relative_to(REPO)), "threads": 1,
                  "model": "Qwen2 4 layers, hidden 256, vocab 8192, float32", "torch": torch.__version__},
        "seconds_median": med, "seconds_all": times,
        "turn_speedup": med["turn_plain"] / med["turn_reuse"],
        "single_ratio_reuse_over_plain": med["single_reuse"] / med["single_plain"],
        "same_tokens": same, "single_plan_triggered": planned is not None, "single_plan_s": plan_s,
    }
    for k, v in med.items():
        print(f"{k:14s} {v:7.3f} s (median of {args.repeats})")
    print(f"turn: plain / reuse = {result['turn_speedup']:.2f}x   single: reuse / plain = "
          f"{result['single_ratio_reuse_over_plain']:.3f}   same tokens: {same}   "
          f"single-turn plan: {plan_s * 1e3:.2f} ms, triggered={planned is not None}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
