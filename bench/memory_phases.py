"""Where the memory goes at long responses: peak RSS per phase of a step, in fresh processes.

Why RSS and not torch's allocator: on the CPU torch keeps no allocation statistics. Each child
runs with `MALLOC_MMAP_THRESHOLD_` fixed at 64 KiB, so every tensor above that is its own
mapping and goes back to the OS when freed: the RSS then follows the live tensors, and a
thread that reads /proc/self/statm every 2 ms gives each phase's peak. `--ops` adds the
torch.profiler's top allocating ops of the update (self CPU memory, allocations minus frees).

Modes (`--mode`):
  step    one trainer step (`build_run` + `run_step`) on a `bench/vs_trl.py` shape, after
          `--warmup` steps (1): RSS with the model loaded, then the peak above it in generation
          (`engine.generate`), in the update (`trainer.step.train_on_batch`: old log-probs when
          needed, the PPO micro-batches, the optimizer step) and in the rest (scoring, ...).
  prompt  one `ppo_update` of the 24 M model (random weights, the character vocabulary, or
          `--vocab`) on one 2,000-token prompt x 64 samples of 24 tokens, 4,096-token
          micro-batches: the shared-prompt forward against the plain one (8 samples: its peak
          is one micro-batch of two 2,024-token sequences whatever N).

`--root DIR` runs the trainer of another checkout (e.g. /work/main): before and after in one
script. Results: printed, and bench/out/memory_<label>.json.

    .venv/bin/python bench/memory_phases.py --mode step --shapes m24_64x2_t256 --label after
    .venv/bin/python bench/memory_phases.py --mode prompt --root /work/main --label before
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, emit_result, run_child  # noqa: E402

MMAP_THRESHOLD = "65536"


class RssSampler:
    """Peak RSS (MiB) per named phase, from a thread reading /proc/self/statm."""

    def __init__(self, every_s: float = 0.002) -> None:
        self.phase, self.peaks, self.every = "start", {}, every_s
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            r = self.rss()
            if r > self.peaks.get(self.phase, 0.0):
                self.peaks[self.phase] = r
            time.sleep(self.every)

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), self.rss())

    def close(self) -> dict:
        self._stop.set()
        self._thread.join()
        return dict(self.peaks)


def _use_root(root: str | None) -> None:
    if root:
        sys.path.insert(0, root)
    import trainer

    print(f"trainer from {Path(trainer.__file__).parent}", file=sys.stderr, flush=True)


def child_step(cfg: dict) -> None:
    import torch

    _use_root(cfg["root"])
    import trainer.step as step_mod
    from trainer.run import build_run
    from vs_trl import spec_for

    torch.set_num_threads(cfg["threads"])
    spec = spec_for({**cfg, "warmup": cfg["warmup"], "steps": 1})
    sampler = RssSampler()
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(spec, Path(tmp), None, None)
        torch.set_num_threads(cfg["threads"])
        plain_update, plain_generate, ops = step_mod.train_on_batch, run.engine.generate, {}

        def update(*a, **k):
            sampler.enter("update")
            prof = None
            if cfg["ops"] and cfg["measuring"]:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                              profile_memory=True)
                prof.__enter__()
            try:
                return plain_update(*a, **k)
            finally:
                if prof is not None:
                    prof.__exit__(None, None, None)
                    ops["table"] = prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=12)
                sampler.enter("rest")

        def generate(*a, **k):
            sampler.enter("generation")
            try:
                return plain_generate(*a, **k)
            finally:
                sampler.enter("rest")

        step_mod.train_on_batch, run.engine.generate = update, generate
        cfg["measuring"] = False
        for s in range(cfg["warmup"]):  # lazy inits, optimizer state
            step_mod.run_step(run, run.plans[0], s)
        sampler.peaks.clear()
        sampler.enter("loaded")
        base = sampler.rss()
        cfg["measuring"] = True
        m = step_mod.run_step(run, run.plans[0], cfg["warmup"])
        run.close()
    peaks = sampler.close()
    emit_result({"baseline_mb": base, "peaks_mb": peaks,
                 "above_baseline_mb": {k: v - base for k, v in peaks.items()},
                 "response_len_mean": m["response_len_mean"], "samples": m["samples"],
                 "ops": ops.get("table")})


def child_prompt(cfg: dict) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _use_root(cfg["root"])
    from trainer.models.tiny import SIZES, VOCAB
    from trainer.optim.update import UpdateConfig, ppo_update
    from trainer.rollouts import Rollouts

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=cfg["vocab"] or len(VOCAB), tie_word_embeddings=True,
                                         **SIZES["25m"])).float().train()
    g = torch.Generator().manual_seed(0)
    n, plen, rlen = cfg["n"], cfg["prompt_len"], 24
    prompt = torch.randint(1, 90, (plen,), generator=g).tolist()
    responses = [torch.randint(1, 90, (rlen,), generator=g).tolist() for _ in range(n)]
    batch = Rollouts(prompt_ids=[prompt] * n, response_ids=responses,
                     engine_logprobs=[[-4.0] * rlen for _ in range(n)], group=torch.zeros(n, dtype=torch.long),
                     rewards=torch.zeros(n), truncated=torch.zeros(n, dtype=torch.bool),
                     advantages=torch.randn(n, generator=g))
    ucfg = UpdateConfig(kl_coef=0.0, shared_prefix=cfg["shared"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    sampler = RssSampler()
    sampler.enter("loaded")
    base = sampler.rss()
    sampler.enter("update")
    t = time.perf_counter()
    stats = ppo_update(model, opt, batch, None, None, ucfg, cfg["mbt"])
    sec = time.perf_counter() - t
    peaks = sampler.close()
    emit_result({"baseline_mb": base, "update_peak_above_mb": peaks["update"] - base, "update_s": sec,
                 "loss": stats["loss"], "grad_norm": stats["grad_norm"]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("step", "prompt"), default="step")
    ap.add_argument("--shapes", default="m24_64x2_t256")
    ap.add_argument("--root", default=None, help="checkout whose trainer runs (default: this one)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=0, help="prompt mode: vocabulary size (0: the character one)")
    ap.add_argument("--ops", action="store_true", help="step mode: the profiler's top allocating ops")
    ap.add_argument("--label", default="run")
    ap.add_argument("--warmup", type=int, default=1, help="step mode: steps run before the measured one "
                    "(0: the measured step also allocates the optimizer state)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, cfg = args.child
        {"step": child_step, "prompt": child_prompt}[kind](json.loads(cfg))
        return
    env = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "OMP_NUM_THREADS": str(args.threads)}
    base = {"root": args.root, "threads": args.threads, "ops": args.ops, "warmup": args.warmup}
    results = {}
    if args.mode == "prompt":
        for shared in (True, False):
            # The plain forward's peak is one chunk's (2 sequences of 2,024 tokens): 8 samples show it.
            cfg = {**base, "shared": shared, "n": 64 if shared else 8, "prompt_len": 2000,
                   "mbt": args.micro_batch_tokens,
                   "vocab": args.vocab}
            results["shared" if shared else "plain"] = run_child([__file__, "--child", "prompt", json.dumps(cfg)],
                                                                 timeout=3600, env=env)
            print(args.label, "shared" if shared else "plain", results["shared" if shared else "plain"])
    else:
        from vs_trl import SHAPES, launch

        dirs = launch("prep", {"spec": str(_spec()), "threads": args.threads, "mbt": args.micro_batch_tokens,
                               "warmup": 0, "steps": 1, "profile": False,
                               "need": sorted({SHAPES[s][0] for s in args.shapes.split(",")})}, 3600)
        for shape in args.shapes.split(","):
            model, n, prompts, max_new, _, mbt = SHAPES[shape]
            cfg = {**base, "spec": str(_spec()), "model": model, "model_dir": dirs[model], "n": n,
                   "prompts": prompts, "max_new": max_new, "mbt": mbt or args.micro_batch_tokens}
            res = run_child([__file__, "--child", "step", json.dumps(cfg)], timeout=3600, env=env)
            results[shape] = res
            print(f"{args.label} {shape}: baseline {res['baseline_mb']:.0f} MiB, above it: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in res["above_baseline_mb"].items())
                  + f" (mean response {res['response_len_mean']:.0f})")
            if res.get("ops"):
                print(res["ops"])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"memory_{args.label}.json").write_text(json.dumps({"mode": args.mode, "root": args.root,
                                                               "results": results}, indent=1))


def _spec() -> Path:
    from common import DEFAULT_SPEC

    return DEFAULT_SPEC


if __name__ == "__main__":
    main()
