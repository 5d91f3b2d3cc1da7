"""The step's roofline: each phase of one trainer step against its bound on this machine.

One fresh process per shape runs the trainer's own code (`build_run` + `run_step`, HF engine,
one torch thread) and times the phases of one step from the outside:
  prefill     the engine model's forwards with more than one new position (`engine.generate`)
  decode      the rest of `engine.generate`: the one-token forwards, sampling, the loop
  logprob_fwd the update (`trainer.step.train_on_batch`) minus its backwards and optimizer
  backward    every `Tensor.backward` inside the update
  fwd+bwd     the two above together (work a change moves from one to the other still counts)
  optimizer   `optimizer.step` (+ the gradient norm and clipping, `_clip_grad_norm`)
  weight_sync `engine.sync_weights` (in one process the HF engine generates with the policy
              itself: nothing is copied, 0 s)
The bounds are measured by the same script, same thread count: the fp32 matmul rate (best
torch.mm of a few shapes, GFLOP/s) and the copy bandwidth (a 256 MiB tensor copy, bytes read +
written per second), once at the start and in each shape's process just before and after its
step; a shape's bounds are the best of the three (the cores are shared: a probe that ran while
others loaded them would make a phase look faster than its bound). Each phase's bound is max(FLOPs / rate, bytes / bandwidth):
  forward FLOPs   2 x body weights (no embedding) x positions run + 2 x V x H per projected
                  position + attention 4 x layers x q_dim x (new x keys - new^2 / 2)
  backward FLOPs  2 x the forward's (the ideal; recomputation is not counted)
  decode bytes    per decode forward: body + head weights, plus the keys/values read
                  (rows x key length x `kv_bytes_per_token`)
  optimizer bytes AdamW's 28 bytes per parameter (read weight, grad, m, v; write weight, m, v),
                  plus 4 for the gradient norm's read
  sync bytes      2 x the weights' bytes when a copy is made
The optimizer state is created before the measured step (one AdamW step at lr 0 on zero
gradients), so the measured step's optimizer is a steady-state one. `--root DIR` runs another
checkout's trainer (a before/after with this venv).

    .venv/bin/python bench/roofline.py [--shapes tiny512,m24_64x2_t256] [--root DIR] [--label after]

Prints the table; writes bench/out/roofline.json (one entry per label; `--json` for another file).
`--head-split head,update` runs the v150k update split instead (bench/roofline_head.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_SPEC, OUT, emit_result, run_child  # noqa: E402

PHASES = ("prefill", "decode", "logprob_fwd", "backward", "fwd+bwd", "optimizer", "weight_sync")


def _use_root(root: str | None) -> None:
    """Import the trainer from `root` (a before/after checkout) instead of this one."""
    if not root:
        return
    sys.path.insert(0, root)
    for name in [m for m in sys.modules if m == "trainer" or m.startswith("trainer.")]:
        del sys.modules[name]
    import trainer

    assert Path(trainer.__file__).resolve().is_relative_to(Path(root).resolve()), trainer.__file__


def child_bounds(cfg: dict) -> None:
    emit_result(measure_bounds(cfg["threads"]))


def measure_bounds(threads: int) -> dict:
    """The fp32 matmul rate (best of 5 per shape) and the copy bandwidth (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    rates = {}
    for m, k, n in ((4096, 512, 1536), (4096, 1536, 512), (2048, 2048, 2048)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        rates[f"{m}x{k}x{n}"] = max(2 * m * k * n / _time(lambda: torch.mm(a, b)) / 1e9 for _ in range(5))
    src = torch.randn(64 * 2**20)  # 256 MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    bw = max(2 * src.numel() * 4 / _time(lambda: dst.copy_(src)) / 1e9 for _ in range(5))
    return {"matmul_gflops": max(rates.values()), "matmul": rates, "copy_gbs": bw, "threads": torch.get_num_threads()}


def best_bounds(*measured: dict) -> dict:
    """The best of several measurements: the machine's rate is its best moment (the 2 cores are
    shared, so any one probe may run while others load them)."""
    return {"matmul_gflops": max(b["matmul_gflops"] for b in measured),
            "copy_gbs": max(b["copy_gbs"] for b in measured), "threads": measured[0]["threads"]}


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _model_sizes(model) -> dict:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head = model.get_output_embeddings()
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    emb = sum(p.numel() for p in body.get_input_embeddings().parameters())
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    return {"p_body": sum(p.numel() for p in body.parameters()) - emb, "p_head": head.weight.numel(),
            "p_all": sum(p.numel() for p in model.parameters()), "vocab": head.weight.shape[0],
            "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers, "q_dim": heads * head_dim,
            "kv_bytes_per_token": 2 * cfg.num_hidden_layers * kv * head_dim * 4}


class PhaseClock:
    """Times and counts the phases of one step (see the module docstring)."""

    def __init__(self, run) -> None:
        import torch

        self.where, self.on = None, False
        self.t = dict.fromkeys(("generate", "prefill", "decode_fwd", "update", "backward", "optimizer",
                                "weight_sync"), 0.0)
        self.n = dict.fromkeys(("prefill_calls", "prefill_positions", "prefill_rows", "prefill_attn_flops",
                                "decode_steps", "decode_rows", "decode_kv_positions", "decode_attn_flops",
                                "update_positions", "update_forwards", "head_positions", "update_attn_flops",
                                "backwards", "optimizer_steps", "sync_copied"), 0)
        self.sizes = _model_sizes(run.policy)
        self._start = {}
        model = run.engine.model
        body = run.policy.get_decoder() if hasattr(run.policy, "get_decoder") else run.policy.model
        model.register_forward_pre_hook(self._gen_pre, with_kwargs=True)
        model.register_forward_hook(self._gen_post, with_kwargs=True)
        body.register_forward_pre_hook(self._body_pre, with_kwargs=True)
        self._plain_backward = torch.Tensor.backward

    def _gen_pre(self, _mod, args, kwargs) -> None:
        if self.on and self.where == "generate":
            self._start["fwd"] = time.perf_counter()

    def _gen_post(self, _mod, args, kwargs, _out) -> None:
        if not (self.on and self.where == "generate"):
            return
        dt = time.perf_counter() - self._start.pop("fwd")
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        rows, new = ids.shape[0], ids.shape[1]
        keys = mask.shape[-1] if mask is not None else new
        s = self.sizes
        attn = 4 * s["layers"] * s["q_dim"] * rows * (new * keys - new * new / 2)
        if new > 1:
            real = int(mask[:, -new:].sum()) if mask is not None and mask.dim() == 2 else ids.numel()
            self.t["prefill"] += dt
            self.n["prefill_calls"] += 1
            self.n["prefill_positions"] += real
            self.n["prefill_rows"] += rows
            self.n["prefill_attn_flops"] += attn
        else:
            self.t["decode_fwd"] += dt
            self.n["decode_steps"] += 1
            self.n["decode_rows"] += rows
            self.n["decode_kv_positions"] += rows * keys
            self.n["decode_attn_flops"] += attn

    def _body_pre(self, _mod, args, kwargs) -> None:
        if not (self.on and self.where == "update"):
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        mask = kwargs.get("attention_mask")
        real = int(mask[:, -ids.shape[1]:].sum()) if mask is not None and mask.dim() == 2 else ids.numel()
        self.n["update_positions"] += real
        self.n["update_forwards"] += 1

    def wrap(self, run, step_mod) -> None:
        import torch

        clock, plain_generate, plain_update = self, run.engine.generate, step_mod.train_on_batch
        plain_sync, plain_opt = run.engine.sync_weights, run.optimizer.step

        def timed(key, fn, where=None):
            def inner(*a, **k):
                prev, t = clock.where, time.perf_counter()
                clock.where = where or prev
                try:
                    return fn(*a, **k)
                finally:
                    if clock.on:
                        clock.t[key] += time.perf_counter() - t
                    clock.where = prev
            return inner

        def update(run_, batch, *a, **k):
            if clock.on:
                s = clock.sizes
                clock.n["head_positions"] += sum(batch.model_lengths())
                clock.n["update_attn_flops"] += sum(2 * s["layers"] * s["q_dim"] * (len(p) + len(r)) ** 2
                                                    for p, r in zip(batch.prompt_ids, batch.response_ids))
            return timed("update", plain_update, "update")(run_, batch, *a, **k)

        def backward(tensor, *a, **k):
            if clock.on and clock.where == "update":
                clock.n["backwards"] += 1
                return timed("backward", clock._plain_backward)(tensor, *a, **k)
            return clock._plain_backward(tensor, *a, **k)

        def opt_step(*a, **k):
            clock.n["optimizer_steps"] += clock.on
            return timed("optimizer", plain_opt)(*a, **k)

        def sync(model):
            clock.n["sync_copied"] += clock.on and model is not run.engine.model
            return timed("weight_sync", plain_sync)(model)

        run.engine.generate = timed("generate", plain_generate, "generate")
        step_mod.train_on_batch = update
        torch.Tensor.backward = backward
        run.optimizer.step = opt_step
        run.engine.sync_weights = sync
        import trainer.optim.update as upd

        if hasattr(upd, "_clip_grad_norm"):  # the gradient norm: part of the optimizer phase
            upd._clip_grad_norm = timed("optimizer", upd._clip_grad_norm)


def _warm_optimizer(run) -> None:
    """Create AdamW's state before the measured step: one step at lr 0 on zero gradients
    (decoupled weight decay is lr x wd: nothing moves)."""
    import torch

    lrs = [g["lr"] for g in run.optimizer.param_groups]
    params = [p for g in run.optimizer.param_groups for p in g["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    for g in run.optimizer.param_groups:
        g["lr"] = 0.0
    before = [p.detach().clone() for p in params[:3]]
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    assert all(torch.equal(a, p) for a, p in zip(before, params[:3]))
    for g, lr in zip(run.optimizer.param_groups, lrs):
        g["lr"] = lr


def child_phases(cfg: dict) -> None:
    import torch

    from vs_trl import spec_for

    _use_root(cfg["root"])
    import trainer.step as step_mod
    from trainer.run import build_run

    torch.set_num_threads(cfg["threads"])
    spec = spec_for({**cfg, "steps": 1})
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(spec, Path(tmp), None, None)
        torch.set_num_threads(cfg["threads"])
        clock = PhaseClock(run)
        clock.wrap(run, step_mod)
        for s in range(cfg["warmup"]):
            step_mod.run_step(run, run.plans[0], s)
        _warm_optimizer(run)
        before = measure_bounds(cfg["threads"])  # the bounds just before and after the step, same process
        clock.on = True
        m = step_mod.run_step(run, run.plans[0], cfg["warmup"])
        clock.on = False
        after = measure_bounds(cfg["threads"])
        run.close()
    emit_result({"bounds_around": [before, after], "t": clock.t, "n": clock.n, "sizes": clock.sizes, "step_s": m["step_s"],
                 "samples": m["samples"], "response_len_mean": m["response_len_mean"],
                 "threads": torch.get_num_threads(), "trainer": str(Path(step_mod.__file__).parents[1])})


def child_decode_mm(cfg: dict) -> None:
    """The weight matmuls of one decode step alone: every Linear of the model (and the head)
    on `rows` random rows, best of 5 each, summed: how much of a decode step is matmul."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(cfg["threads"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model_dir"], dtype=torch.float32).eval()
    total = 0.0
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                x = torch.randn(cfg["rows"], mod.in_features)
                mod(x)
                total += min(_time(lambda: mod(x)) for _ in range(5))
    emit_result({"rows": cfg["rows"], "matmul_ms": 1e3 * total})


def roofline(res: dict, bounds: dict) -> dict[str, dict]:
    """Each phase's time, bound (seconds) and what bounds it."""
    t, n, s = res["t"], res["n"], res["sizes"]
    rate, bw = bounds["matmul_gflops"] * 1e9, bounds["copy_gbs"] * 1e9
    wbytes = 4 * (s["p_body"] + s["p_head"])

    def bound(flops: float, nbytes: float) -> tuple[float, str]:
        return max((flops / rate, "compute"), (nbytes / bw, "memory"))

    fwd = 2 * s["p_body"] * n["update_positions"] + 2 * s["p_head"] * n["head_positions"] + n["update_attn_flops"]
    upd_rest = t["update"] - t["backward"] - t["optimizer"]
    phases = {
        "prefill": (t["prefill"], *bound(2 * s["p_body"] * n["prefill_positions"] + 2 * s["p_head"] * n["prefill_rows"]
                                        + n["prefill_attn_flops"], wbytes * n["prefill_calls"])),
        "decode": (t["generate"] - t["prefill"],
                   *bound(2 * (s["p_body"] + s["p_head"]) * n["decode_rows"] + n["decode_attn_flops"],
                          wbytes * n["decode_steps"] + s["kv_bytes_per_token"] * n["decode_kv_positions"])),
        "logprob_fwd": (upd_rest, *bound(fwd, wbytes * n["update_forwards"])),
        "backward": (t["backward"], *bound(2 * fwd, 2 * wbytes * n["backwards"])),
        # The two together: where work moves between them (a head gradient taken in the
        # forward), the sum still compares.
        "fwd+bwd": (upd_rest + t["backward"], *bound(3 * fwd, wbytes * (n["update_forwards"] + 2 * n["backwards"]))),
        "optimizer": (t["optimizer"], *bound(0.0, 32 * s["p_all"] * n["optimizer_steps"])),
        "weight_sync": (t["weight_sync"], *bound(0.0, 8 * s["p_all"] * n["sync_copied"])),
    }
    if not n["sync_copied"]:  # one process: the engine generates with the policy, nothing to copy
        phases["weight_sync"] = (t["weight_sync"], 0.0, "none: no copy")
    out = {}
    for name, (sec, bsec, kind) in phases.items():
        out[name] = {"s": sec, "bound_s": bsec, "bound": kind,
                     "pct_of_bound": 100 * bsec / sec if sec > 0 and bsec > 0 else None}
    if n["decode_steps"]:
        out["decode"]["per_step_ms"] = 1e3 * out["decode"]["s"] / n["decode_steps"]
        out["decode"]["forward_per_step_ms"] = 1e3 * t["decode_fwd"] / n["decode_steps"]
        out["decode"]["bound_per_step_ms"] = 1e3 * out["decode"]["bound_s"] / n["decode_steps"]
        out["decode"]["rows_per_step"] = n["decode_rows"] / n["decode_steps"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="tiny512,m24_64x2_t256")
    ap.add_argument("--root", default=None, help="checkout whose trainer runs (default: this one)")
    ap.add_argument("--label", default="run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=0, help="steps run before the measured one")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--head-split", default="", metavar="PARTS",
                    help="instead of the shapes: the v150k update split (bench/roofline_head.py), parts head,update")
    ap.add_argument("--head-positions", type=int, default=1764, help="--head-split head: positions (4 slices)")
    ap.add_argument("--update-samples", type=int, default=8, help="--head-split update: samples of the v150k update")
    ap.add_argument("--json", type=Path, default=OUT / "roofline.json", help="results file (one key per label)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, cfg = args.child
        from roofline_head import child_head_split, child_update_split

        {"bounds": child_bounds, "phases": child_phases, "decode_mm": child_decode_mm,
         "head_split": child_head_split, "update_split": child_update_split}[kind](json.loads(cfg))
        return
    if args.head_split:
        from roofline_head import head_split

        return head_split(args, __file__)
    from vs_trl import SHAPES, launch

    env = {"OMP_NUM_THREADS": str(args.threads), "BRORL_TORCH_THREADS": str(args.threads)}
    base = {"spec": str(DEFAULT_SPEC), "threads": args.threads, "mbt": args.micro_batch_tokens,
            "warmup": args.warmup, "root": args.root}
    shapes = args.shapes.split(",")
    dirs = launch("prep", {**base, "steps": 1, "profile": False, "need": sorted({SHAPES[s][0] for s in shapes})}, 3600)
    child = lambda kind, cfg: run_child([__file__, "--child", kind, json.dumps(cfg)], timeout=3600, env=env)  # noqa: E731
    bounds = child("bounds", base)
    print(f"bounds: fp32 matmul {bounds['matmul_gflops']:.1f} GFLOP/s, copy {bounds['copy_gbs']:.1f} GB/s", flush=True)
    result = {"label": args.label, "root": args.root, "bounds": bounds, "load_before": os.getloadavg()[0], "shapes": {}}
    for shape in shapes:
        model, n, prompts, max_new, _, mbt = SHAPES[shape]
        cfg = {**base, "model": model, "model_dir": dirs[model], "n": n, "prompts": prompts, "max_new": max_new,
               "mbt": mbt or args.micro_batch_tokens}
        res = child("phases", cfg)
        res["bounds"] = best_bounds(bounds, *res["bounds_around"])
        res["phases"] = roofline(res, res["bounds"])
        if res["n"]["decode_steps"]:
            rows = round(res["n"]["decode_rows"] / res["n"]["decode_steps"])
            res["phases"]["decode"]["matmul_per_step_ms"] = child(
                "decode_mm", {"threads": args.threads, "model_dir": dirs[model], "rows": rows})["matmul_ms"]
        result["shapes"][shape] = res
        print(f"{shape}: step {res['step_s']:.1f} s, mean response {res['response_len_mean']:.0f}", flush=True)
    result["load_after"] = os.getloadavg()[0]
    print(table(result))
    _save(args.json, args.label, result)


def _save(path: Path, label: str, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[label] = result
    path.write_text(json.dumps(saved, indent=1))
    print(f"wrote {path} ({label})")


def table(result: dict) -> str:
    out = [f"{result['label']}: {result['bounds']['threads']} thread(s); bounds (best of 3 probes) "
           + ", ".join(f"{shape} {r['bounds']['matmul_gflops']:.1f} GFLOP/s, {r['bounds']['copy_gbs']:.1f} GB/s"
                       for shape, r in result["shapes"].items()), "",
           "| shape | phase | time s | bound s (by) | % of bound |", "| --- | --- | --- | --- | --- |"]
    for shape, res in result["shapes"].items():
        for name in PHASES:
            p = res["phases"][name]
            pct = f"{p['pct_of_bound']:.0f} %" if p["pct_of_bound"] is not None else "-"
            out.append(f"| {shape} | {name} | {p['s']:.2f} | {p['bound_s']:.2f} ({p['bound']}) | {pct} |")
    for shape, res in result["shapes"].items():
        d = res["phases"]["decode"]
        if "per_step_ms" in d:
            out.append(f"\n{shape} decode: {res['n']['decode_steps']} steps of {d['rows_per_step']:.0f} rows on "
                       f"average, {d['per_step_ms']:.1f} ms per step, of which the model's forward "
                       f"{d['forward_per_step_ms']:.1f} ms (its weight matmuls alone, on as many rows: "
                       f"{d.get('matmul_per_step_ms', float('nan')):.1f} ms); bound {d['bound_per_step_ms']:.2f} ms per step")
    return "\n".join(out)


if __name__ == "__main__":
    main()
