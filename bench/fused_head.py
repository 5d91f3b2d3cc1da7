"""The update alone with the head's gradient fused into the log-prob forward, against the unfused
path (trainer/optim/fused_head.py; `UpdateConfig.fused_head`).

One mini-batch's `ppo_update` (forward + backward of every micro-batch; the optimizer step is a
no-op, so every rep starts from the same weights) on the 24 M model of the builtin family
(bench/vs_trl.py's "24m": bench-24m-seed0 from the cache where built, else the same config at
random init) with its own 100-token vocabulary and with the embedding grown to 151,936 rows
(vs_trl.py's "v150k"). A synthetic batch: `--prompts` x `--n` samples, prompts of 32 tokens,
responses of 64..`--max-new` tokens (a quarter of vs_trl's v150k_16x2_t256 by default, so that the whole
bench stays under ~6 min on a shared 2-core machine), ppo with the KL term, old = current.

Fused and unfused run in the SAME process, interleaved (unfused, fused, unfused, ...), one
torch thread, median of `--reps`; the two paths' gradients are compared (max |diff| relative to
the largest entry). Then the head alone, as a cleaner figure on a noisy machine: `token_logp` +
backward against `fused_loss` + backward on random hidden states [1, response tokens, 512] and
the 151,936-row head (a token-sum loss). No peak RSS: a fresh process's lifetime peak is set by loading and growing
the model (the same for both paths), not by the update.

    OMP_NUM_THREADS=1 .venv/bin/python bench/fused_head.py [--reps 3] [--prompts 4] [--n 2] [--max-new 256]

Writes bench/out/fused_head.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, print_table  # noqa: E402

V150K = 151_936  # Qwen2's vocabulary, as bench/vs_trl.py
MICRO_BATCH_TOKENS = 2048  # vs_trl.py's v150k shape


def _model(vocab: int):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from trainer.models.tiny import SIZES
    from trainer.run import cache_dir

    torch.manual_seed(0)
    saved = cache_dir() / "models" / "bench-24m-seed0"
    if (saved / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    else:
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=100, tie_word_embeddings=True, **SIZES["25m"]))
    if vocab != model.config.vocab_size:
        model.resize_token_embeddings(vocab, mean_resizing=False)
    return model.float().train()


def _batch(prompts: int, n: int, max_new: int, vocab: int):
    import torch

    from trainer.rollouts import Rollouts

    g = torch.Generator().manual_seed(0)
    ps, rs, group = [], [], []
    for gi in range(prompts):
        p = torch.randint(3, min(vocab, 100), (32,), generator=g).tolist()
        for _ in range(n):
            size = int(torch.randint(64, max_new + 1, (), generator=g))
            ps.append(p)
            rs.append(torch.randint(3, vocab, (size,), generator=g).tolist())
            group.append(gi)
    S = len(rs)
    engine = [(-12.0 + 0.3 * torch.randn(len(r), generator=g)).tolist() for r in rs]
    return Rollouts(prompt_ids=ps, response_ids=rs, engine_logprobs=engine, group=torch.tensor(group),
                    rewards=torch.zeros(S), truncated=torch.tensor([len(r) == max_new for r in rs]),
                    advantages=torch.randn(S, generator=g))


class _Keep:
    """A no-op optimizer step that keeps the gradients of the last update."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def step(self):
        self.grads = [p.grad.clone() for p in self.model.parameters() if p.grad is not None]

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)


def _update(model, batch, fused: bool):
    import torch

    from trainer.optim.update import UpdateConfig, ppo_update

    ref = [torch.tensor(e) + 0.1 for e in batch.engine_logprobs]
    opt = _Keep(model)
    t = time.perf_counter()
    stats = ppo_update(model, opt, batch, None, ref, UpdateConfig(fused_head=fused), MICRO_BATCH_TOKENS)
    return time.perf_counter() - t, stats, opt.grads


def _setup(cfg: dict):
    import torch

    torch.set_num_threads(1)
    return _model(cfg["vocab"]), _batch(cfg["prompts"], cfg["n"], cfg["max_new"], cfg["vocab"])


def measure(cfg: dict) -> dict:
    """Interleaved reps of both paths in this process; medians, ratio, gradient agreement."""
    model, batch = _setup(cfg)
    times = {False: [], True: []}
    grads = {}
    for _ in range(cfg["reps"]):
        for fused in (False, True):
            dt, stats, grads[fused] = _update(model, batch, fused)
            times[fused].append(dt)
    scale = max(float(g.abs().max()) for g in grads[False])
    diff = max(float((a - b).abs().max()) for a, b in zip(grads[False], grads[True])) / scale
    unfused, fused = statistics.median(times[False]), statistics.median(times[True])
    return {"vocab": cfg["vocab"], "samples": len(batch.response_ids),
            "response_tokens": sum(len(r) for r in batch.response_ids),
            "unfused_s": unfused, "fused_s": fused, "fused_over_unfused": fused / unfused,
            "grad_rel_diff": diff, "unfused_all_s": times[False], "fused_all_s": times[True]}


def head_only(tokens: int, reps: int) -> dict:
    """The head's log-probs, loss and gradients alone, unfused vs fused, interleaved."""
    import torch

    from trainer.optim.fused_head import fused_loss
    from trainer.optim.logprobs import token_logp

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, tokens, 512, generator=g).requires_grad_()
    head = (torch.randn(V150K, 512, generator=g) * 0.02).requires_grad_()
    targets = torch.randint(0, V150K, (1, tokens), generator=g)

    def loss_of(lp):
        return -lp.sum() / tokens

    def unfused():
        lp, _ = token_logp([(x, None, head)], targets, 1.0, with_entropy=True)
        loss_of(lp).backward()

    def fused():
        fused_loss([(x, None, head)], targets, 1.0, loss_of)[0].backward()

    times = {unfused: [], fused: []}
    for _ in range(reps):
        for fn in (unfused, fused):
            x.grad = head.grad = None
            t = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - t)
    u, f = statistics.median(times[unfused]), statistics.median(times[fused])
    return {"vocab": V150K, "samples": "head only", "response_tokens": tokens, "unfused_s": u, "fused_s": f,
            "fused_over_unfused": f / u, "unfused_all_s": times[unfused], "fused_all_s": times[fused]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=256)
    args = ap.parse_args()
    base = {"prompts": args.prompts, "n": args.n, "max_new": args.max_new, "reps": args.reps}
    rows = []
    for vocab in (100, V150K):
        row = measure({**base, "vocab": vocab})
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    rows.append(head_only(rows[-1]["response_tokens"], args.reps))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fused_head.json").write_text(json.dumps({"args": base, "threads": 1, "rows": rows}, indent=1))
    print_table(rows, ["vocab", "samples", "response_tokens", "unfused_s", "fused_s", "fused_over_unfused",
                       "grad_rel_diff"])


if __name__ == "__main__":
    main()
