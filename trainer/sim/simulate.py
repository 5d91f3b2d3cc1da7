"""The paper's token-level simulation (BroRL section 4.1, Figure 3) and a Theorem-1 check.

One "policy" is a logit vector z over a d-token vocabulary; some tokens are correct (reward
R_c = +1), the rest wrong (R_w = -1). Each step draws N tokens i.i.d. from softmax(z), centres
the rewards on the batch mean b, and takes an AdamW step on the loss that is linear in the
probabilities, L = -(1/N) sum_j (R_j - b) p[y_j]. Per step we track Q_pos (the correct mass),
the share of correct tokens whose probability rose since step 0, and the worst (most negative)
probability change among correct tokens. The paper's claim: larger N grows Q_pos faster, and
at N = 51,200 every correct token gains.

Choices the paper leaves open, made here (all are `SimConfig` fields and CLI flags):
- Which tokens are correct: the first `n_correct` indices of a permutation seeded by `seed`;
  the anchor is the next index of that permutation, so it is a *wrong* token. Only that reading
  gives the paper's initial Q_pos = 0.6296 (10,000 e^3 / (10,000 e^3 + e^5 + 117,999)); an
  anchor counted among the correct tokens gives 0.6301.
- "fixed at 5": read as frozen, a reference logit that is not trained (it pins the softmax's
  shift freedom). `anchor_trainable=True` trains it like any other token; Q_pos at step 0 is
  the same either way.
- AdamW betas (0.9, 0.999) and eps 1e-8 are torch's defaults. weight_decay is 0, not torch's
  0.01: decay pulls every logit towards 0, shrinking the seeded gaps (3 and 5) by itself and
  lowering Q_pos for a reason the theory does not model; no reward signal is involved.
- Seeds: the layout uses `seed`; the sampler for each N uses `seed * 1_000_003 + N`, so runs
  for different N are independent and each is reproducible on its own.
- float64 by default: correct-token probabilities start near 6e-5 and "did it rise" is a sign
  test on tiny differences, which float32 rounding would blur.

The gradient is computed analytically from token counts (torch.bincount), not by autograd over
an N-long loss graph: for L = sum_k g_k p_k with p = softmax(z), dL/dz = p * (g - <g, p>), where
g_k = -(c_k / N)(R_k - b) and c_k is how often token k was drawn. tests/trainer/sim/test_simulate.py
checks it against autograd; `grad="autograd"` runs the simulation with autograd instead.

Theorem 1 is checked along the way: at `theorem_steps`, the sampled batch's exact first-order
step (trainer.sim.theory.logit_step, small eta) is applied to a copy of z and the observed change
of Q_pos is compared with trainer.sim.theory.mass_balance_dq. `sweep` runs every N; `write_outputs`
writes simulation.json (config, per-N series, checks) and simulation.png (the three panels).
`brorl simulate` (cli/evidence.py) is the command; docs/simulation.md has the figures.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from trainer.sim.theory import logit_step, mass_balance_dq


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulation sweep depends on; defaults are the paper's (docs/simulation.md)."""

    d: int = 128_000  # vocabulary size
    n_correct: int = 10_000  # tokens with reward R_c
    correct_logit: float = 3.0  # initial logit of correct tokens (others start at 0)
    anchor_logit: float = 5.0  # initial logit of the one anchor token (a wrong token)
    anchor_trainable: bool = False  # paper: "fixed at 5" -> frozen by default
    lr: float = 1e-3
    steps: int = 1000
    ns: tuple[int, ...] = (4, 8, 16, 512, 51200)  # rollouts per step, one run each
    beta1: float = 0.9  # AdamW betas / eps: torch defaults (paper silent)
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0  # paper silent; 0 so only rewards move the logits
    seed: int = 0
    reward_correct: float = 1.0  # R_c
    reward_wrong: float = -1.0  # R_w
    theorem_steps: tuple[int, ...] = (0, 10, 100, 999)  # steps where Theorem 1 is checked
    theorem_max_dz: float = 1e-5  # the check's largest logit step (sets its small eta)
    dtype: str = "float64"
    grad: str = "analytic"  # or "autograd" (same numbers, slower)
    # torch intra-op threads. 1: vectors of 128k elements gain nothing from more, and on a
    # shared CPU the extra OpenMP workers spin against other processes (measured at load 5
    # on 2 cores: 12 ms/step at N = 51,200 with 1 thread, 215 ms with 2).
    threads: int = 1

    @classmethod
    def quick(cls, **overrides) -> "SimConfig":
        """Small sizes for tests and smoke runs (seconds, not minutes)."""
        base = cls(d=4000, n_correct=400, steps=100, ns=(4, 16, 512))
        return replace(base, **overrides)


