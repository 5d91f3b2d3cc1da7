"""Grader throughput through the real sandbox: trivial python grader samples/s and code
grader programs/s, with pooled sandboxes (the trainer's path: one GraderRuntime, many
batches). Prints the figures and writes them to bench/out/graders.json.

    python bench/graders.py [--samples 8192] [--programs 512] [--pool 2] [--layer landlock]

Targets (2-core machine): >= 1,000 python samples/s, >= 50 programs/s.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from trainer.graders import GraderRuntime, sandbox_layer  # noqa: E402

TRIVIAL = {"type": "python", "name": "trivial",
           "source": "def grade(sample, item):\n"
                     "    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n"}
CODE = {"type": "code", "name": "unit tests"}


def measure(runtime: GraderRuntime, grader: dict, samples: list, items: list,
            repeats: int = 3) -> float:
    runtime.grade(grader, samples[:64], items[:64])  # start the pool outside the clock
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        results = runtime.grade(grader, samples, items)
        rate = len(samples) / (time.perf_counter() - start)
        assert not any(r.failed for r in results), results[0]
        best = max(best, rate)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--programs", type=int, default=512)
    ap.add_argument("--pool", type=int, default=2)
    ap.add_argument("--layer", choices=["bubblewrap", "landlock"],
                    help="force this layer (default: the best that works here)")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "graders.json"))
    args = ap.parse_args()
    if args.layer:
        from trainer.graders.sandbox import detect

        why = detect._why_not(args.layer)
        if why:
            raise SystemExit(f"the {args.layer} layer does not work here: {why}")
        detect._detect = lambda: detect.LayerStatus(args.layer)
    rows = [json.loads(line) for line in (REPO / "examples/data/code_problems.jsonl").open()]
    items = [rows[i % len(rows)] for i in range(args.programs)]
    programs = [f"```python\n{row['answer']}```" for row in items]
    with GraderRuntime(pool_size=args.pool) as runtime:
        python_rate = measure(runtime, TRIVIAL, ["4"] * args.samples,
                              [{"answer": "4"}] * args.samples)
        code_rate = measure(runtime, CODE, programs, items)
    figures = {
        "layer": sandbox_layer(), "pool": args.pool, "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python_samples_per_s": round(python_rate, 1), "python_target": 1000,
        "code_programs_per_s": round(code_rate, 1), "code_target": 50,
        "tests_per_program": round(sum(len(r["tests"]) for r in items) / len(items), 2),
    }
    print(json.dumps(figures, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
