"""`bench/lora_update.py` still runs against the trainer's update: it reaches into the update's
micro-batching and log-prob internals (`_chunks`, `_logits`, `token_logp`), which moved once
without anything noticing. A tiny N, one configuration; the figures themselves are not checked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def test_lora_update_measures_an_adapter(tmp_path: Path):
    proc = subprocess.run([sys.executable, "bench/lora_update.py", "--one", "lora-r8", "--n", "4", "--steps", "1"],
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["config"] == "lora-r8" and 0 < row["trainable_params"] < row["params"]
    assert row["saved_for_backward_mb"] > 0 and row["update_s"] > 0
