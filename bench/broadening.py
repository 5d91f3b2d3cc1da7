"""When does broadening pay? (issue 12, items 1-2): the measured regime and the theory map.

    .venv/bin/python bench/broadening.py theory     # token-level simulation map, ~1-3 min
    .venv/bin/python bench/broadening.py measure --difficulty hard [--seeds 0,1,2] [--budget 8192]
    .venv/bin/python bench/broadening.py plot       # the map: measured next to the theory

`theory`: trainer/simulate.py (the paper's section 4.1 setting) with the correct tokens' initial
logit swept, so the initial correct mass Q0 runs from hard (~0.01) to easy (~0.6); for each Q0 and
N in --ns, `--steps` AdamW steps; the gain is Q_pos(N) - Q_pos(16) at the end, both at equal
steps (the paper's Figure 3 protocol) and at equal samples (N = 16 runs N_large/16 x the steps).
`measure`: builtin:tiny on reasoning-gym chain_sum at a --difficulty (open question space, eval
disjoint from training; base spec examples/chain_sum.yaml with the HF engine): (a) N = 16 x 32
prompts until eval pass@1 plateaus (bench/replicate.py's rule), then (b) from that checkpoint,
per seed, N = 16, 128 and 512 at equal samples per step (512: 32, 4 and 1 prompts, so the same lr)
until each has generated --budget samples. Held-out pass@1/pass@k, keep rate, all-wrong fraction,
samples and seconds per arm, mean and spread over seeds (bench/replicate.py's summary).
Writes bench/out/broadening/{theory.json, <difficulty>/summary.json, ..., map.png}.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, REPO, load_base, print_table, pyplot, write_csv  # noqa: E402

DIFFICULTY = {  # chain_sum configs, easy -> hard
    "easy": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
    "mid": {"min_terms": 2, "max_terms": 3, "max_digits": 1},
    "hard": {"min_terms": 2, "max_terms": 3, "max_digits": 2},
}
BASE = REPO / "examples" / "chain_sum.yaml"


def theory(args) -> None:
    from trainer.simulate import SimConfig, make_layout, q_pos, run

    rows = []
    for logit in args.logits:
        cfg = SimConfig(correct_logit=logit, steps=args.steps, theorem_steps=())
        layout = make_layout(cfg)
        q0 = q_pos(layout.z0, layout.correct)
        base = {}
        for n in args.ns:
            base[n] = run(cfg, n, layout)["final"]["q_pos"]
        # Equal samples: N = 16 gets (N / 16) x the steps of the wide run.
        long16 = {n: run(SimConfig(correct_logit=logit, steps=args.steps * n // 16, theorem_steps=()), 16,
                         layout)["final"]["q_pos"] for n in args.ns if n > 16}
        for n in args.ns:
            rows.append({"correct_logit": logit, "q0": q0, "n": n, "q_end": base[n],
                         "gain_vs_16_equal_steps": base[n] - base[16],
                         "gain_vs_16_equal_samples": base[n] - long16[n] if n > 16 else 0.0})
        print(f"Q0 {q0:.4f}: " + ", ".join(f"N={n} {base[n]:.4f}" for n in args.ns), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "theory.csv", rows)
    (args.out / "theory.json").write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=1))
    print_table(rows, list(rows[0]), 4)


def measure(args) -> None:
    import replicate as rep

    base = load_base(BASE)
    spec_path = args.out / args.difficulty / "spec.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    base["rollout"]["engine"] = "hf"
    base["task"]["reasoning_gym"]["config"] = DIFFICULTY[args.difficulty]
    base["eval"].update({"every": 5, "temperature": 1.0, "k": [1, 4, 16], "samples_per_prompt": 16})
    base["task"]["reasoning_gym"]["eval_size"] = args.eval_size
    spec_path.write_text(json.dumps(base))
    ns = SimpleNamespace(spec=spec_path, threads=args.threads, timeout=args.timeout, out=args.out / args.difficulty,
                         n_small=16, a_prompts=32, a_max_steps=args.a_max_steps, a_eval_every=5,
                         a_min_steps=10, a_patience=2, a_min_delta=0.02, budget=args.budget)
    a = rep.phase_a(ns, base)
    (ns.out / "phase_a.json").write_text(json.dumps(a, indent=1))
    arms = []
    for n in args.arms:
        prompts = max(1, 512 // n)
        steps = math.ceil(args.budget / (n * prompts))
        every = max(1, steps // 4)
        arms.append({"arm": f"N={n}", "n": n, "prompts_per_step": prompts, "samples_per_step": n * prompts,
                     "lr": base["optim"]["lr"], "eval_every": every, "max_steps": every * math.ceil(steps / every)})
    runs = [(arm, seed, rep.phase_b(ns, arm, seed, a["checkpoint"])) for seed in args.seeds for arm in arms]
    evals, steps = rep.tables(runs)
    summary = rep.summarise(arms, evals, steps)
    write_csv(ns.out / "evals.csv", evals)
    write_csv(ns.out / "steps.csv", steps)
    (ns.out / "summary.json").write_text(json.dumps({"difficulty": args.difficulty, "config": DIFFICULTY[args.difficulty],
                                                    "budget": args.budget, "seeds": args.seeds,
                                                    "phase_a": {k: v for k, v in a.items() if k != "evals"},
                                                    "phase_a_evals": a.get("evals"), "arms": summary}, indent=1))
    print_table(summary, ["arm", "eval/pass@1 start", "eval/pass@1 end", "eval/pass@1 end std",
                          "eval/pass@16 end", "keep_rate", "frac_all_wrong", "samples mean", "step_time_s mean"], 3)


def plot(args) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    th = json.loads((args.out / "theory.json").read_text())["rows"]
    for n in sorted({r["n"] for r in th if r["n"] > 16}):
        pts = sorted((r["q0"], r["gain_vs_16_equal_samples"]) for r in th if r["n"] == n)
        ax1.plot(*zip(*pts), marker="o", label=f"N={n} vs 16, equal samples")
    ax1.set(xscale="log", xlabel="initial correct mass Q0", ylabel="gain in Q_pos",
            title="theory (token-level simulation)")
    ax1.axhline(0, color="grey", lw=0.5)
    ax1.legend()
    for d in DIFFICULTY:
        f = args.out / d / "summary.json"
        if not f.exists():
            continue
        arms = {a["arm"]: a for a in json.loads(f.read_text())["arms"]}
        if "N=16" not in arms:
            continue
        x = arms["N=16"]["eval/pass@1 start"]
        for name, a in arms.items():
            if name != "N=16":
                ax2.scatter(x, a["eval/pass@1 end"] - arms["N=16"]["eval/pass@1 end"], label=f"{d}: {name}")
    ax2.axhline(0, color="grey", lw=0.5)
    ax2.set(xlabel="pass@1 at the plateau", ylabel="pass@1 gain over N=16 (equal samples)",
            title="measured (builtin:tiny, chain_sum)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "map.png", dpi=110)
    print(f"wrote {args.out / 'map.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["theory", "measure", "plot"])
    ap.add_argument("--out", type=Path, default=OUT / "broadening")
    ap.add_argument("--logits", type=lambda s: [float(x) for x in s.split(",")], default=[-2.0, 0.0, 1.5, 3.0])
    ap.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[16, 128, 512])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--difficulty", choices=list(DIFFICULTY), default="hard")
    ap.add_argument("--arms", type=lambda s: [int(x) for x in s.split(",")], default=[16, 128, 512])
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=8192, help="generated samples per continuation")
    ap.add_argument("--a-max-steps", type=int, default=60)
    ap.add_argument("--eval-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    {"theory": theory, "measure": measure, "plot": plot}[args.what](args)


if __name__ == "__main__":
    main()
