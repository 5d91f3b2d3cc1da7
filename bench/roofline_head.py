"""The v150k update split: why the update of the 24 M model with a 151,936-entry vocabulary is
under 60 % of its matmul bound in bench/roofline.py (docs/results.md section 13).

Two children, one torch thread, each probing the matmul rate (`measure_bounds`) before and after
its timings, the best of the two:
  head    the fused LM head alone (`child_head_split`): the product's `fused_loss` against its
          three matmuls per slice alone and its elementwise passes alone
  update  `ppo_update` itself on a subset of the v150k step's samples (`child_update_split`):
          its micro-batches, and inside them the time in `fused_loss` (the head) and the rest
          (the body's forward and backward), each against its bound

    .venv/bin/python bench/roofline.py --head-split head,update [--head-positions 1764]
        [--update-samples 8] [--json docs/data/roofline.json]

Writes the key `head_split_v150k` of the results file (`head` and `update`, each part kept
when the other is run alone).
"""
from __future__ import annotations

import json
import os
import time

from common import emit_result, run_child
from roofline import _save, _time, best_bounds, measure_bounds

HIDDEN, VOCAB = 512, 151_936
PROMPT_TOKENS, RESPONSE_TOKENS = 37, 256  # the v150k step: 16 prompts of ~37 tokens, every response 256


def child_head_split(cfg: dict) -> None:
    """The fused head alone on the v150k dimensions (random weights), `positions` positions in
    one packed [1, N] segment (the packed layouts' shape, so slices of `chunk_positions(1, V)`
    positions), each timed best and median of 3:
      fused       `fused_loss` as the update calls it, ppo with the k2 KL term (`UpdateConfig()`
                  through `_policy_loss`), then `loss.backward()`: log-probs, entropies and the
                  hidden states' and head's gradients
      matmuls     its three matmuls per slice alone, into tensors made beforehand:
                  [r,H]x[H,V] (logits), [r,V]x[V,H] (hidden grad), [V,r]x[r,H] (head grad)
      elementwise the passes over a slice's [r, V] logits alone: the division by T, log-sum-exp,
                  the target's gather, the entropy, the logits' gradient dz (exp, scale, scatter)
      accumulate  `grad_head += ...` per slice: one [V, H] add"""
    import torch

    from trainer.algo.losses import entropy_from_logits
    from trainer.algo.objectives import Totals
    from trainer.optim.fused_head import fused_loss
    from trainer.optim.logprobs import chunk_positions
    from trainer.optim.update import UpdateConfig, _policy_loss

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    H, V, n = cfg["hidden"], cfg["vocab"], cfg["positions"]
    r = chunk_positions(1, V)
    sizes = [min(r, n - s) for s in range(0, n, r)]  # the slices' positions, as `_segment_grads` cuts them
    r = sizes[0]
    before = measure_bounds(cfg["threads"])
    x, head = torch.randn(1, n, H), 0.02 * torch.randn(V, H)
    pos, targets = torch.arange(n).unsqueeze(0), torch.randint(V, (1, n))
    ucfg = UpdateConfig()  # ppo, k2 KL at 1e-4, IS band, T = 1 (examples/demo.yaml's)
    engine, ref = torch.full((1, n), -12.0), torch.full((1, n), -12.0)
    adv, mask, totals = torch.ones(1), torch.ones(1, n, dtype=torch.bool), Totals(n, 1, ucfg.max_new_tokens)
    xa, ha = x.clone().requires_grad_(), head.clone().requires_grad_()

    def fused():
        xa.grad = ha.grad = None
        loss, _, _ = fused_loss([(xa, pos, ha)], targets, ucfg.temperature,
                                lambda lp: _policy_loss(lp, None, engine, adv, ref, mask, ucfg, totals)[0])
        loss.backward()
        assert xa.grad is not None and ha.grad is not None

    rows, z, gx, gh = x[0, :r].contiguous(), torch.empty(r, V), torch.empty(r, H), torch.empty(V, H)

    def matmuls():
        for k in sizes:
            torch.mm(rows[:k], head.T, out=z[:k])
            torch.mm(z[:k], head, out=gx[:k])
            torch.mm(z[:k].T, rows[:k], out=gh)

    z0, t, g = (rows @ head.T).unsqueeze(0), targets[:, :r, None], torch.full((1, r, 1), 1e-3)

    def elementwise():
        for k in sizes:
            zz = z0[:, :k].float() / ucfg.temperature
            lse = torch.logsumexp(zz, -1)
            zz.gather(-1, t[:, :k]).squeeze(-1) - lse
            entropy_from_logits(zz, lse)
            zz.sub_(lse[..., None]).exp_().mul_(-g[:, :k]).scatter_add_(-1, t[:, :k], g[:, :k]).div_(ucfg.temperature)

    acc = torch.zeros(V, H)

    def accumulate():
        for _ in sizes:
            acc.add_(gh)

    out = {"hidden": H, "vocab": V, "positions": n, "slice_positions": r, "slices": len(sizes),
           "matmul_flops": 3 * 2 * n * H * V}
    for name, fn in (("fused", fused), ("matmuls", matmuls), ("elementwise", elementwise),
                     ("accumulate", accumulate)):
        ts = sorted(_time(fn) for _ in range(3))
        out[name] = {"best_s": ts[0], "median_s": ts[1], "runs_s": ts}
    after = measure_bounds(cfg["threads"])
    out["bounds_around"] = [before, after]
    out["threads"] = torch.get_num_threads()
    emit_result(out)