@dataclass
class Layout:
    """Which tokens are correct, where the anchor is, the per-token rewards and initial logits."""

    correct: torch.Tensor  # bool [d]
    anchor: int
    rewards: torch.Tensor  # [d], R_c or R_w
    z0: torch.Tensor  # [d] initial logits


def make_layout(cfg: SimConfig) -> Layout:
    """Seeded choice of correct tokens and anchor (module docstring: why the anchor is wrong)."""
    if not 0 < cfg.n_correct < cfg.d:
        raise ValueError("need 0 < n_correct < d (the anchor must be a wrong token)")
    dtype = getattr(torch, cfg.dtype)
    perm = torch.randperm(cfg.d, generator=torch.Generator().manual_seed(cfg.seed))
    correct = torch.zeros(cfg.d, dtype=torch.bool)
    correct[perm[: cfg.n_correct]] = True
    anchor = int(perm[cfg.n_correct])
    z0 = torch.zeros(cfg.d, dtype=dtype)
    z0[correct] = cfg.correct_logit
    z0[anchor] = cfg.anchor_logit
    rewards = torch.where(correct, cfg.reward_correct, cfg.reward_wrong).to(dtype)
    return Layout(correct, anchor, rewards, z0)


def q_pos(z: torch.Tensor, correct: torch.Tensor) -> float:
    """Probability mass of the correct tokens, via log-sum-exp (no underflow at any d)."""
    return float(torch.exp(torch.logsumexp(z[correct], 0) - torch.logsumexp(z, 0)))


