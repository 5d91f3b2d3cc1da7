"""When does broadening pay? The measured regime and the theory map (docs/results.md, 6b-6c).

    .venv/bin/python bench/broadening.py theory     # token-level simulation map, ~1-3 min
    .venv/bin/python bench/broadening.py measure --difficulty hard [--seeds 0,1,2] [--budget 16384] [--evals 4]
    .venv/bin/python bench/broadening.py broaden --difficulty hard   # after measure: one rollout.broaden job
    .venv/bin/python bench/broadening.py plot       # the map: measured next to the theory

`theory`: trainer/sim/simulate.py (the paper's section 4.1 setting) with the correct tokens' initial
logit swept, so the initial correct mass Q0 runs from hard (~0.01) to easy (~0.6); for each Q0 and
N in --ns, `--steps` AdamW steps; the gain is Q_pos(N) - Q_pos(16) at the end, both at equal
steps (the paper's Figure 3 protocol) and at equal samples (N = 16 runs N_large/16 x the steps).
`measure`: builtin:tiny on reasoning-gym chain_sum at a --difficulty (open question space, eval
disjoint from training; base spec examples/chain_sum.yaml with the HF engine): (a) N = 16 x 32
prompts until eval pass@1 plateaus (bench/replicate.py's rule), then a probe of that checkpoint
with 512 samples per eval prompt (pass@1..512: is what N = 16 misses solvable?), then (b) from
that checkpoint, per seed, N = 16, 128 and 512 at equal samples per step (--samples-per-step
1024: 64, 8 and 2 prompts, so the same lr under the sqrt rule) until each has generated --budget
samples. Held-out pass@1/pass@k, keep rate, all-wrong fraction, samples and seconds per arm,
mean and spread over seeds (bench/replicate.py's summary).
`rule`: the probe recommendation (`brorl probe`'s code: trainer.probe + trainer.algo.recommend)
checked on a plateau checkpoint: reuses <out>/<difficulty>/phase_a.json's checkpoint when it is
still on disk, else reruns phase (a) only; `--difficulty demo` is the closed demo task of
results.md section 4 (examples/demo.yaml, bench/replicate.py's plateau rule). Writes rule.json.
`broaden`: a fourth arm from the same checkpoint that uses `rollout.broaden`: N = 16 at the
arms' samples per step, widened x8 (same samples per step) once eval pass@1 stops rising.
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
    from trainer.sim.simulate import SimConfig, make_layout, q_pos, run

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


def probe_child(cfg: dict) -> None:
    """Child: pass@k with many samples per eval prompt at a checkpoint (is the task solvable?)."""
    import torch

    from common import emit_result, make_spec
    from trainer.evaluate import evaluate_checkpoint

    torch.set_num_threads(cfg["threads"])
    spec = make_spec(load_base(cfg["spec"]), {"eval": {"samples_per_prompt": cfg["samples"], "k": cfg["k"]}})
    emit_result(evaluate_checkpoint(spec, Path(cfg["checkpoint"])))


def probe(args, spec_path: Path, checkpoint: str) -> dict:
    """eval pass@1..512 at the plateau: 1 - pass@k is the expected share of eval prompts all-wrong at k."""
    from common import run_child

    ks = [k for k in (1, 4, 16, 64, 128, 512) if k <= args.probe_samples]
    cfg = {"spec": str(spec_path), "checkpoint": checkpoint, "samples": args.probe_samples, "k": ks,
           "threads": args.threads}
    res = run_child([__file__, "--probe-child", json.dumps(cfg)], timeout=args.timeout,
                    env={"OMP_NUM_THREADS": str(args.threads)})
    print("plateau probe: " + ", ".join(f"pass@{k} {res[f'eval/pass@{k}']:.3f}" for k in ks), flush=True)
    return res


def rule_child(cfg: dict) -> None:
    """Child: the product's probe (`brorl probe`) of a checkpoint, recommended against `base`."""
    import torch

    from common import emit_result, make_spec
    from trainer.probe import probe as run_probe
    from trainer.probe_spec import ProbeSpec

    torch.set_num_threads(cfg["threads"])
    base = make_spec(load_base(cfg["spec"]), cfg["over"])
    r = base.rollout
    pspec = ProbeSpec.model_validate({
        "model": base.model.model_dump(mode="json"), "task": base.task.model_dump(mode="json"),
        "n": cfg["n"], "prompts": cfg["prompts"], "max_new_tokens": r.max_new_tokens,
        "temperature": r.temperature, "top_p": r.top_p, "seed": base.seed, "engine": r.engine})
    emit_result(run_probe(pspec, base, lambda: False, model_dir=Path(cfg["checkpoint"])))