def child_update_split(cfg: dict) -> None:
    """`ppo_update` on `samples` samples shaped like the v150k step's (prompts of 37 random
    tokens, 2 samples each, responses of 256), the step's settings (`vs_trl.spec_for`: ppo,
    no KL term, T = 1, `micro_batch_tokens` 2048), the cached v150k model: one update to warm
    up (2 samples), then one measured. Times every `_micro_step` (its forward and backward),
    the `fused_loss` calls inside them (the head) and counts the body's positions (a hook on
    the decoder, as `PhaseClock`) and attention FLOPs (as bench/roofline.py counts them)."""
    import torch
    from transformers import AutoModelForCausalLM

    import trainer.optim.update as upd
    from roofline import _model_sizes
    from trainer.rollouts.batch import Rollouts

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(cfg["model_dir"], dtype=torch.float32)
    model.train()
    sizes = _model_sizes(model)
    ucfg = upd.UpdateConfig(kl_coef=0.0, temperature=1.0, max_new_tokens=RESPONSE_TOKENS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    t = {"micro": 0.0, "fused": 0.0}
    n = {"body_positions": 0, "micro_steps": 0}
    plain_micro, plain_fused = upd._micro_step, upd.fused_loss

    def timed(key, fn):
        def inner(*a, **k):
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t[key] += time.perf_counter() - s
        return inner

    def count(_mod, args, kwargs):
        ids, mask = kwargs.get("input_ids", args[0] if args else None), kwargs.get("attention_mask")
        if ids is not None:
            n["body_positions"] += int(mask[:, -ids.shape[1]:].sum()) if mask is not None and mask.dim() == 2 else ids.numel()

    upd._micro_step, upd.fused_loss = timed("micro", plain_micro), timed("fused", plain_fused)
    (model.get_decoder() if hasattr(model, "get_decoder") else model.model).register_forward_pre_hook(count, with_kwargs=True)

    def batch(samples: int) -> Rollouts:
        prompts = [torch.randint(100, VOCAB, (PROMPT_TOKENS,)).tolist() for _ in range(samples // 2)]
        return Rollouts(prompt_ids=[prompts[i // 2] for i in range(samples)],
                        response_ids=[torch.randint(100, VOCAB, (RESPONSE_TOKENS,)).tolist() for _ in range(samples)],
                        engine_logprobs=[[-12.0] * RESPONSE_TOKENS for _ in range(samples)],
                        group=torch.arange(samples) // 2, rewards=torch.zeros(samples),
                        truncated=torch.zeros(samples, dtype=torch.bool),
                        advantages=torch.tensor([1.0, -1.0] * (samples // 2)))

    upd.ppo_update(model, opt, batch(2), None, None, ucfg, cfg["mbt"])
    mb = batch(cfg["samples"])
    before = measure_bounds(cfg["threads"])
    t.update(micro=0.0, fused=0.0)
    n.update(body_positions=0)
    s = time.perf_counter()
    stats = upd.ppo_update(model, opt, mb, None, None, ucfg, cfg["mbt"])
    total = time.perf_counter() - s
    after = measure_bounds(cfg["threads"])
    attn = sum(2 * sizes["layers"] * sizes["q_dim"] * (len(p) + len(r)) ** 2 for p, r in zip(mb.prompt_ids, mb.response_ids))
    emit_result({"samples": cfg["samples"], "update_s": total, "micro_s": t["micro"], "fused_s": t["fused"],
                 "body_positions": n["body_positions"], "head_positions": sum(mb.model_lengths()),
                 "attn_flops": attn, "sizes": sizes, "loss": stats["loss"], "bounds_around": [before, after],
                 "threads": torch.get_num_threads()})


def _head_report(res: dict) -> None:
    rate = best_bounds(*res["bounds_around"])["matmul_gflops"] * 1e9
    bound = res["matmul_flops"] / rate
    res["matmul_gflops"], res["matmul_bound_s"] = rate / 1e9, bound
    for name in ("fused", "matmuls", "elementwise", "accumulate"):
        res[name]["pct_of_bound"] = 100 * bound / res[name]["best_s"]  # of the three matmuls' bound
        res[name]["pct_of_fused"] = 100 * res[name]["best_s"] / res["fused"]["best_s"]
    fused, mm, ew, acc = (res[k]["best_s"] for k in ("fused", "matmuls", "elementwise", "accumulate"))
    res["fused"]["rest_s"] = fused - mm - ew - acc  # autograd.grad per slice, gathers, allocations, the backward's scaling
    print(f"v150k head, {res['positions']} positions in {res['slices']} slices of {res['slice_positions']}, "
          f"{res['threads']} thread(s), matmul rate {rate / 1e9:.1f} GFLOP/s, bound {bound:.2f} s (best / median of 3):")
    for name in ("fused", "matmuls", "elementwise", "accumulate"):
        r = res[name]
        print(f"  {name:12s} {r['best_s']:7.2f} / {r['median_s']:7.2f} s  {r['pct_of_fused']:5.1f} % of fused; "
              f"matmul bound / best {r['pct_of_bound']:5.1f} %")
    print(f"  fused - matmuls - elementwise - accumulate: {res['fused']['rest_s']:.2f} s")


def _update_report(res: dict) -> None:
    rate = best_bounds(*res["bounds_around"])["matmul_gflops"] * 1e9
    s = res["sizes"]
    head_bound = 6 * s["p_head"] * res["head_positions"] / rate
    body_bound = 3 * (2 * s["p_body"] * res["body_positions"] + res["attn_flops"]) / rate
    body_s = res["micro_s"] - res["fused_s"]
    res.update(matmul_gflops=rate / 1e9, head_bound_s=head_bound, body_bound_s=body_bound, body_s=body_s,
               head_pct_of_bound=100 * head_bound / res["fused_s"], body_pct_of_bound=100 * body_bound / body_s,
               micro_pct_of_bound=100 * (head_bound + body_bound) / res["micro_s"])
    print(f"v150k ppo_update, {res['samples']} samples ({res['head_positions']} response tokens, "
          f"{res['body_positions']} positions through the body), rate {rate / 1e9:.1f} GFLOP/s: update "
          f"{res['update_s']:.1f} s, micro-batches {res['micro_s']:.1f} s ({res['micro_pct_of_bound']:.0f} % of bound) = "
          f"head (fused_loss) {res['fused_s']:.1f} s (bound {head_bound:.1f} s, {res['head_pct_of_bound']:.0f} %) + "
          f"body {body_s:.1f} s (bound {body_bound:.1f} s, {res['body_pct_of_bound']:.0f} %)")


def head_split(args, script: str) -> None:
    """The parent: runs the parts asked for, prints, merges them into `--json`'s `head_split_v150k`."""
    parts = set(args.head_split.split(","))
    env = {"OMP_NUM_THREADS": str(args.threads), "BRORL_TORCH_THREADS": str(args.threads)}
    saved = json.loads(args.json.read_text()) if args.json.exists() else {}
    result = saved.get("head_split_v150k", {})
    if "head" in parts:
        cfg = {"threads": args.threads, "hidden": HIDDEN, "vocab": VOCAB, "positions": args.head_positions}
        res = run_child([script, "--child", "head_split", json.dumps(cfg)], timeout=900, env=env)
        res["load"] = os.getloadavg()[0]
        _head_report(res)
        result["head"] = res
    if "update" in parts:
        from vs_trl import launch

        dirs = launch("prep", {"threads": args.threads, "need": ["v150k"]}, 3600)
        cfg = {"threads": args.threads, "model_dir": dirs["v150k"], "samples": args.update_samples, "mbt": 2048}
        res = run_child([script, "--child", "update_split", json.dumps(cfg)], timeout=900, env=env)
        res["load"] = os.getloadavg()[0]
        _update_report(res)
        result["update"] = res
    _save(args.json, "head_split_v150k", result)
