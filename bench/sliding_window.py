"""What exactness costs the shared-prompt update on a sliding-window model.

The shared-prefix forward runs each prompt once per micro-batch; on a sliding-window model
prompts of different lengths in one chunk are off by up to ~0.2 nats (their responses lose
window slots to padding), so `trainer.optim.update.prefix_micro_batches` now gives each prompt
length its own chunk unless the window cannot bite. That means more, smaller forwards. This
times one PPO mini-batch update (forward + backward, old = current) and measures the largest
log-prob error against each sample run alone, for three arms on the same batch and model:

- `shared_exact`: today's code (chunks of one prompt length where the window bites);
- `shared_mixed`: the previous chunking (mixed lengths; `attention_window` forced to None);
- `plain`: the padded batch, every prompt run once per sample.

Model: a Mistral-architecture model (4 layers, hidden 128, window 32) built from its config;
8 prompts of 20..60 tokens x N = 16 responses of 8..64 tokens. One torch thread, each arm
timed `--repeats` times interleaved (median kept), in one process so the arms share the
machine's load. Figures go to docs/data/sliding_window.json.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sliding_window.py [--repeats 3]
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
from transformers import MistralConfig, MistralForCausalLM  # noqa: E402

from trainer.optim import update  # noqa: E402
from trainer.rollouts import Rollouts  # noqa: E402

VOCAB, WINDOW = 256, 32


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW)
    return MistralForCausalLM(cfg).float().train()


def build_batch(prompts: int = 8, n: int = 16) -> Rollouts:
    g = torch.Generator().manual_seed(0)
    ps, rs, group = [], [], []
    for gi in range(prompts):
        p = torch.randint(1, VOCAB, (int(torch.randint(20, 61, (), generator=g)),), generator=g).tolist()
        for _ in range(n):
            ps.append(p)
            rs.append(torch.randint(1, VOCAB, (int(torch.randint(8, 65, (), generator=g)),), generator=g).tolist())
            group.append(gi)
    S = len(rs)
    return Rollouts(prompt_ids=ps, response_ids=rs, engine_logprobs=[[-5.5] * len(r) for r in rs],
                    group=torch.tensor(group), rewards=torch.zeros(S), truncated=torch.zeros(S, dtype=torch.bool),
                    advantages=torch.randn(S, generator=g))


@torch.no_grad()
def max_error(model, batch: Rollouts, shared: bool) -> float:
    """Largest |log-prob - the sample run alone| over the batch."""
    got = update.sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 1.0, 8192, shared_prefix=shared)
    worst = 0.0
    for p, r, lp in zip(batch.prompt_ids, batch.response_ids, got):
        lps = torch.log_softmax(model(input_ids=torch.tensor([p + r])).logits[0].float(), -1)
        alone = lps[len(p) - 1:-1].gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        worst = max(worst, float((alone - lp).abs().max()))
    return worst


def timed_update(model, batch: Rollouts, shared: bool, max_tokens: int) -> float:
    cfg = update.UpdateConfig(kl_coef=0.0, shared_prefix=shared)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    t = time.perf_counter()
    update.ppo_update(model, opt, batch, None, None, cfg, max_tokens)
    return time.perf_counter() - t


def run_arm(name: str, model, batch, max_tokens: int):
    """(seconds of one update, micro-batches, max log-prob error) in arm `name`."""
    real = update.attention_window
    if name == "shared_mixed":
        update.attention_window = lambda m: None
    try:
        shared = name != "plain"
        chunks, _ = update._chunks(model, batch.prompt_ids, batch.response_ids, max_tokens, shared)
        return timed_update(model, batch, shared, max_tokens), len(chunks), max_error(model, batch, shared)
    finally:
        update.attention_window = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--out", default=str(REPO / "docs" / "data" / "sliding_window.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, batch = build_model(), build_batch()
    arms = ("shared_exact", "shared_mixed", "plain")
    times = {a: [] for a in arms}
    info = {}
    for _ in range(args.repeats):
        for a in arms:
            s, chunks, err = run_arm(a, model, batch, args.max_tokens)
            times[a].append(s)
            info[a] = {"chunks": chunks, "max_abs_logprob_error": err}
    out = {"model": "Mistral 4x128, sliding_window 32", "samples": len(batch),
           "prompt_lengths": sorted({len(p) for p in batch.prompt_ids}), "max_tokens": args.max_tokens,
           "threads": 1, "repeats": args.repeats,
           "arms": {a: {"update_s_median": statistics.median(times[a]), "update_s": times[a], **info[a]}
                    for a in arms}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["arms"], indent=1))


if __name__ == "__main__":
    main()