def linear_loss_grad(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """d/dz of sum_k g_k softmax(z)_k, given p = softmax(z): the softmax Jacobian applied to g."""
    return p * (g - torch.dot(g, p))


def batch_weights(counts: torch.Tensor, rewards: torch.Tensor, n: int) -> torch.Tensor:
    """Per-token dL/dp for L = -(1/N) sum_j (R_j - b) p[y_j], from draw counts.

    Token k appears c_k times in the batch, so its coefficient is -(c_k / N)(R_k - b); b is the
    batch-mean reward, sum_k c_k R_k / N.
    """
    b = torch.dot(counts, rewards) / n
    return -(counts / n) * (rewards - b)


def autograd_grad(z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The same gradient as `linear_loss_grad` via autograd (for `grad="autograd"`)."""
    zz = z.detach().clone().requires_grad_(True)
    (torch.softmax(zz, 0) * g).sum().backward()
    return zz.grad


# ---------------------------------------------------------------- Theorem 1 (mass balance)

def theorem1_check(z, layout: Layout, counts, cfg: SimConfig, n: int) -> dict[str, float]:
    """Apply the paper's exact logit step for this batch and compare dQ_pos with Theorem 1.

    The step is trainer.sim.theory.logit_step, dz_j = (eta/N) p_j (R_j - S_R) over the batch's
    distinct tokens: the paper's first-order step on the raw rewards, not the AdamW step the
    simulation takes. eta is chosen so the largest |dz_j| is `theorem_max_dz`: the formula is
    first order in eta, so the relative error shrinks linearly with it (measured: ~1.2 x
    max_dz) until float64 rounding of Q_pos takes over below ~1e-6; 1e-5 sits between.
    """
    z = z.detach().to(torch.float64)
    p = torch.softmax(z, 0)
    args = (p, layout.correct, counts > 0, cfg.reward_correct, cfg.reward_wrong)
    unit = logit_step(*args, 1.0, n)  # dz at eta = 1; the step is linear in eta
    eta = cfg.theorem_max_dz / float(unit.abs().max())
    observed = q_pos(z + eta * unit, layout.correct) - q_pos(z, layout.correct)
    terms = mass_balance_dq(*args, eta, n)
    rel = abs(observed - terms["total"]) / max(abs(observed), 1e-300)
    return {"eta": eta, "dq_observed": observed, "dq_formula": terms["total"],
            "rel_error": rel, **{k: v for k, v in terms.items() if k != "total"}}


# ---------------------------------------------------------------- the simulation loop

class _Tracker:
    """Per-step series: Q_pos, % of correct tokens improved since step 0, worst change.

    Values go into preallocated tensors and become lists once at the end; the correct tokens
    are gathered by index, which is cheaper than a boolean mask over the whole vocabulary.
    """

    def __init__(self, p0: torch.Tensor, correct: torch.Tensor, steps: int):
        self.idx = correct.nonzero().squeeze(1)
        self.p0 = p0[self.idx]
        self.values = torch.zeros(3, steps + 1, dtype=torch.float64)
        self.record(0, p0)

    def record(self, step: int, p: torch.Tensor) -> None:
        pc = p[self.idx]
        delta = pc - self.p0
        self.values[0, step] = pc.sum()
        self.values[1, step] = 100.0 * (delta > 0).double().mean()
        self.values[2, step] = delta.min()

    def series(self) -> dict[str, list]:
        q, pct, worst = self.values.tolist()
        return {"step": list(range(len(q))), "q_pos": q, "pct_improved": pct,
                "worst_change": worst}


def run(cfg: SimConfig, n: int, layout: Layout | None = None) -> dict:
    """Simulate `cfg.steps` AdamW steps with N = n draws per step; the tracked series and checks."""
    layout = layout or make_layout(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, n, layout)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: SimConfig, n: int, layout: Layout) -> dict:
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + n)
    z = layout.z0.clone()
    opt = torch.optim.AdamW([z], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                            weight_decay=cfg.weight_decay)
    p = torch.softmax(z, 0)  # kept in step with z: one softmax per step serves both uses
    tracker = _Tracker(p, layout.correct, cfg.steps)
    checks, start = [], time.perf_counter()
    for step in range(cfg.steps):
        draws = torch.multinomial(p, n, replacement=True, generator=gen)
        counts = torch.bincount(draws, minlength=cfg.d).to(z.dtype)
        if step in cfg.theorem_steps:
            checks.append({"step": step, **theorem1_check(z, layout, counts, cfg, n)})
        g = batch_weights(counts, layout.rewards, n)
        z.grad = linear_loss_grad(p, g) if cfg.grad == "analytic" else autograd_grad(z, g)
        opt.step()
        if not cfg.anchor_trainable:
            # Frozen anchor: restore it rather than zero its gradient, so weight decay (if
            # any) cannot move it either.
            z.data[layout.anchor] = cfg.anchor_logit
        p = torch.softmax(z, 0)
        tracker.record(step + 1, p)
    seconds = time.perf_counter() - start
    s = tracker.series()
    final = {k: s[k][-1] for k in ("q_pos", "pct_improved", "worst_change")}
    final["anchor_logit"] = float(z[layout.anchor])
    return {"n": n, "series": s, "final": final, "seconds": seconds, "theorem1": checks}


def sweep(cfg: SimConfig, on_done=None) -> dict:
    """Run every N of `cfg.ns`; `on_done(result)` is called after each (for progress output)."""
    layout = make_layout(cfg)
    runs = {}
    for n in cfg.ns:
        runs[str(n)] = run(cfg, n, layout)
        if on_done:
            on_done(runs[str(n)])
    worst_rel = max((c["rel_error"] for r in runs.values() for c in r["theorem1"]), default=None)
    return {
        "config": asdict(cfg),
        "initial_q_pos": q_pos(layout.z0, layout.correct),
        "anchor_index": layout.anchor,
        "theorem1_max_rel_error": worst_rel,
        "runs": runs,
    }


# ---------------------------------------------------------------- outputs
# matplotlib is imported inside `plot` (Agg backend: headless workers), so running the
# simulation itself needs only torch.

PANELS = (
    ("q_pos", "Q_pos (correct probability mass)"),
    ("pct_improved", "% correct tokens improved since step 0"),
    ("worst_change", "worst correct-token probability change"),
)


def plot(result: dict, path: Path, logx: bool = False) -> Path:
    """Figure 3 of the paper: one panel per tracked series, one line per N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    cfg = result["config"]
    for ax, (key, title) in zip(axes, PANELS):
        for n, run in result["runs"].items():
            steps, values = run["series"]["step"], run["series"][key]
            if logx:
                # Step 0 has no place on a log axis; the initial value is the same for all N.
                steps, values = steps[1:], values[1:]
            ax.plot(steps, values, label=f"N = {int(n):,}", linewidth=1.3)
        if key == "worst_change":
            # Zero separates "some correct token lost probability" from "every one gained".
            ax.axhline(0.0, color="grey", linewidth=0.8, linestyle="--")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("step")
        ax.set_xscale("log" if logx else "linear")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=9)
    fig.suptitle(
        f"Token-level simulation: d = {cfg['d']:,}, {cfg['n_correct']:,} correct, "
        f"AdamW lr {cfg['lr']:g}, seed {cfg['seed']}", fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rounded(obj, digits: int = 8):
    """Floats to `digits` significant digits: the file stays small (5 x 3 series of 1,001
    points), and 8 digits keep every difference the figures and the docs rely on."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v, digits) for v in obj]
    return obj


def write_outputs(result: dict, out_dir: Path, logx: bool = False) -> tuple[Path, Path]:
    """Write `simulation.json` and `simulation.png` under `out_dir`; return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "simulation.json"
    json_path.write_text(json.dumps(_rounded(result)))
    png_path = plot(result, out_dir / "simulation.png", logx=logx)
    return json_path, png_path
