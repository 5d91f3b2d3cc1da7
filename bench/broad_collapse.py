"""Why a broad stage after a narrow one lost held-out pass@1 (docs/results.md, section 6a).

The issue's spec: builtin:tiny on the demo's task, N = 16 x 16 prompts for 40 steps, then
N = 128 x 4 prompts for 20 steps, lr 1e-4 (sqrt rule), 4 PPO mini-batches. Here the narrow stage
runs once (`narrow`, checkpoint at its end); every variant then continues from that checkpoint
(fresh optimizer, as a new job) for `--steps` steps, changing one thing at a time:

    control   N = 16 x 16, lr 1e-4              (more of the narrow stage)
    repro     N = 128 x 4, lr 1.41e-4           (the issue's broad stage: sqrt(512/256))
    lr_flat   N = 128 x 4, lr 1e-4              (no lr growth)
    one_mb    N = 128 x 4, lr 1.41e-4, 1 mini-batch
    p16       N = 32 x 16, lr 1.41e-4           (same samples and lr as repro, 4x the prompts)
    lr_half   N = 128 x 4, lr 5e-5

    .venv/bin/python bench/broad_collapse.py [--variants a,b] [--seeds 0,1] [--steps 20]

Writes bench/out/broad_collapse/results.csv (one row per eval) and prints the table of
pass@1 start -> end per variant and seed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_SPEC, OUT, REPO, print_table, run_child, write_csv  # noqa: E402

NARROW = {"n": 16, "prompts_per_step": 16}
VARIANTS = {
    "control": ({"n": 16, "prompts_per_step": 16}, {"lr": 1e-4}, {}),
    "repro": ({"n": 128, "prompts_per_step": 4}, {"lr": 1.41421356e-4}, {}),
    "lr_flat": ({"n": 128, "prompts_per_step": 4}, {"lr": 1e-4}, {}),
    "one_mb": ({"n": 128, "prompts_per_step": 4}, {"lr": 1.41421356e-4}, {"mini_batches": 1}),
    "p16": ({"n": 32, "prompts_per_step": 16}, {"lr": 1.41421356e-4}, {}),
    "lr_half": ({"n": 128, "prompts_per_step": 4}, {"lr": 5e-5}, {}),
}


def launch(over: dict, out_dir: Path, threads: int, timeout: float) -> dict:
    cfg = {"spec": str(DEFAULT_SPEC), "over": over, "stop": {"kind": "budget", "budget": 10**12},
           "out_dir": str(out_dir), "threads": threads}
    env = {"OMP_NUM_THREADS": str(threads)}
    return run_child([str(REPO / "bench" / "replicate.py"), "--child", json.dumps(cfg)], timeout, env)


def base_over(seed: int) -> dict:
    # The issue's shape: 4 PPO mini-batches (the spec default), demo task and eval otherwise.
    return {"seed": seed, "algo": {"mini_batches": 4}, "checkpoint": {"every": 0, "keep_last": 1}}


def narrow(args) -> str:
    ck = args.narrow_dir or args.out / "narrow"
    found = sorted((ck / "checkpoints").glob("step-*")) if ck.exists() else []
    if found:
        return str(found[-1].resolve())
    over = base_over(0) | {"rollout": {"schedule": [{**NARROW, "steps": args.narrow_steps}]},
                           "eval": {"every": 10}}
    res = launch(over, ck, args.threads, args.timeout)
    ev = [r for r in res["rows"] if "eval/pass@1" in r]
    print("narrow: pass@1 " + " -> ".join(f"{e['eval/pass@1']:.3f}" for e in ev), flush=True)
    (args.out / "narrow.json").write_text(json.dumps(ev, indent=1))
    return res["checkpoint"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--narrow-steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=OUT / "broad_collapse")
    ap.add_argument("--narrow-dir", type=Path, default=None, help="reuse this narrow run (default OUT/narrow)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = narrow(args)
    rows, table = [], []
    csv_path = args.out / "results.csv"
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in args.variants.split(","):
            stage, optim, algo = VARIANTS[name]
            over = base_over(seed)
            over["algo"].update(algo)
            over |= {"model": {"path": ckpt}, "optim": optim, "eval": {"every": 10},
                     "rollout": {"schedule": [{**stage, "steps": args.steps}]}}
            res = launch(over, args.out / f"{name}-s{seed}", args.threads, args.timeout)
            steps = [r for r in res["rows"] if r["step"] > 0]
            ev = [r for r in res["rows"] if "eval/pass@1" in r]
            mean = lambda k: sum(float(r.get(k) or 0) for r in steps) / len(steps)  # noqa: E731
            row = {"variant": name, "seed": seed, "n": stage["n"], "prompts": stage["prompts_per_step"],
                   "lr": optim["lr"], "mini_batches": over["algo"]["mini_batches"],
                   "pass@1 start": ev[0]["eval/pass@1"], "pass@1 end": ev[-1]["eval/pass@1"],
                   "pass@16 end": ev[-1].get("eval/pass@16"), "clip low": mean("pg_clipfrac_low"),
                   "clip high": mean("pg_clipfrac_high"), "kl": mean("kl"), "grad_norm": mean("grad_norm"),
                   "is_trunc": mean("is_truncated_frac"), "keep": mean("keep_rate"),
                   "train_s": sum(float(r.get("step_s") or 0) for r in steps)}
            table.append(row)
            rows += [{"variant": name, "seed": seed, **{k: v for k, v in e.items() if k == "step" or k.startswith("eval/")}}
                     for e in ev]
            print(json.dumps(row), flush=True)
            write_csv(csv_path, rows)
            write_csv(args.out / "summary.csv", table)
    print_table(table, list(table[0]), 4)


if __name__ == "__main__":
    main()