def rule(args) -> None:
    """The rule's call on a regenerated plateau, next to the plateau's recorded probe."""
    import replicate as rep
    from common import run_child

    out = args.out / args.difficulty
    out.mkdir(parents=True, exist_ok=True)
    if args.difficulty == "demo":
        spec_path, base = rep.DEFAULT_SPEC, load_base(rep.DEFAULT_SPEC)
        plateau = {"a_min_steps": 15, "a_patience": 3}   # results.md section 4's rule
    else:
        spec_path, base = out / "spec.json", load_base(BASE)
        base["rollout"]["engine"] = "hf"
        base["task"]["reasoning_gym"]["config"] = DIFFICULTY[args.difficulty]
        base["eval"].update({"every": 5, "temperature": 1.0, "k": [1, 4, 16], "samples_per_prompt": 16})
        base["task"]["reasoning_gym"]["eval_size"] = args.eval_size
        spec_path.write_text(json.dumps(base))
        plateau = {"a_min_steps": 10, "a_patience": 2}   # section 6c's rule
    a_path = out / "phase_a.json"
    a = json.loads(a_path.read_text()) if a_path.exists() else None
    if a is None or not Path(a["checkpoint"]).exists():
        ns = SimpleNamespace(spec=spec_path, threads=args.threads, timeout=args.timeout, out=out, n_small=16,
                             a_prompts=32, a_max_steps=args.a_max_steps, a_eval_every=5, a_min_delta=0.02,
                             **plateau)
        a = rep.phase_a(ns, base)
        a_path.write_text(json.dumps(a, indent=1))
    # The recommendation's base: the continuations' N = 16 arm (64 prompts per step).
    over = {"rollout": {"schedule": [{"n": 16, "prompts_per_step": 64, "steps": 4}]}}
    cfg = {"spec": str(spec_path), "over": over, "checkpoint": a["checkpoint"], "n": args.probe_samples,
           "prompts": args.eval_size, "threads": args.threads}
    res = run_child([__file__, "--rule-child", json.dumps(cfg)], timeout=args.timeout,
                    env={"OMP_NUM_THREADS": str(args.threads)})
    rec = res.pop("recommendation")
    keep = {k: res.get(k) for k in ("n", "prompts", "pass_at_k", "solvable_all_wrong", "never_solved",
                                    "unsampled_mass", "truncated_frac", "response_len_mean", "seconds")}
    doc = {"difficulty": args.difficulty, "plateau": {k: v for k, v in a.items() if k != "probe"},
           "probe": keep, "per_prompt_correct": [p["correct"] for p in res["per_prompt"]],
           "verdict": rec["verdict"], "reason": rec["reason"], "schedule": rec["schedule"],
           "broaden_on_plateau": rec["broaden_on_plateau"]}
    (out / "rule.json").write_text(json.dumps(doc, indent=1))
    curve = res["pass_at_k"]
    print(f"{args.difficulty}: plateau pass@1 " + " -> ".join(f"{e['eval/pass@1']:.3f}" for e in a["evals"])
          + "; probe " + ", ".join(f"pass@{k} {curve[str(k)]['mean']:.3f}" for k in (1, 16, 64, 512)
                                    if str(k) in curve)
          + f"; S16 {res['solvable_all_wrong'].get('16')}; verdict {rec['verdict']}", flush=True)


