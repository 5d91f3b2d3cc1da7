"""A single-turn step before and after the rollout seam: the same spec and start run by the
code from before the seam (a checkout of tests/support/seam_reference.py's REFERENCE_COMMIT)
and by this checkout, alternating, one torch thread each, each in its own `brorl train` child.

The spec is the seam reference's (builtin:tiny's shipped seed, chain_sum, HF engine) with
`--n` samples for `--prompts` prompts, one step. Figures per side: the step's `gen_s`
(generate + score through the seam), `train_s` and `step_s` from its metrics row, medians over
`--reps` alternating pairs, and the ratio after / before.

    git archive e255f910216bfb0df874d6dc3349e9f13cf8e09b | tar -x -C /tmp/pre-seam
    .venv/bin/python bench/seam_speed.py --before /tmp/pre-seam [--reps 3] [--n 16] [--prompts 8]

Writes bench/out/seam_speed.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, print_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support.seam_reference import SPEC, shipped_seed  # noqa: E402

FIELDS = ("gen_s", "train_s", "step_s")


def one_step(root: Path, n: int, prompts: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(shipped_seed(), work / "model")
        spec = SPEC.replace("MODEL", str(work / "model")).replace(
            "{n: 8, prompts_per_step: 4, steps: 1}", f"{{n: {n}, prompts_per_step: {prompts}, steps: 1}}")
        (work / "spec.yaml").write_text(spec)
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1",
               "BRORL_CACHE_DIR": str(work / "cache"), "BRORL_MODEL_ROOTS": str(work)}
        subprocess.run([sys.executable, "-m", "cli.main", "train", str(work / "spec.yaml"), "--out",
                        str(work / "run")], cwd=root, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
        row = next(r for r in rows if "loss" in r)
        return {k: row[k] for k in FIELDS + ("samples",)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the pre-seam commit")
    parser.add_argument("--after", type=Path, default=REPO,
                        help="the code to compare (default: this checkout; the seam's own commit, "
                             "89eacc8, times the seam alone)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    runs = {"before": [], "after": []}
    for _ in range(args.reps):
        for side, root in (("before", args.before.resolve()), ("after", args.after.resolve())):
            runs[side].append(one_step(root, args.n, args.prompts))
    med = {side: {k: statistics.median(r[k] for r in rs) for k in FIELDS} for side, rs in runs.items()}
    rows = [{"seconds (median)": k, "before the seam": med["before"][k], "after": med["after"][k],
             "after / before": med["after"][k] / med["before"][k]} for k in FIELDS]
    print_table(rows, ["seconds (median)", "before the seam", "after", "after / before"])
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / ("seam_speed.json" if args.after.resolve() == REPO else "seam_speed_alone.json")
    path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                "runs": runs, "median": med, "load": os.getloadavg()}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
