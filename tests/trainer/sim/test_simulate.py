"""The token-level simulation (trainer/sim/simulate.py) and its command (`brorl simulate`).

Everything here runs in quick mode or without steps, so the file takes a few seconds on CPU.
"""
import json
import math

import pytest
import torch
import typer
from typer.testing import CliRunner

from cli import evidence
from trainer.sim.simulate import (
    SimConfig,
    batch_weights,
    linear_loss_grad,
    make_layout,
    q_pos,
    run,
    sweep,
    write_outputs,
)


@pytest.fixture(scope="module")
def quick_result():
    return sweep(SimConfig.quick())


PAPER_INITIAL_Q_POS = 0.6296  # the paper's initial Q_pos, before any step


def test_initial_q_pos_reproduces_the_paper():
    cfg = SimConfig()  # the paper's sizes; no step is taken
    layout = make_layout(cfg)
    assert round(q_pos(layout.z0, layout.correct), 4) == PAPER_INITIAL_Q_POS
    assert not layout.correct[layout.anchor]  # only a wrong anchor gives 0.6296
    assert int(layout.correct.sum()) == cfg.n_correct
    assert float(layout.z0[layout.anchor]) == cfg.anchor_logit


def test_layout_is_seeded():
    a, b = make_layout(SimConfig.quick(seed=3)), make_layout(SimConfig.quick(seed=3))
    c = make_layout(SimConfig.quick(seed=4))
    assert torch.equal(a.correct, b.correct) and a.anchor == b.anchor
    assert not torch.equal(a.correct, c.correct)


def test_analytic_gradient_equals_autograd():
    gen = torch.Generator().manual_seed(0)
    d, n = 50, 32
    z = torch.randn(d, generator=gen, dtype=torch.float64)
    rewards = torch.where(torch.rand(d, generator=gen) < 0.3, 1.0, -1.0).double()
    draws = torch.multinomial(torch.softmax(z, 0), n, replacement=True, generator=gen)
    # The loss as written in the paper: one term per draw, through autograd.
    zz = z.clone().requires_grad_(True)
    r = rewards[draws]
    loss = -((r - r.mean()) * torch.softmax(zz, 0)[draws]).mean()
    loss.backward()
    # The same gradient from counts and the softmax Jacobian.
    counts = torch.bincount(draws, minlength=d).double()
    analytic = linear_loss_grad(torch.softmax(z, 0), batch_weights(counts, rewards, n))
    torch.testing.assert_close(analytic, zz.grad, rtol=1e-12, atol=1e-15)


def test_autograd_mode_gives_the_same_run():
    cfg = SimConfig.quick(steps=20)
    a = run(cfg, 16)["series"]["q_pos"]
    b = run(SimConfig.quick(steps=20, grad="autograd"), 16)["series"]["q_pos"]
    assert a == pytest.approx(b, rel=1e-12)


def test_theorem1_check_is_accurate(quick_result):
    checks = [c for r in quick_result["runs"].values() for c in r["theorem1"]]
    assert len(checks) == 2 * len(SimConfig.quick().ns)  # steps 0 and 10 of (0, 10, 100, 999)
    for c in checks:
        assert c["rel_error"] < 1e-3
        assert c["sampled_correct"] >= 0 and c["sampled_wrong"] >= 0
        assert math.isclose(c["sampled_correct"] + c["sampled_wrong"] + c["unsampled_coupling"],
                            c["dq_formula"], rel_tol=1e-9)
    assert quick_result["theorem1_max_rel_error"] < 1e-3


def test_series_shape_and_start(quick_result):
    cfg = SimConfig.quick()
    for run_ in quick_result["runs"].values():
        s = run_["series"]
        assert s["step"] == list(range(cfg.steps + 1))
        assert s["q_pos"][0] == pytest.approx(quick_result["initial_q_pos"])
        assert s["pct_improved"][0] == 0.0 and s["worst_change"][0] == 0.0


def test_large_n_beats_small_n(quick_result):
    # Over 20 seeds the gap at these sizes is 0.022 +- 0.0005; one seed is not flaky.
    final = {int(n): r["final"]["q_pos"] for n, r in quick_result["runs"].items()}
    assert final[512] > final[16] > final[4]
    assert quick_result["runs"]["512"]["final"]["pct_improved"] == 100.0


def test_frozen_anchor_stays_put():
    # Weight decay on, so a frozen anchor must be held against decay too, not only gradients.
    frozen = run(SimConfig.quick(steps=5, weight_decay=0.1), 512)["final"]["anchor_logit"]
    trained = run(SimConfig.quick(steps=5, weight_decay=0.1, anchor_trainable=True),
                  512)["final"]["anchor_logit"]
    assert frozen == 5.0
    assert trained != 5.0


def test_write_outputs(tmp_path, quick_result):
    json_path, png_path = write_outputs(quick_result, tmp_path)
    data = json.loads(json_path.read_text())
    assert set(data["runs"]) == {"4", "16", "512"}
    assert data["config"]["d"] == 4000
    assert png_path.stat().st_size > 10_000


def test_cli_quick(tmp_path):
    app = typer.Typer()
    app.callback()(lambda: None)  # keep `simulate` a subcommand, as in the real `brorl` app
    evidence.register(app)
    result = CliRunner().invoke(app, ["simulate", "--quick", "--steps", "30", "--ns", "4,512",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "final Q_pos" in result.output
    data = json.loads((tmp_path / "simulation.json").read_text())
    assert data["config"]["steps"] == 30 and data["config"]["ns"] == [4, 512]
    assert (tmp_path / "simulation.png").exists()


def test_cli_rejects_bad_choice(tmp_path):
    app = typer.Typer()
    app.callback()(lambda: None)
    evidence.register(app)
    result = CliRunner().invoke(app, ["simulate", "--quick", "--grad", "numeric",
                                      "--out", str(tmp_path)])
    assert result.exit_code != 0
