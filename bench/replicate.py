"""A small-scale replication of BroRL's central experiment on CPU (docs/results.md, section 4).

(a) From the base spec (positional argument, default examples/demo.yaml: its task, model, lr,
    algo, eval), train with N = `--n-small` until eval pass@1 plateaus, and keep the final
    checkpoint. Plateau rule: evaluate every `--a-eval-every` steps; stop at the first
    evaluation, after `--a-min-steps`, where the best pass@1 so far has not risen by at least
    `--a-min-delta` over the last `--a-patience` evaluations, or at `--a-max-steps`. Phase (a)
    runs once, with the base spec's seed: every arm and seed of (b) starts from the same weights.
(b) From that checkpoint (its HF folder becomes `model.path`; the optimizer state starts fresh,
    as on a new job), continue with N = `--n-small` and, separately, N = `--n-large`, each
    until it has generated `--budget` samples (refills of dynamic sampling included), stopping
    at the first evaluation at or past the budget. Evaluation every ~`--eval-every-samples`
    generated samples. Repeated for every seed in `--seeds` (the seed also draws the task's
    train/eval questions, so the two arms of one seed share an eval set and step-0 numbers).
    Shapes of the N-large arm (`--shape`):
      paper  the paper's: 4x fewer prompts per step than the N-small arm (512 -> 128 in the
             paper), so 8x the samples per step at 16 -> 512, and the lr scaled by the base
             spec's `optim.lr_scaling` rule (sqrt: x2.83) via the trainer's `scaled_lr`.
      equal  the same samples per step (prompts = small arm's samples / N-large): same lr.
    Both arms get the same budget of generated samples, so in the paper shape the N-large arm
    takes 8x fewer optimizer steps (the paper: +107 BroRL steps against +535 ProRL steps).

Recorded: eval pass@1 and pass@k against generated samples and against training time (sum of
the steps' step_s: generation, scoring, update, sync; evaluation and start-up excluded), the
keep rate of dynamic sampling per arm (the paper: 41 % at N = 16, 62 % at N = 512) and the share
of prompts with no correct rollout (frac_all_wrong); mean and spread (std, min..max) over seeds.
Every run is `trainer.train` in a fresh subprocess (one vLLM engine per process, clean memory).

    .venv/bin/python bench/replicate.py [SPEC.yaml] [--quick] [--shape paper|equal] [--seeds 0,1,2]

Writes bench/out/replication/: phase_a.json, evals.csv, steps.csv, summary.json, summary.csv,
replication.png. `--quick` (one seed, tiny budgets, < 5 min) checks the pipeline, not the science.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DEFAULT_SPEC, OUT, emit_result, load_base, make_spec, mean_spread,  # noqa: E402
                    print_table, pyplot, run_child, write_csv)

STEP_KEYS = ("samples", "keep_rate", "frac_all_wrong", "frac_all_correct", "pass_rate", "refill_rounds",
             "lr", "step_s", "gen_s", "train_s", "loss", "kl", "entropy")


# ----------------------------------------------------------------------------- child: one run


class RecordingSink:
    """Keeps each metrics row with cumulative generated samples and training seconds."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.samples_seen, self.train_s, self.t0 = 0, 0.0, time.perf_counter()

    def metrics(self, step, values):
        self.samples_seen += int(values.get("samples") or 0)
        self.train_s += float(values.get("step_s") or 0.0)
        self.rows.append({"step": step, **values, "cum_samples": self.samples_seen, "cum_train_s": self.train_s,
                          "wall_s": time.perf_counter() - self.t0})

    def event(self, type, data):
        pass

    def checkpoint(self, step, path, nbytes, sha256):
        pass

    def samples(self, step, rows):
        pass

    def evals(self) -> list[dict]:
        return [r for r in self.rows if "eval/pass@1" in r]


def plateaued(evals: list[dict], min_steps: int, patience: int, min_delta: float) -> bool:
    """Phase (a)'s rule: no rise of the best pass@1 by >= min_delta over the last `patience` evals."""
    if len(evals) <= patience or evals[-1]["step"] < min_steps:
        return False
    before = max(e["eval/pass@1"] for e in evals[:-patience])
    return max(e["eval/pass@1"] for e in evals[-patience:]) < before + min_delta


def child(cfg: dict) -> None:
    """One `train` run; stops per cfg["stop"] only right after an evaluation."""
    import torch

    from trainer import train

    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    spec = make_spec(load_base(cfg["spec"]), cfg["over"])
    sink, stop = RecordingSink(), cfg["stop"]

    def should_stop() -> bool:
        last = sink.rows[-1] if sink.rows else None
        if last is None or last["step"] == 0 or "eval/pass@1" not in last:
            return False
        if stop["kind"] == "budget":
            return sink.samples_seen >= stop["budget"]
        return plateaued(sink.evals(), stop["min_steps"], stop["patience"], stop["min_delta"])

    result = train(spec, sink, should_stop, out_dir=Path(cfg["out_dir"]))
    emit_result({"rows": sink.rows, "checkpoint": str(result.last_checkpoint),
                 "stopped": result.stopped, "steps": result.steps_completed,
                 "wall_s": time.perf_counter() - sink.t0})


