"""Full trainer steps (generate, score, update, sync) as N grows, at equal samples per step.

BroRL's systems claims at the level of a whole RL step: with the same number of samples per
step, many rollouts of few prompts (N = 512) should be at least as fast as few rollouts of many
prompts (N = 16), and, with micro-batched forward/backward, peak memory should not grow with N
(the target: peak RSS at N = 512 within 1.3x of N = 16 at the same micro-batch).

For each engine (`--engine hf|vllm|both`) and each N in `--ns` (default 16, 64, 256, 512) a
*fresh subprocess* builds the run with the trainer's own `build_run` and runs `--warmup` + `--steps`
steps with `run_step` on `builtin:tiny`: `--samples` samples per step (prompts = samples / N),
`algo.micro_batch_tokens` fixed at `--micro-batch-tokens`. A fresh process per configuration
because ru_maxrss is a process-lifetime peak (and vLLM-CPU binds threads and memory per process).
Reported per configuration: samples/s (samples / step_s) and the split of step_s into
gen / score / train / sync, averaged over the measured steps (the warm-up step is dropped); the
peak RSS after building the run and after the steps. Ratios (N / N = 16) come from the same
script run, since the 2 CPU cores are shared and absolute timings drift.

Everything else comes from the base spec (`--spec`, default examples/demo.yaml: its task, model,
lr, mini-batches, KL...), with these overrides: a single schedule stage (n = N), dynamic
sampling OFF so that every step updates on exactly `--samples` samples (with it on, a step's
sample count would depend on how many groups are all-correct / all-wrong), and eval off.
Peak RSS is the trainer process's own: the scorer's worker processes are not included.

Threads: each measured process runs torch with `--threads` (default 1). On the 2 shared cores
this project has, two OpenMP threads spin-wait against other engineers' processes: a 256-sample
step measured 4.7 s with 1 thread and 28-55 s with 2 under a load of ~4.7 (same script, same
minute). `--threads 0` keeps torch's default.

    .venv/bin/python bench/step.py [--quick] [--engine hf|vllm|both] [--spec examples/demo.yaml]

Writes bench/out/step.csv (one row per measured step), bench/out/step_rss.csv (one row per
configuration) and bench/out/step.png; prints both tables and the N = 512 / N = 16 ratios.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DEFAULT_SPEC, OUT, current_rss_mb, emit_result, load_base, make_spec,  # noqa: E402
                    mean_spread, peak_rss_mb, print_table, pyplot, run_child, write_csv)

SPLIT = ("gen_s", "score_s", "train_s", "weight_sync_s")
STEP_KEYS = SPLIT + ("step_s", "samples_per_s", "tokens_per_s", "samples", "response_len_mean", "pass_rate",
                     "truncated_frac", "peak_mem_mb")


def overrides(engine: str, n: int, samples: int, steps: int, mbt: int, max_new_tokens: int | None) -> dict:
    """What the benchmark changes in the base spec (see the module docstring for why)."""
    rollout = {"engine": engine,
               "schedule": [{"n": n, "prompts_per_step": max(1, samples // n), "steps": max(1, steps)}]}
    if max_new_tokens:
        rollout["max_new_tokens"] = max_new_tokens
    return {"rollout": rollout,
            "algo": {"dynamic_sampling": False, "micro_batch_tokens": mbt},
            # One eval sample per prompt: build_run sizes vLLM's concurrency for eval too.
            "eval": {"every": 0, "samples_per_prompt": 1, "k": [1]},
            "checkpoint": {"every": 0}}


def child(cfg: dict) -> None:
    """Runs in the fresh subprocess: build the run, take the steps, print the tagged result."""
    from trainer.run import build_run
    from trainer.step import run_step

    import torch

    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    total = cfg["warmup"] + cfg["steps"]
    spec = make_spec(load_base(cfg["spec"]), overrides(cfg["engine"], cfg["n"], cfg["samples"], total,
                                                       cfg["mbt"], cfg.get("max_new_tokens")))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(spec, Path(tmp), None, None)
        build_s = time.perf_counter() - t0
        if cfg.get("threads"):  # again: vLLM-CPU's start-up sets its own thread count
            torch.set_num_threads(cfg["threads"])
        built = {"build_s": build_s, "threads": torch.get_num_threads(), "rss_built_mb": current_rss_mb(),
                 "peak_built_mb": peak_rss_mb(), "micro_batch_tokens": run.micro_batch_tokens}
        steps = []
        try:
            for s in range(total):
                m = run_step(run, run.plans[0], s)
                steps.append({"step": s, "warmup": s < cfg["warmup"], **{k: m[k] for k in STEP_KEYS}})
                print(f"  {cfg['engine']:4s} N={cfg['n']:4d} step {s}: {m['samples_per_s']:7.1f} samples/s "
                      f"(gen {m['gen_s']:.2f} score {m['score_s']:.2f} train {m['train_s']:.2f} "
                      f"sync {m['weight_sync_s']:.2f} s)", file=sys.stderr, flush=True)
        finally:
            run.close()
    emit_result({**built, "peak_rss_mb": peak_rss_mb(), "steps": steps})


def measure(args, engine: str, n: int) -> dict:
    cfg = {"spec": str(args.spec), "engine": engine, "n": n, "samples": args.samples, "warmup": args.warmup,
           "steps": args.steps, "mbt": args.micro_batch_tokens, "max_new_tokens": args.max_new_tokens,
           "threads": args.threads}
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None
    return run_child([__file__, "--child", json.dumps(cfg)], timeout=args.timeout, env=env)


def summarise(engine: str, n: int, samples: int, res: dict) -> dict:
    """One configuration: means over the measured (non-warm-up) steps."""
    measured = [s for s in res["steps"] if not s["warmup"]] or res["steps"]
    row = {"engine": engine, "n": n, "prompts": max(1, samples // n), "samples": samples,
           "steps": len(measured)}
    for k in SPLIT + ("step_s", "samples_per_s"):
        row[k] = mean_spread([s[k] for s in measured])["mean"]
    row["samples_per_s_std"] = mean_spread([s["samples_per_s"] for s in measured])["std"]
    for k in ("response_len_mean", "pass_rate", "truncated_frac"):  # what the model generated
        row[k] = mean_spread([s[k] for s in measured])["mean"]
    row.update(threads=res["threads"], micro_batch_tokens=res["micro_batch_tokens"],
               build_s=res["build_s"], rss_built_mb=res["rss_built_mb"], peak_built_mb=res["peak_built_mb"],
               peak_rss_mb=res["peak_rss_mb"],
               step_peak_over_built_mb=res["peak_rss_mb"] - res["peak_built_mb"])
    return row


def best(reps: list[dict]) -> dict:
    """The fastest repeat's timings (rollouts.py's convention on shared cores); the largest peak RSS."""
    row = dict(max(reps, key=lambda r: r["samples_per_s"]))
    row["repeats"] = len(reps)
    row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in reps)
    row["step_peak_over_built_mb"] = max(r["step_peak_over_built_mb"] for r in reps)
    return row


def add_ratios(rows: list[dict]) -> None:
    """samples/s and peak RSS of each N relative to N = 16 of the same engine (same script run)."""
    for r in rows:
        base = next((b for b in rows if b["engine"] == r["engine"] and b["n"] == 16), None)
        r["speed_vs_n16"] = r["samples_per_s"] / base["samples_per_s"] if base else float("nan")
        r["rss_vs_n16"] = r["peak_rss_mb"] / base["peak_rss_mb"] if base else float("nan")


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    labels = [f"{r['engine']} N={r['n']}" for r in rows]
    left = [0.0] * len(rows)
    for key, colour in zip(SPLIT, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        vals = [r[key] for r in rows]
        ax1.barh(labels, vals, left=left, color=colour, label=key.removesuffix("_s"))
        left = [a + b for a, b in zip(left, vals)]
    for i, r in enumerate(rows):
        ax1.text(left[i], i, f" {r['samples_per_s']:.0f}/s", va="center", fontsize=8)
    ax1.set_xlim(0, 1.18 * max(left))
    ax1.invert_yaxis()
    ax1.set_xlabel(f"seconds per step ({rows[0]['samples']} samples), mean of measured steps")
    ax1.set_title("Step time split (samples/s at bar end)")
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
    for engine in sorted({r["engine"] for r in rows}):
        pts = sorted((r["n"], r["peak_rss_mb"]) for r in rows if r["engine"] == engine)
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{engine}: peak RSS")
        ax2.axhline(1.3 * pts[0][1], ls=":", lw=1, color=ax2.lines[-1].get_color(),
                    label=f"{engine}: 1.3 x N={pts[0][0]}")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel(f"N ({rows[0]['samples']} samples/step, micro-batch {rows[0]['micro_batch_tokens']} tokens)")
    ax2.set_ylabel("peak RSS of the trainer process (MiB)")
    ax2.set_ylim(bottom=0)
    ax2.set_title("Peak RSS vs N")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 512 samples, N 16/512, 1 measured step")
    ap.add_argument("--engine", choices=["hf", "vllm", "both"], default="both")
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="base spec (task, model, lr, algo)")
    ap.add_argument("--ns", default="16,64,256,512")
    ap.add_argument("--samples", type=int, default=1024, help="samples per step, equal for every N")
    ap.add_argument("--warmup", type=int, default=1, help="steps run first and dropped")
    ap.add_argument("--steps", type=int, default=3, help="measured steps")
    ap.add_argument("--repeats", type=int, default=1, help="round-robin passes over the configurations")
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the base spec's")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per measured process; 0 = torch's default (= cores)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.ns, args.samples, args.steps = "16,512", 512, 1
    args.ns = [int(x) for x in args.ns.split(",")]
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    t0 = time.perf_counter()
    engines = ["hf", "vllm"] if args.engine == "both" else [args.engine]
    # Build (or find) the cached builtin:tiny model first, so no measured process pays for the
    # warm-start SFT (its memory would land in that process's peak RSS).
    prep = {"spec": str(args.spec), "engine": "hf", "n": 16, "samples": 16, "warmup": 0, "steps": 0,
            "mbt": args.micro_batch_tokens}
    run_child([__file__, "--child", json.dumps(prep)], timeout=args.timeout)
    results: dict[tuple[str, int], list[dict]] = {}
    step_rows = []
    # Round-robin over the configurations, `--repeats` times: load from other processes drifts
    # over minutes, and interleaving spreads it over all N instead of biasing the first one.
    for rep in range(args.repeats):
        for engine in engines:
            for n in args.ns:
                res = measure(args, engine, n)
                step_rows += [{"engine": engine, "n": n, "repeat": rep, **s} for s in res["steps"]]
                results.setdefault((engine, n), []).append(summarise(engine, n, args.samples, res))
    rows = [best(reps) for reps in results.values()]
    add_ratios(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "step.csv", step_rows)
    write_csv(args.out / "step_rss.csv", rows)
    plot(rows, args.out / "step.png")
    print(f"\nFull steps, {args.samples} samples/step, dynamic sampling off, mean of {args.steps} step(s) "
          f"after {args.warmup} warm-up, fastest of {args.repeats} repeat(s):")
    print_table(rows, ["engine", "n", "prompts", "samples_per_s", "speed_vs_n16", *SPLIT, "step_s",
                       "response_len_mean", "pass_rate"], 2)
    print(f"\nPeak RSS (trainer process, MiB), micro_batch_tokens = {args.micro_batch_tokens}:")
    print_table(rows, ["engine", "n", "rss_built_mb", "peak_built_mb", "peak_rss_mb",
                       "step_peak_over_built_mb", "rss_vs_n16"], 1)
    for engine in engines:
        hi = [r for r in rows if r["engine"] == engine and r["n"] == max(args.ns)]
        if hi and 16 in args.ns:
            r = hi[0]
            print(f"{engine}: N={r['n']} / N=16: samples/s {r['speed_vs_n16']:.2f}x, "
                  f"peak RSS {r['rss_vs_n16']:.2f}x (target <= 1.3x)")
    print(f"\nwrote {args.out / 'step.csv'}, {args.out / 'step_rss.csv'}, {args.out / 'step.png'} "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
