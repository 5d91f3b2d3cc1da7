"""brorl evidence commands: reproduce the paper's claims on this machine (`brorl simulate`).

Every option defaults to None, meaning "take the value from the base config": the paper's
sizes (trainer.sim.simulate.SimConfig), or the small ones with --quick. That way --quick and an
explicit flag combine (e.g. `--quick --steps 300`) without one silently overriding the other.
torch and matplotlib are imported inside the command so `brorl --help` stays quick.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def _parse_ints(text: str) -> tuple[int, ...]:
    """'4,8,16' -> (4, 8, 16); typer has no tuple-of-unknown-length option."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from exc
    if not values:
        raise typer.BadParameter("expected at least one integer")
    return values


Opt = typer.Option
Int = Optional[int]
Float = Optional[float]
Str = Optional[str]


def simulate(
    out: Annotated[Path, Opt(help="Folder for simulation.json and simulation.png.")] = Path(
        "runs/simulation"),
    quick: Annotated[bool, Opt(help="Small sizes: d 4000, 400 correct, 100 steps, "
                                    "N 4,16,512.")] = False,
    ns: Annotated[Str, Opt(help="Rollouts per step, comma-separated "
                                "(default 4,8,16,512,51200).")] = None,
    d: Annotated[Int, Opt(help="Vocabulary size (default 128000).")] = None,
    n_correct: Annotated[Int, Opt(help="Correct tokens (default 10000).")] = None,
    correct_logit: Annotated[Float, Opt(help="Initial correct-token logit (default 3).")] = None,
    anchor_logit: Annotated[Float, Opt(help="Logit of the wrong anchor token (default 5).")] = None,
    anchor_trainable: Annotated[Optional[bool], Opt(
        "--anchor-trainable/--anchor-frozen", help="Train the anchor (default frozen).")] = None,
    lr: Annotated[Float, Opt(help="AdamW learning rate (default 1e-3).")] = None,
    steps: Annotated[Int, Opt(help="Steps per N (default 1000).")] = None,
    beta1: Annotated[Float, Opt(help="AdamW beta1 (default 0.9, torch's).")] = None,
    beta2: Annotated[Float, Opt(help="AdamW beta2 (default 0.999, torch's).")] = None,
    eps: Annotated[Float, Opt(help="AdamW eps (default 1e-8, torch's).")] = None,
    weight_decay: Annotated[Float, Opt(help="AdamW weight decay (default 0).")] = None,
    seed: Annotated[Int, Opt(help="Seed of the token layout and samplers (default 0).")] = None,
    reward_correct: Annotated[Float, Opt(help="R_c (default 1).")] = None,
    reward_wrong: Annotated[Float, Opt(help="R_w (default -1).")] = None,
    theorem_steps: Annotated[Str, Opt(help="Steps where Theorem 1 is checked, comma-separated "
                                           "(default 0,10,100,999).")] = None,
    theorem_max_dz: Annotated[Float, Opt(help="Largest logit step of that check "
                                              "(default 1e-5).")] = None,
    dtype: Annotated[Str, Opt(help="float64 or float32 (default float64).")] = None,
    grad: Annotated[Str, Opt(help="analytic or autograd (default analytic).")] = None,
    threads: Annotated[Int, Opt(help="torch intra-op threads (default 1).")] = None,
    logx: Annotated[bool, Opt(help="Log-scale step axis in the figure.")] = False,
) -> None:
    """Reproduce the paper's token-level simulation (Figure 3) and check Theorem 1."""
    from trainer.sim.simulate import SimConfig, sweep, write_outputs

    given = {
        "d": d, "n_correct": n_correct, "correct_logit": correct_logit,
        "anchor_logit": anchor_logit, "anchor_trainable": anchor_trainable, "lr": lr,
        "steps": steps, "beta1": beta1, "beta2": beta2, "eps": eps,
        "weight_decay": weight_decay, "seed": seed, "reward_correct": reward_correct,
        "reward_wrong": reward_wrong, "theorem_max_dz": theorem_max_dz, "dtype": dtype,
        "grad": grad, "threads": threads,
        "ns": _parse_ints(ns) if ns else None,
        "theorem_steps": _parse_ints(theorem_steps) if theorem_steps else None,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    _check_choices(overrides)
    cfg = SimConfig.quick(**overrides) if quick else SimConfig(**overrides)

    from rich.console import Console

    console = Console()

    def progress(run: dict) -> None:
        console.print(f"N = {run['n']:>6}: {run['seconds']:.1f} s")

    result = sweep(cfg, on_done=progress)
    json_path, png_path = write_outputs(result, out, logx=logx)
    console.print(_table(result))
    console.print(f"Theorem 1: max relative error {result['theorem1_max_rel_error']:.2e} "
                  f"over {sum(len(r['theorem1']) for r in result['runs'].values())} checks")
    console.print(f"wrote {json_path} and {png_path}")


def _check_choices(overrides: dict) -> None:
    """Reject unknown enum-like values with a message naming the flag."""
    if overrides.get("dtype", "float64") not in ("float64", "float32"):
        raise typer.BadParameter("--dtype must be float64 or float32")
    if overrides.get("grad", "analytic") not in ("analytic", "autograd"):
        raise typer.BadParameter("--grad must be analytic or autograd")


def _table(result: dict):
    """The summary table: one row per N, final values of the three tracked series."""
    from rich.table import Table

    table = Table(title=f"Token-level simulation (initial Q_pos {result['initial_q_pos']:.4f})")
    for col in ("N", "final Q_pos", "% improved", "worst drop", "seconds"):
        table.add_column(col, justify="right")
    for n, run in result["runs"].items():
        f = run["final"]
        table.add_row(f"{int(n):,}", f"{f['q_pos']:.4f}", f"{f['pct_improved']:.2f}",
                      f"{f['worst_change']:.3e}", f"{run['seconds']:.2f}")
    return table


def register(app: typer.Typer) -> None:
    """Add the evidence commands to the `brorl` app."""
    app.command("simulate")(simulate)
