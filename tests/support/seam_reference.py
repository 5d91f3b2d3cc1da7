"""One single-turn training step's fingerprint, for the check that the rollout seam changed no
single-turn job (tests/trainer/rollouts/test_seam_reference.py).

The reference was made by the code from before the seam (commit REFERENCE_COMMIT) and is
compared with today's code on the same spec and the same start. To make it again, from a
checkout of this repository:

    git archive e255f910216bfb0df874d6dc3349e9f13cf8e09b | tar -x -C /tmp/pre-seam
    .venv/bin/python -m tests.support.seam_reference --root /tmp/pre-seam

The start is the shipped builtin:tiny seed (a warm-started model, so the step's groups are
mixed and the update is not empty); its sha256 is recorded, and a different seed is named as
the reason when the check fails.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "tests" / "trainer" / "rollouts" / "data" / "seam_reference.json"
REFERENCE_COMMIT = "e255f910216bfb0df874d6dc3349e9f13cf8e09b"
PROJECTIONS = 4  # random directions per tensor: the update's direction, not only its size
# What a metrics row must repeat: the samples drawn and scored exactly, the loss's figures to
# float tolerance (the fused head sums in another order).
EXACT = ("samples", "reward_mean", "pass_rate", "response_len_mean", "kept_groups", "n_tokens",
         "truncated_frac", "mini_batch_updates")
CLOSE = ("loss", "kl", "entropy", "grad_norm", "pg_clipfrac_low", "pg_clipfrac_high")

SPEC = """\
spec_version: 1
name: seam-reference
seed: 3
model: {path: MODEL, dtype: float32}
task:
  reasoning_gym:
    name: chain_sum
    config: {min_terms: 2, max_terms: 2, max_digits: 1}
    train_size: 200
    eval_size: 16
    eval_disjoint: false
rollout:
  engine: hf
  schedule: [{n: 8, prompts_per_step: 4, steps: 1}]
  max_new_tokens: 24
  temperature: 1.0
optim: {lr: 1.0e-4}
algo: {mini_batches: 2}
eval: {every: 0}
checkpoint: {every: 1}
"""


def shipped_seed() -> Path:
    seeds = sorted((REPO / "trainer" / "models" / "seeds").glob("tiny-*"))
    assert len(seeds) == 1, f"expected one shipped builtin:tiny seed, found {seeds}"
    return seeds[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_step(root: Path, work: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """One step of SPEC by the code at `root` (its own `brorl train`, in a child), from the
    shipped seed: its metrics row and the step's parameters."""
    model = work / "model"
    shutil.copytree(shipped_seed(), model)
    (work / "spec.yaml").write_text(SPEC.replace("MODEL", str(model)))
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1",
           "BRORL_CACHE_DIR": str(work / "cache"), "BRORL_MODEL_ROOTS": str(work)}
    subprocess.run([sys.executable, "-m", "cli.main", "train", str(work / "spec.yaml"),
                    "--out", str(work / "run")], cwd=root, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    row = next(r for r in rows if "loss" in r)  # the step's row (an eval-only row may come first)
    return row, load_file(work / "run" / "checkpoints" / "step-00000001" / "model.safetensors")


def fingerprint(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> dict:
    """Per tensor: the update's norm and its projections on fixed random directions."""
    out = {}
    for name in sorted(before):
        delta = (after[name].double() - before[name].double()).flatten()
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        dirs = torch.randn(PROJECTIONS, delta.numel(), generator=gen, dtype=torch.float64)
        out[name] = {"norm": delta.norm().item(), "proj": (dirs @ delta).tolist()}
    return out


def record(root: Path, work: Path) -> dict:
    row, after = run_step(root, work)
    before = load_file(shipped_seed() / "model.safetensors")
    return {"commit": REFERENCE_COMMIT, "seed_sha256": sha256(shipped_seed() / "model.safetensors"),
            "metrics": {k: row[k] for k in EXACT + CLOSE}, "update": fingerprint(after, before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="a checkout of REFERENCE_COMMIT")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seam-reference"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    REFERENCE.write_text(json.dumps(record(args.root.resolve(), args.work), indent=1) + "\n")
    print(f"wrote {REFERENCE}")


if __name__ == "__main__":
    main()
