"""`brorl demo` end to end with the fake trainer: start the stack, submit, follow, stop.

The real trainer's run of examples/demo.yaml is `make demo`; here the worker uses the
trainer double, so this checks the plumbing (spec valid, live output, exit code, shutdown).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import FAKE_ENTRYPOINT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]  # `brorl demo` starts the stack

REPO = Path(__file__).resolve().parents[2]


def test_demo_follows_the_job_and_exits_zero(tmp_path: Path):
    env = {**os.environ, "BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT, "PYTHONUNBUFFERED": "1",
           "BRORL_HEARTBEAT_SECONDS": "0.5"}
    for name in ("BRORL_DATA_DIR", "BRORL_DATABASE_URL", "BRORL_BROKER_URL", "BRORL_API_KEY",
                 "BRORL_ARTIFACT_DIR", "BRORL_URL"):
        env.pop(name, None)
    data_dir = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "cli.main", "demo", "--data-dir", str(data_dir)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    log = (data_dir / "stack.log").read_text(errors="replace") if (data_dir / "stack.log").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + log[-4000:]
    assert [int(s) for s in re.findall(r"step\s+(\d+)", result.stdout)] == [1, 2, 3]
    assert "succeeded" in result.stdout
    # The dashboard link of its job (key in the fragment), and where the final checkpoint went.
    assert re.search(r"watch it in the browser: http://127\.0\.0\.1:\d+/jobs/job_\w+#key=brorl_",
                     result.stdout), result.stdout
    dest = re.search(r"final checkpoint downloaded to (\S+)", result.stdout)
    assert dest and (Path(dest.group(1)) / "config.json").is_file(), result.stdout
    assert "stopped" in log  # `brorl up` shut its children down