def launch(args, over: dict, stop: dict, out_dir: Path) -> dict:
    cfg = {"spec": str(args.spec), "over": over, "stop": stop, "out_dir": str(out_dir), "threads": args.threads}
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None
    return run_child([__file__, "--child", json.dumps(cfg)], timeout=args.timeout, env=env)


# ----------------------------------------------------------------------------- phases


def phase_a(args, base: dict) -> dict:
    over = {"rollout": {"schedule": [{"n": args.n_small, "prompts_per_step": args.a_prompts,
                                      "steps": args.a_max_steps}]},
            "eval": {"every": args.a_eval_every, **args.eval_over},
            "checkpoint": {"every": args.a_eval_every, "keep_last": 1}}
    stop = {"kind": "plateau", "min_steps": args.a_min_steps, "patience": args.a_patience,
            "min_delta": args.a_min_delta}
    print(f"phase (a): N={args.n_small} x {args.a_prompts} prompts, up to {args.a_max_steps} steps", flush=True)
    res = launch(args, over, stop, args.out / "work" / "phase_a")
    evals = [{k: v for k, v in r.items() if k.startswith("eval/") or k in ("step", "cum_samples")}
             for r in res["rows"] if "eval/pass@1" in r]
    out = {"spec": str(args.spec), "seed": base["seed"], "n": args.n_small, "prompts_per_step": args.a_prompts,
           "rule": stop, "max_steps": args.a_max_steps, "eval_every": args.a_eval_every,
           "steps": res["steps"], "plateaued": res["stopped"], "checkpoint": res["checkpoint"],
           "wall_s": res["wall_s"], "evals": evals}
    print(f"phase (a): {res['steps']} steps, {'plateau' if res['stopped'] else 'step budget'}, pass@1 "
          + " -> ".join(f"{e['eval/pass@1']:.3f}" for e in evals) + f" ({res['wall_s']:.0f} s)", flush=True)
    return out


