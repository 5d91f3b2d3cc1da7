"""From a probe's pass@k curve to a schedule: will broad exploration pay on this model and task?

Pure (no torch): the API, the CLI and the dashboard show the same call. The rule, in order
(docs/probe.md has it with the measurements behind each number):

1. Responses cut at max_new_tokens (truncated share >= 0.5): fix that first; no figure of the
   curve means much while most answers are never finished.
2. A probe of n <= 16 cannot see past N = 16: probe again with n >= 256.
3. Nothing within reach (pass@n < 0.05): no N makes rewards appear; broadening cannot help.
4. S16 = the share of prompts all-wrong at 16 samples yet solved within n (= pass@n - pass@16):
   Theorem 1's unsampled correct mass made visible. An all-wrong group gives no positive signal
   (P_pos = 0), so for those prompts only the unsampled coupling acts; a larger N samples them.
   - S16 >= BROADEN_MIN (0.30): broaden now, to the N where the curve flattens (the smallest
     power of two >= 64 within 0.02 of pass@n, at most 512), keeping prompts per step.
   - WATCH_MIN (0.10) <= S16 < 0.30: stay narrow, broaden on a plateau (`rollout.broaden`).
   - S16 < 0.10: stay narrow; broadening is expected to cost pass@1.
   The thresholds come from docs/results.md section 6c's measured map (equal samples per step,
   from an N = 16 plateau, builtin:tiny on chain_sum): N = 512's pass@1 against N = 16 was -0.085
   at S16 ~ 0 (closed demo table), -0.077 at S16 = 0.07 (easy) and -0.020 +- 0.033 at S16 = 0.30
   (hard; N = 128: +0.003): the loss shrinks as S16 grows and vanished within noise at 0.30.
   Beyond 0.30 the rule extrapolates the paper's claim; the one point measured there since (a
   regenerated hard plateau, S16 0.40, docs/probe.md) still had N = 512 at -0.012 +- 0.008
   (3 seeds, N = 128 tied N = 16), so the reason says broadening should cost little, not that
   it wins.
The lr is the project's rule (trainer.algo.schedule.stage_lr) for the recommended stage against
the base spec's first stage; prompts per step stay the first stage's (results.md 6a: broad
stages that cut prompts lost what the narrow stage had learned).
"""
from __future__ import annotations

from typing import Any

from trainer.algo.schedule import stage_lr
from trainer.spec import JobSpec

TRUNCATED_MAX = 0.5
REACH_MIN = 0.05
BROADEN_MIN = 0.30
WATCH_MIN = 0.10
FLAT_WITHIN = 0.02
BROAD_N_MIN, BROAD_N_MAX = 64, 512
NARROW_N = 16


def broad_n(pass_at_k: dict[str, dict[str, float]], n: int) -> int:
    """Where the curve flattens: the smallest power of two >= 64 whose pass@k is within
    FLAT_WITHIN of pass@n, at most 512 and at most the probe's n."""
    top = pass_at_k[str(n)]["mean"]
    for k in sorted(int(x) for x in pass_at_k):
        if k >= BROAD_N_MIN and pass_at_k[str(k)]["mean"] >= top - FLAT_WITHIN:
            return min(k, BROAD_N_MAX)
    return min(n, BROAD_N_MAX)


def key_figures(fig: dict[str, Any]) -> dict[str, float | None]:
    """The numbers the rule reads, named as the reason quotes them."""
    n, curve = fig["n"], fig["pass_at_k"]
    p16 = curve["16"]["mean"] if n > 16 else None
    return {"pass@1": curve["1"]["mean"], "pass@16": p16, f"pass@{n}": curve[str(n)]["mean"],
            "solvable_all_wrong@16": fig["solvable_all_wrong"].get("16"),
            "truncated_frac": fig.get("truncated_frac", 0.0)}


