"""`bench/replicate.py --quick` end to end: the replication pipeline runs and writes its outputs.

Checks the plumbing only (phase (a) plateau/step budget, checkpoint hand-over, both phase-(b)
arms, tables and plot), never the scientific outcome: with tiny budgets pass@1 may go anywhere.
Real training on builtin:tiny (the warm-start model is built once per cache, ~1-2 min).
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# 203 s on a quiet machine with the demo model built from scratch; twice over 540 s on cores
# shared with a benchmark: the margin is for load, not for this test's own work.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(960)]

REPO = Path(__file__).resolve().parents[2]


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_replicate_quick_writes_well_formed_outputs(tmp_path: Path):
    out = tmp_path / "replication"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "bench/replicate.py", "--quick", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    for name in ("phase_a.json", "evals.csv", "steps.csv", "summary.json", "summary.csv", "replication.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "replication.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    phase_a = json.loads((out / "phase_a.json").read_text())
    assert Path(phase_a["checkpoint"], "config.json").is_file()   # an HF folder phase (b) loaded
    assert phase_a["evals"] and phase_a["evals"][0]["step"] == 0

    evals = _csv(out / "evals.csv")
    assert {e["arm"] for e in evals} == {"N=16", "N=512"}
    for arm in ("N=16", "N=512"):
        mine = [e for e in evals if e["arm"] == arm]
        assert mine[0]["step"] == "0" and int(mine[-1]["samples"]) >= 1024   # the budget was spent
        assert all(0.0 <= float(e["eval/pass@1"]) <= 1.0 for e in mine)

    steps = _csv(out / "steps.csv")
    assert steps and all(0.0 <= float(s["keep_rate"]) <= 1.0 for s in steps)
    assert all(0.0 <= float(s["frac_all_wrong"]) <= 1.0 for s in steps)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] and [a["n"] for a in summary["arms"]] == [16, 512]
    for arm in summary["arms"]:
        for key in ("eval/pass@1 start", "eval/pass@1 end", "keep_rate", "frac_all_wrong", "lr"):
            assert isinstance(arm[key], float), key