def measure(args) -> None:
    import replicate as rep

    base = load_base(BASE)
    out = args.out / args.difficulty
    spec_path = out / "spec.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    base["rollout"]["engine"] = "hf"
    base["task"]["reasoning_gym"]["config"] = DIFFICULTY[args.difficulty]
    base["eval"].update({"every": 5, "temperature": 1.0, "k": [1, 4, 16], "samples_per_prompt": 16})
    base["task"]["reasoning_gym"]["eval_size"] = args.eval_size
    spec_path.write_text(json.dumps(base))
    ns = SimpleNamespace(spec=spec_path, threads=args.threads, timeout=args.timeout, out=out,
                         n_small=16, a_prompts=32, a_max_steps=args.a_max_steps, a_eval_every=5,
                         a_min_steps=10, a_patience=2, a_min_delta=0.02, budget=args.budget)
    if args.reuse_plateau and (out / "phase_a.json").exists():
        a = json.loads((out / "phase_a.json").read_text())  # the plateau and its probe, from before
    else:
        a = rep.phase_a(ns, base)
        a["probe"] = probe(args, spec_path, a["checkpoint"])
        (out / "phase_a.json").write_text(json.dumps(a, indent=1))
    arms = []
    for n in args.arms:
        # Equal samples per step (so the same lr under the sqrt rule) and equal samples in all.
        prompts = max(1, args.samples_per_step // n)
        steps = math.ceil(args.budget / (n * prompts))
        every = max(1, steps // args.evals)
        arms.append({"arm": f"N={n}", "n": n, "prompts_per_step": prompts, "samples_per_step": n * prompts,
                     "lr": base["optim"]["lr"], "eval_every": every, "max_steps": every * math.ceil(steps / every)})
    runs = []
    for seed in args.seeds:
        for arm in arms:
            runs.append((arm, seed, rep.phase_b(ns, arm, seed, a["checkpoint"])))
            # Written after every run: a long measurement stopped early still leaves its figures.
            evals, steps = rep.tables(runs)
            done = [x for x in arms if any(r[0] is x for r in runs)]
            summary = rep.summarise(done, evals, steps)
            write_csv(out / "evals.csv", evals)
            write_csv(out / "steps.csv", steps)
            (out / "summary.json").write_text(json.dumps({
                "difficulty": args.difficulty, "config": DIFFICULTY[args.difficulty], "budget": args.budget,
                "samples_per_step": args.samples_per_step, "seeds": sorted({r[1] for r in runs}),
                "phase_a": {k: v for k, v in a.items() if k != "evals"}, "phase_a_evals": a.get("evals"),
                "arms": summary}, indent=1))
    print_table(summary, ["arm", "eval/pass@1 start", "eval/pass@1 end", "eval/pass@1 end std",
                          "eval/pass@16 end", "keep_rate", "frac_all_wrong", "samples mean", "step_time_s mean"], 3)


def broaden_run(args) -> None:
    """`rollout.broaden` as a fourth arm: from the plateau checkpoint, N = 16 at the arms' samples
    per step, and the rule widens N by `--broaden-factor` (keeping the samples per step) once eval
    pass@1 has not risen by 0.02 over 2 evaluations; the same sample budget as the other arms."""
    import replicate as rep

    out = args.out / args.difficulty
    a = json.loads((out / "phase_a.json").read_text())
    prompts = args.samples_per_step // 16
    steps = math.ceil(args.budget / args.samples_per_step)
    every = max(1, steps // args.evals)
    over = {"model": {"path": a["checkpoint"]},
            "rollout": {"schedule": [{"n": 16, "prompts_per_step": prompts, "steps": steps}],
                        "broaden": {"patience": 2, "min_delta": 0.02, "factor": args.broaden_factor,
                                    "max_n": 16 * args.broaden_factor, "prompts": "keep_samples"}},
            "eval": {"every": every}, "checkpoint": {"every": 0, "keep_last": 1}}
    ns = SimpleNamespace(spec=out / "spec.json", threads=args.threads, timeout=args.timeout)
    rows = []
    for seed in args.seeds:
        res = rep.launch(ns, {**over, "seed": seed}, {"kind": "budget", "budget": args.budget},
                         out / "work" / f"broaden-seed{seed}")
        rows += [{"seed": seed, **{k: v for k, v in r.items() if k.startswith("eval/") or k in
                  ("step", "cum_samples", "cum_train_s", "n", "stage", "keep_rate", "frac_all_wrong")}}
                 for r in res["rows"]]
        ev = [r for r in res["rows"] if "eval/pass@1" in r]
        print(f"broaden seed {seed}: " + " -> ".join(f"{r['step']}:{r['eval/pass@1']:.3f}(N={r.get('n', '?')})"
                                                   for r in ev), flush=True)
    write_csv(out / "broaden.csv", rows)


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
    # The measured points: each difficulty here, plus section 4b's closed demo table (the same
    # protocol: equal samples per step and lr, from a plateau) as the easiest setting.
    sources = [(d, args.out / d / "summary.json") for d in DIFFICULTY]
    sources.append(("demo table (4b)", REPO / "docs" / "data" / "replication_equal" / "summary.json"))
    colours = {"N=128": "C0", "N=512": "C1"}  # as in the theory panel
    for (label, f), marker in zip(sources, "v^sD"):
        if not f.exists():
            continue
        arms = {a["arm"]: a for a in json.loads(f.read_text())["arms"]}
        if "N=16" not in arms:
            continue
        base = arms["N=16"]
        x = base["eval/pass@1 start"]
        for name, a in arms.items():
            if name != "N=16":
                ax2.errorbar(x, a["eval/pass@1 end"] - base["eval/pass@1 end"], yerr=a.get("eval/pass@1 end std") or 0,
                             marker=marker, color=colours.get(name, "C2"), capsize=3,
                             label=f"{label}: {name} ({a['seeds']} seeds)")
    ax2.axhline(0, color="grey", lw=0.5)
    ax2.set(xlabel="pass@1 at the plateau", ylabel="pass@1 gain over N=16 (equal samples)",
            title="measured (builtin:tiny, chain_sum)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "map.png", dpi=110)
    print(f"wrote {args.out / 'map.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if len(sys.argv) == 3 and sys.argv[1] == "--probe-child":
        return probe_child(json.loads(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "--rule-child":
        return rule_child(json.loads(sys.argv[2]))
    ap.add_argument("what", choices=["theory", "measure", "broaden", "plot", "rule"])
    ap.add_argument("--out", type=Path, default=OUT / "broadening")
    ap.add_argument("--logits", type=lambda s: [float(x) for x in s.split(",")], default=[-2.0, 0.0, 1.5, 3.0])
    ap.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[16, 128, 512])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--difficulty", choices=[*DIFFICULTY, "demo"], default="hard")
    ap.add_argument("--arms", type=lambda s: [int(x) for x in s.split(",")], default=[16, 128, 512])
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=16384, help="generated samples per continuation")
    ap.add_argument("--samples-per-step", type=int, default=1024, help="every arm's (N x prompts)")
    ap.add_argument("--evals", type=int, default=4, help="evaluations per continuation after step 0")
    ap.add_argument("--reuse-plateau", action="store_true",
                    help="measure: continue from the plateau (phase_a.json) of an earlier run")
    ap.add_argument("--probe-samples", type=int, default=512, help="samples per eval prompt at the plateau")
    ap.add_argument("--broaden-factor", type=int, default=8)
    ap.add_argument("--a-max-steps", type=int, default=60)
    ap.add_argument("--eval-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    {"theory": theory, "measure": measure, "broaden": broaden_run, "plot": plot, "rule": rule}[args.what](args)


if __name__ == "__main__":
    main()
