"""LoRA against full fine-tuning: the demo task's eval pass@1 curves from the same start.

    .venv/bin/python bench/lora_curves.py [--seeds 0,1] [--rank 16] [--lora-lr 1e-3] [--threads 1]

Each seed trains examples/demo.yaml twice from the same warm-started builtin:tiny (the warm
start is seeded and cached, so both arms start from the same weights and draw the same prompts
at step 1): `full` at the spec's lr, `lora` with `model.lora: {rank, alpha: 2 x rank}` at
--lora-lr (about 10x, "LoRA Without Regret"). Same schedule, so the same samples per step.
Writes bench/out/lora_curves/{curves.csv, summary.json}: eval pass@1 at every evaluation.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_SPEC, OUT, load_base, print_table, write_csv  # noqa: E402


def arms(args) -> list[tuple[str, dict]]:
    lora = {"rank": args.rank, "alpha": 2.0 * args.rank, "dropout": 0.0, "target_modules": "all-linear"}
    return [("full", {}), ("lora", {"model": {"lora": lora}, "optim": {"lr": args.lora_lr}})]


def main() -> None:
    import replicate as rep

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lora-lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=OUT / "lora_curves")
    args = ap.parse_args()
    base = load_base(DEFAULT_SPEC)
    ns = SimpleNamespace(spec=DEFAULT_SPEC, threads=args.threads, timeout=args.timeout)
    never = {"kind": "budget", "budget": 10**12}
    rows, summary = [], []
    for seed in args.seeds:
        for name, over in arms(args):
            over = {**over, "seed": seed, "checkpoint": {"every": 0, "keep_last": 1}}
            res = rep.launch(ns, over, never, args.out / "work" / f"{name}_s{seed}")
            evals = [r for r in res["rows"] if "eval/pass@1" in r]
            for r in evals:
                rows.append({"arm": name, "seed": seed, "step": r["step"], "cum_samples": r.get("cum_samples"),
                             "eval/pass@1": r["eval/pass@1"], "eval/pass@16": r.get("eval/pass@16")})
            summary.append({"arm": name, "seed": seed, "lr": over.get("optim", {}).get("lr", base["optim"]["lr"]),
                            "pass@1 start": evals[0]["eval/pass@1"], "pass@1 end": evals[-1]["eval/pass@1"],
                            "pass@1 best": max(r["eval/pass@1"] for r in evals), "wall_s": res["wall_s"]})
            print(f"{name} seed {seed}: pass@1 " + " -> ".join(f"{r['eval/pass@1']:.3f}" for r in evals)
                  + f" ({res['wall_s']:.0f} s)", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            write_csv(args.out / "curves.csv", rows)
            (args.out / "summary.json").write_text(json.dumps({"rank": args.rank, "alpha": 2 * args.rank,
                                                               "runs": summary}, indent=1))
    print_table(summary, list(summary[0]), 3)


if __name__ == "__main__":
    main()  # each run is a child of bench/replicate.py (its `--child`), one torch thread
