"""The trainer learns: `brorl train examples/demo.yaml` on builtin:tiny raises eval pass@1.

The demo spec is the one users run first (`make demo`, README), so this is the run whose
outcome they see: a freshly built, warm-started model (chain_sum, one-digit sums and
differences) trained by the BroRL recipe for 12 steps (10 at n 16, then 2 at n 64), evaluated
at steps 0, 4, 8, 12. The former 30-step schedule, measured on 2 shared CPU cores (docs/results.md
section 0), gave eval pass@1 0.384, 0.457, 0.481 at steps 0, 5, 10, and 0.483 at step 30.
An eval is 64 prompts x 16 samples with fixed sampling seeds, so an unchanged model scores the
same and the sampling noise of one eval is about +-0.015: the test wants every later eval 0.03
above step 0 and the last one 0.04 above (another torch build or CPU kind may take another
warm-start path, hence the margin).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from trainer.run import cache_dir, tiny_model_key
from trainer.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo.yaml"


def _events(out: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [r for r in rows if r["type"] == kind]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_spec_raises_eval_pass_at_1(tmp_path: Path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-m", "cli.main", "train", str(DEMO), "--out", str(out)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=1700)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    spec = load_spec(DEMO)
    warm = json.loads((cache_dir() / "models" / f"tiny-{tiny_model_key(spec)}" / "warm_start.json").read_text())
    assert 0.05 <= warm["pass_rate"] <= 0.60, warm  # the warm start left RL something to learn

    evals = _events(out, "eval")
    assert [e["step"] for e in evals] == [0, 4, 8, 12]
    curve = [round(e["eval/pass@1"], 3) for e in evals]
    assert min(curve[1:]) >= curve[0] + 0.03 and curve[-1] >= curve[0] + 0.04, curve
    assert evals[-1]["eval/pass@16"] >= evals[0]["eval/pass@16"] - 0.05, evals  # no collapse

    stages = _events(out, "stage_started")
    assert [(s["n"], s["samples_per_step"]) for s in stages] == [(16, 512), (64, 1024)]
    # optim.lr_batch prompts_capped: twice the samples but fewer prompts per step, so no lr growth
    assert stages[1]["lr"] == pytest.approx(stages[0]["lr"])

    final = out / "checkpoints" / "step-00000012"
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.model_type == "qwen2"