def _verdict(fig: dict[str, Any]) -> tuple[str, str]:
    n, k = fig["n"], key_figures(fig)
    top, s16, trunc = k[f"pass@{n}"], k["solvable_all_wrong@16"], k["truncated_frac"]
    if trunc >= TRUNCATED_MAX:
        return "fix_truncation", (f"{trunc:.0%} of the responses were cut at max_new_tokens: raise it "
                                  "and probe again before judging exploration")
    if n <= NARROW_N:
        return "probe_more", (f"a probe of n = {n} cannot see what N = 16 misses: probe again with "
                              "n >= 256")
    if top < REACH_MIN:
        return "out_of_reach", (f"pass@{n} is {top:.3f}: even {n} samples almost never find a correct "
                                "answer, so no rollout count gives a reward to learn from; broadening "
                                "will not help (use an easier task or a model that sometimes solves it)")
    head = (f"pass@1 {k['pass@1']:.3f}, pass@16 {k['pass@16']:.3f}, pass@{n} {top:.3f}: {s16:.0%} of "
            f"prompts are all-wrong at 16 samples yet solved within {n}, correct mass a N = 16 batch "
            "leaves unsampled (Theorem 1's coupling term) and only a wider batch reaches")
    if s16 >= BROADEN_MIN:
        return "broaden", (f"{head}. At this share N = 512's deficit against N = 16 at equal samples per step "
                           "had shrunk to -0.020 (S16 0.30) and -0.012 (S16 0.40) on builtin:tiny (results.md "
                           "6c, docs/probe.md): broadening should cost little, and the paper's claim is that it "
                           "wins here; at that scale it had not yet won. Broaden now, or broaden on a plateau "
                           "to hedge")
    if s16 >= WATCH_MIN:
        return "narrow_then_broaden", (f"{head}. At this share broadening measured no better than N = 16 "
                                       "(results.md 6c: -0.077 at 0.07, -0.020 at 0.30): stay narrow and "
                                       "broaden on a plateau, when N = 16 has stopped finding them")
    return "narrow", (f"{head}. So little is left for a wider batch that broadening is expected to cost "
                      "pass@1 (measured -0.085 and -0.077 at this share, results.md 6c): stay at N = 16 "
                      "and spend samples on more prompts and steps instead")


def recommend(fig: dict[str, Any], base: JobSpec) -> dict[str, Any]:
    """The recommendation for a probe's figures (`trainer.algo.probe_stats.figures` plus
    `truncated_frac`), as a schedule on top of `base` (the job the user would run)."""
    verdict, reason = _verdict(fig)
    first = base.rollout.schedule[0]
    prompts, steps = first.prompts_per_step, base.total_steps
    n = broad_n(fig["pass_at_k"], fig["n"]) if verdict == "broaden" else min(first.n, NARROW_N)
    lr = stage_lr(base, n * prompts, prompts)
    schedule = [{"n": n, "prompts_per_step": prompts, "steps": steps, "lr": lr}]
    rollout: dict[str, Any] = {"schedule": [{k: v for k, v in schedule[0].items() if k != "lr"}],
                               "broaden": None}
    evaluation = base.eval.model_dump(mode="json")
    if verdict == "narrow_then_broaden":
        top = broad_n(fig["pass_at_k"], fig["n"])
        factor = max(2, min(64, top // n))
        rollout["broaden"] = {"factor": factor, "max_n": n * factor, "prompts": "keep_prompts"}
        evaluation["every"] = evaluation["every"] or max(1, steps // 10)
        reason += f" (rollout.broaden to N = {n * factor}, where the probe's curve flattens)"
    spec = base.model_dump(mode="json")
    spec["rollout"].update(rollout)
    spec["optim"]["lr"] = lr
    spec["eval"] = evaluation
    spec = JobSpec.model_validate(spec).model_dump(mode="json")  # the recommended spec validates
    return {"verdict": verdict, "broaden": verdict == "broaden", "schedule": schedule,
            "broaden_on_plateau": rollout["broaden"], "reason": reason + ".",
            "figures": key_figures(fig), "spec": spec}
