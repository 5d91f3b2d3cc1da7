"""The PPO update alone on one saved batch: its time and its padding, this checkout against another.

One batch of the shape (`bench/vs_trl.py`'s SHAPES; default m24_64x2_t256: the 24 M model,
N = 64 x 2 prompts, `max_new_tokens` 256) is generated once with this checkout's trainer and
saved (bench/out/update_batch_<shape>.pt; reused when present). Then each checkout
(`--roots`: this one, and e.g. /work/main for the before) runs `ppo_update` on that same batch
from the same weights in a fresh process, one thread, `--reps` times (weights and optimizer
restored before each), and reports:

- the update's wall time (median and min of the reps);
- the positions its forwards ran (the model body's input positions, counted by a hook,
  prompt passes included) and the real ones among them (tokens of each distinct prompt once
  per micro-batch that runs it, plus each sample's response inputs; the plain forward:
  prompt + response per sample); the rest is padding, reported as its share of the run;
- the loss, gradient norm and a checksum of the weight change (lr 1e-6 AdamW as in the
  benchmarks), which must agree between checkouts to float rounding.

    .venv/bin/python bench/update_padding.py --roots .,/work/main [--shape m24_64x2_t256]
        [--reps 3] [--micro-batch-tokens 4096] [--label run]

Writes <out>/update_padding_<label>.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, REPO, emit_result, peak_rss_mb, print_table, run_child  # noqa: E402


def _threads(n: int) -> None:
    import os

    import torch

    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


def child_prep(cfg: dict) -> None:
    """Generate one batch of the shape with this checkout and save it (rollouts + advantages)."""
    import torch

    import trainer.step as step_mod
    from trainer.run import build_run
    from vs_trl import SHAPES, child_prep as vs_prep, spec_for  # noqa: F401

    _threads(cfg["threads"])
    model, n, prompts, max_new, _, mbt = SHAPES[cfg["shape"]]
    spec = spec_for({**cfg, "model": model, "n": n, "prompts": prompts, "max_new": max_new,
                     "mbt": mbt or cfg["mbt"], "warmup": 0, "steps": 1})
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(spec, Path(tmp), None, None)
        _threads(cfg["threads"])
        t = time.perf_counter()
        batch = step_mod.collect(run, run.plans[0], 0).batch
        gen_s = time.perf_counter() - t
        lengths = torch.tensor([len(r) for r in batch.response_ids], dtype=torch.float32)
        token_weights = lengths if spec.algo.advantage_whitening == "token" else None
        adv = run.advantage_fn(batch.rewards, batch.group, token_weights, None)
        cfgs = {"clip_low": spec.algo.clip_low, "clip_high": spec.algo.clip_high,
                "is_band": spec.algo.is_truncation, "temperature": spec.rollout.temperature,
                "grad_clip": spec.optim.grad_clip}
        run.close()
    torch.save({"prompt_ids": batch.prompt_ids, "response_ids": batch.response_ids,
                "engine_logprobs": [torch.as_tensor(x, dtype=torch.float32) for x in batch.engine_logprobs],
                "group": batch.group, "rewards": batch.rewards, "truncated": batch.truncated,
                "advantages": adv, "update_cfg": cfgs, "model_dir": cfg["model_dir"], "gen_s": gen_s},
               cfg["path"])
    emit_result({"path": cfg["path"], "gen_s": gen_s})


def _real_positions(chunks, shared: bool, prompts, responses) -> int:
    """The real (non-padding) positions the update's forwards run for these chunks: each
    distinct prompt once per chunk and every response input (all but the last token; the
    first is predicted by the prompt) for the shared prompt; prompt + response per sample
    for the plain forward."""
    real = 0
    for c in chunks:
        if shared:
            real += sum(len(p) for p in {tuple(prompts[i]) for i in c})
            real += sum(max(len(responses[i]) - 1, 0) for i in c)
        else:
            real += sum(len(prompts[i]) + len(responses[i]) for i in c)
    return real


def child_update(cfg: dict) -> None:
    """`ppo_update` of the checkout at cfg["root"] on the saved batch, timed."""
    sys.path.insert(0, str(Path(cfg["root"]).resolve()))
    for name in [m for m in sys.modules if m == "trainer" or m.startswith("trainer.")]:
        del sys.modules[name]
    import torch
    from transformers import AutoModelForCausalLM

    import trainer
    import trainer.optim.update as upd
    from trainer.models.loading import disable_dropout
    from trainer.rollouts import Rollouts

    assert Path(trainer.__file__).resolve().is_relative_to(Path(cfg["root"]).resolve()), trainer.__file__
    _threads(cfg["threads"])
    saved = torch.load(cfg["path"], weights_only=False)
    model = AutoModelForCausalLM.from_pretrained(saved["model_dir"], dtype=torch.float32)
    disable_dropout(model)
    model.train()
    batch = Rollouts(prompt_ids=saved["prompt_ids"], response_ids=saved["response_ids"],
                     engine_logprobs=saved["engine_logprobs"], group=saved["group"],
                     rewards=saved["rewards"], truncated=saved["truncated"], advantages=saved["advantages"])
    if not bool(batch.advantages.abs().sum()):
        # An untrained model scores 0 everywhere, so its advantages are 0 and so is the
        # gradient: seeded random advantages instead, so the loss and weights say something.
        batch.advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(0))
    ucfg = upd.UpdateConfig(kl_coef=0.0, **saved["update_cfg"])
    chunks, shared = upd._chunks(model, batch.prompt_ids, batch.response_ids, cfg["mbt"], ucfg.shared_prefix)
    pos_real = _real_positions(chunks, shared, batch.prompt_ids, batch.response_ids)
    counted = {"on": False, "run": 0}

    def count(_mod, args, kwargs):  # positions the model body runs (padding included)
        ids = kwargs.get("input_ids", args[0] if args else None)
        if counted["on"] and ids is not None:
            counted["run"] += ids.numel()

    model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    times, stats = [], None
    for _ in range(cfg["reps"]):
        model.load_state_dict(init)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
        counted["on"], counted["run"] = True, 0
        t = time.perf_counter()
        stats = upd.ppo_update(model, opt, batch, None, None, ucfg, cfg["mbt"])
        times.append(time.perf_counter() - t)
        counted["on"] = False
    pos_run = counted["run"]
    delta = [(p.detach() - init[k]).double() for k, p in model.named_parameters()]
    emit_result({"root": cfg["root"], "update_s_median": statistics.median(times), "update_s_min": min(times),
                 "update_s": times, "micro_batches": len(chunks), "shared": shared,
                 "positions_run": pos_run, "positions_real": pos_real,
                 "padding_share": 1 - pos_real / max(pos_run, 1),
                 "loss": stats["loss"], "grad_norm": stats["grad_norm"], "n_tokens": stats["n_tokens"],
                 "delta_abs_sum": float(sum(d.abs().sum() for d in delta)),
                 "delta_sum": float(sum(d.sum() for d in delta)),
                 "samples": len(batch), "response_len_mean": sum(map(len, batch.response_ids)) / len(batch),
                 "threads": torch.get_num_threads(), "peak_rss_mb": peak_rss_mb(),
                 "malloc_env": {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="m24_64x2_t256")
    ap.add_argument("--roots", default=".", help="comma list of checkouts to time (first = after)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--batch", type=Path, help="saved batch (default bench/out/update_batch_<shape>.pt)")
    ap.add_argument("--label", default="run")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        {"prep": child_prep, "update": child_update}[args.child[0]](json.loads(args.child[1]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.batch or args.out / f"update_batch_{args.shape}.pt"
    me = str(Path(__file__).resolve())
    base = {"threads": args.threads, "mbt": args.micro_batch_tokens, "path": str(path), "shape": args.shape}
    if not path.exists():
        from vs_trl import SHAPES, DEFAULT_SPEC

        dirs = run_child([str(Path(__file__).with_name("vs_trl.py")), "--child", "prep",
                          json.dumps({"threads": args.threads, "need": [SHAPES[args.shape][0]]})], args.timeout)
        model = SHAPES[args.shape][0]
        prep = {**base, "model_dir": dirs.get(model, model), "spec": str(DEFAULT_SPEC)}
        print(run_child([me, "--child", "prep", json.dumps(prep)], args.timeout), file=sys.stderr)
    rows = []
    for root in args.roots.split(","):
        root = str((REPO / root).resolve()) if not Path(root).is_absolute() else root
        res = run_child([me, "--child", "update", json.dumps({**base, "root": root, "reps": args.reps})],
                        args.timeout, env={"OMP_NUM_THREADS": str(args.threads)})
        rows.append(res)
    cols = ["root", "update_s_median", "update_s_min", "micro_batches", "positions_run", "positions_real",
            "padding_share", "loss", "grad_norm", "delta_abs_sum", "peak_rss_mb"]
    print_table(rows, cols, digits=6)
    (args.out / f"update_padding_{args.label}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
