"""`brorl schedule`: the stage table names both lr knobs, so a flat lr explains itself."""
import re

import yaml
from typer.testing import CliRunner

from cli.main import app


def run_schedule(tmp_path, optim):
    spec = {"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}},
            "rollout": {"schedule": [{"n": 16, "prompts_per_step": 32, "steps": 2},
                                     {"n": 128, "prompts_per_step": 16, "steps": 1}]},
            "optim": {"lr": 1e-4, **optim}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(app, ["schedule", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def lrs(output):
    """The lr column: the fifth cell of each stage row."""
    return re.findall(r"│ \d+ │ \d+ │ \d+ │ \d+ │ ([0-9.e-]+) │", output)


def test_the_default_names_both_rules_and_the_cut_stage_keeps_its_lr(tmp_path):
    out = run_schedule(tmp_path, {})
    assert "lr_scaling sqrt, lr_batch prompts_capped" in out
    assert "capped at prompts/step" in out and "(optim.lr_batch: prompts_capped)" in out
    assert lrs(out) == ["0.0001", "0.0001"]  # 4x the samples on half the prompts: lr flat


def test_samples_rule_scales_the_lr_and_says_so(tmp_path):
    out = run_schedule(tmp_path, {"lr_batch": "samples"})
    assert "lr_batch samples" in out and "capped" not in out
    assert lrs(out) == ["0.0001", "0.0002"]  # sqrt(4)


def test_no_scaling_has_one_line(tmp_path):
    out = run_schedule(tmp_path, {"lr_scaling": "none"})
    assert "lr = 0.0001 x 1 (optim.lr_scaling: none)" in out and "r = samples" not in out