def arms(args, base: dict) -> list[dict]:
    """The two phase-(b) arms: N, prompts per step, lr, eval cadence, step cap."""
    from trainer.algo.schedule import scaled_lr

    small = args.n_small * args.prompts_small
    if args.prompts_large:
        p_large = args.prompts_large
    elif args.shape == "equal":
        p_large = small // args.n_large
    else:
        p_large = max(1, args.prompts_small // 4)
    if p_large < 1:
        raise SystemExit(f"--shape equal: {small} samples per step is below N = {args.n_large}")
    out = []
    for name, n, prompts in (("small", args.n_small, args.prompts_small), ("large", args.n_large, p_large)):
        samples = n * prompts
        lr = scaled_lr(base["optim"]["lr"], samples, small, base["optim"]["lr_scaling"])
        every = max(1, round(args.eval_every_samples / samples))
        steps = every * math.ceil(math.ceil(args.budget / samples) / every)
        out.append({"arm": f"N={n}", "n": n, "prompts_per_step": prompts, "samples_per_step": samples,
                    "lr": lr, "eval_every": every, "max_steps": steps})
    return out


def phase_b(args, arm: dict, seed: int, checkpoint: str) -> dict:
    over = {"seed": seed, "model": {"path": checkpoint},
            "rollout": {"schedule": [{"n": arm["n"], "prompts_per_step": arm["prompts_per_step"],
                                      "steps": arm["max_steps"]}]},
            "optim": {"lr": arm["lr"]}, "eval": {"every": arm["eval_every"], **args.eval_over},
            "checkpoint": {"every": 0, "keep_last": 1}}
    out_dir = args.out / "work" / f"{arm['arm']}-seed{seed}"
    shutil.rmtree(out_dir, ignore_errors=True)
    res = launch(args, over, {"kind": "budget", "budget": args.budget}, out_dir)
    evals = [r for r in res["rows"] if "eval/pass@1" in r]
    print(f"  {arm['arm']:6s} seed {seed}: {res['steps']:3d} steps, {res['rows'][-1]['cum_samples']} samples, "
          f"pass@1 {evals[0]['eval/pass@1']:.3f} -> {evals[-1]['eval/pass@1']:.3f} ({res['wall_s']:.0f} s)",
          flush=True)
    return res


# ----------------------------------------------------------------------------- reporting


def tables(runs: list[tuple[dict, int, dict]]) -> tuple[list[dict], list[dict]]:
    evals, steps = [], []
    for arm, seed, res in runs:
        tag = {"arm": arm["arm"], "n": arm["n"], "seed": seed}
        for r in res["rows"]:
            if "eval/pass@1" in r:
                evals.append({**tag, "step": r["step"], "samples": r["cum_samples"],
                              "step_time_s": r["cum_train_s"], "wall_s": r["wall_s"],
                              **{k: v for k, v in r.items() if k.startswith("eval/")}})
            if r["step"] > 0:
                steps.append({**tag, "step": r["step"], **{k: r.get(k) for k in STEP_KEYS}})
    return evals, steps


def summarise(arm_list: list[dict], evals: list[dict], steps: list[dict]) -> list[dict]:
    out = []
    for arm in arm_list:
        ev = [e for e in evals if e["arm"] == arm["arm"]]
        st = [s for s in steps if s["arm"] == arm["arm"]]
        seeds = sorted({e["seed"] for e in ev})
        first = {s: min((e for e in ev if e["seed"] == s), key=lambda e: e["step"]) for s in seeds}
        last = {s: max((e for e in ev if e["seed"] == s), key=lambda e: e["step"]) for s in seeds}
        row = {**arm, "seeds": len(seeds)}
        for key in sorted({k for e in ev for k in e if k.startswith("eval/pass@")}):
            end = mean_spread([last[s][key] for s in seeds])
            row[f"{key} start"] = mean_spread([first[s][key] for s in seeds])["mean"]
            row.update({f"{key} end": end["mean"], f"{key} end std": end["std"],
                        f"{key} end min": end["min"], f"{key} end max": end["max"]})
            row[f"{key} gain"] = mean_spread([last[s][key] - first[s][key] for s in seeds])["mean"]
        row["steps mean"] = mean_spread([last[s]["step"] for s in seeds])["mean"]
        row["samples mean"] = mean_spread([last[s]["samples"] for s in seeds])["mean"]
        row["step_time_s mean"] = mean_spread([last[s]["step_time_s"] for s in seeds])["mean"]
        gen = sum(s["samples"] for s in st)
        # Sample-weighted: steps with refill rounds generated more samples.
        row["keep_rate"] = sum(s["keep_rate"] * s["samples"] for s in st) / gen if gen else math.nan
        row["frac_all_wrong"] = mean_spread([s["frac_all_wrong"] for s in st])["mean"]
        row["frac_all_correct"] = mean_spread([s["frac_all_correct"] for s in st])["mean"]
        out.append(row)
    return out


def curves(evals: list[dict], arm: str, xkey: str, ykey: str):
    """Mean x, mean y, min y, max y over seeds, aligned by the index of the evaluation."""
    per_seed = {}
    for e in sorted(evals, key=lambda e: e["step"]):
        if e["arm"] == arm:
            per_seed.setdefault(e["seed"], []).append(e)
    if not per_seed:
        return [], [], [], []
    count = min(len(v) for v in per_seed.values())
    cols = [[v[i] for v in per_seed.values()] for i in range(count)]
    return ([mean_spread([e[xkey] for e in c])["mean"] for c in cols],
            [mean_spread([e[ykey] for e in c])["mean"] for c in cols],
            [min(e[ykey] for e in c) for c in cols], [max(e[ykey] for e in c) for c in cols])


def plot(arm_list: list[dict], evals: list[dict], path: Path, kmax: int, title: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = [("samples", "eval/pass@1", "generated samples (phase b)"),
              ("step_time_s", "eval/pass@1", "training seconds (sum of step_s)"),
              ("samples", f"eval/pass@{kmax}", "generated samples (phase b)")]
    for ax, (xkey, ykey, xlabel) in zip(axes, panels):
        for arm in arm_list:
            x, y, lo, hi = curves(evals, arm["arm"], xkey, ykey)
            line, = ax.plot(x, y, marker="o", ms=3, label=f"{arm['arm']} x {arm['prompts_per_step']} "
                                                          f"(lr {arm['lr']:.2g})")
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
            # Each seed too: runs stop at different evaluations, and the mean covers only the
            # evaluations every seed reached.
            for seed in sorted({e["seed"] for e in evals if e["arm"] == arm["arm"]}):
                mine = sorted((e for e in evals if e["arm"] == arm["arm"] and e["seed"] == seed),
                              key=lambda e: e["step"])
                ax.plot([e[xkey] for e in mine], [e[ykey] for e in mine], color=line.get_color(),
                        lw=0.8, alpha=0.45, ls="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ykey.removeprefix("eval/"))
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title + " (solid: mean over seeds; band: min..max; dashed: each seed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_title(meta: dict) -> str:
    return f"{Path(meta['spec']).name}: phase (b), {meta['budget']} samples per run, shape {meta['shape']}"


def replot(out: Path) -> None:
    import csv

    meta = json.loads((out / "summary.json").read_text())
    with open(out / "evals.csv", newline="") as f:
        evals = [{k: v if k == "arm" else float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    kmax = max(int(k.split("@")[1]) for k in evals[0] if k.startswith("eval/pass@"))
    plot(meta["arms"], evals, out / "replication.png", kmax, plot_title(meta))
    print(f"wrote {out / 'replication.png'}")


# ----------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", type=Path, default=DEFAULT_SPEC, help="base spec (YAML)")
    ap.add_argument("--quick", action="store_true", help="smoke run: one seed, tiny budgets (< 5 min)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--n-small", type=int, default=16)
    ap.add_argument("--n-large", type=int, default=512)
    ap.add_argument("--prompts-small", type=int, default=32, help="prompts per step of the N-small arm")
    ap.add_argument("--shape", choices=["paper", "equal"], default="paper", help="N-large arm's shape")
    ap.add_argument("--prompts-large", type=int, default=None, help="override the shape's prompts per step")
    ap.add_argument("--budget", type=int, default=16384, help="generated samples per phase-(b) run")
    ap.add_argument("--eval-every-samples", type=int, default=2048)
    ap.add_argument("--a-prompts", type=int, default=32, help="phase (a): prompts per step")
    ap.add_argument("--a-max-steps", type=int, default=60)
    ap.add_argument("--a-eval-every", type=int, default=5)
    ap.add_argument("--a-min-steps", type=int, default=15)
    ap.add_argument("--a-patience", type=int, default=3)
    ap.add_argument("--a-min-delta", type=float, default=0.02)
    ap.add_argument("--a-checkpoint", default=None, help="skip phase (a): continue from this folder")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per run (1: see bench/step.py on shared cores); 0 = torch's default")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    ap.add_argument("--out", type=Path, default=OUT / "replication")
    ap.add_argument("--replot", action="store_true", help="redraw replication.png from --out's CSV/JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.eval_over = {}
    if args.quick:  # an evaluation at the start and at the end of each run, 4 samples a prompt
        args.seeds = args.seeds.split(",")[0]
        args.prompts_small, args.shape, args.budget, args.eval_every_samples = 32, "equal", 1024, 1024
        args.a_prompts, args.a_max_steps, args.a_eval_every, args.a_min_steps, args.a_patience = 8, 2, 2, 1, 1
        args.eval_over = {"samples_per_prompt": 4, "k": [1, 4]}
    args.seeds = [int(s) for s in args.seeds.split(",")]
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if args.replot:
        replot(args.out)
        return
    t0 = time.perf_counter()
    base = load_base(args.spec)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.a_checkpoint:
        a = {"spec": str(args.spec), "checkpoint": str(Path(args.a_checkpoint).resolve()), "skipped": True}
    else:
        a = phase_a(args, base)
    (args.out / "phase_a.json").write_text(json.dumps(a, indent=1))
    arm_list = arms(args, base)
    print("phase (b) arms:")
    print_table(arm_list, ["arm", "prompts_per_step", "samples_per_step", "lr", "eval_every", "max_steps"], 6)
    runs = []
    for seed in args.seeds:
        for arm in arm_list:
            runs.append((arm, seed, phase_b(args, arm, seed, a["checkpoint"])))
    evals, steps = tables(runs)
    summary = summarise(arm_list, evals, steps)
    kmax = max(int(k.split("@")[1]) for k in evals[0] if k.startswith("eval/pass@"))
    write_csv(args.out / "evals.csv", evals)
    write_csv(args.out / "steps.csv", steps)
    write_csv(args.out / "summary.csv", summary)
    meta = {"spec": str(args.spec), "shape": args.shape, "budget": args.budget, "seeds": args.seeds,
            "quick": args.quick, "threads": args.threads, "wall_s": time.perf_counter() - t0,
            "phase_a": {k: v for k, v in a.items() if k != "evals"}, "arms": summary}
    (args.out / "summary.json").write_text(json.dumps(meta, indent=1))
    plot(arm_list, evals, args.out / "replication.png", kmax, plot_title(meta))
    print(f"\nPhase (b), mean over {len(args.seeds)} seed(s) (std in the CSV):")
    print_table(summary, ["arm", "steps mean", "samples mean", "step_time_s mean", "eval/pass@1 start",
                          "eval/pass@1 end", "eval/pass@1 end std", f"eval/pass@{kmax} end", "keep_rate",
                          "frac_all_wrong"], 3)
    print(f"\nwrote {args.out}/ (phase_a.json, evals.csv, steps.csv, summary.json, summary.csv, "
          f"replication.png) in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
