"""The probe's figures and its recommendation on constructed counts (no model, no torch work).

The curve against brute-force enumeration of k-subsets on small n; the solvable-all-wrong share
against its definition; the rule's cases: a flat curve stays narrow, many prompts that 16
samples miss but n solve broaden, nothing within reach says broadening cannot help.
"""
import itertools

import pytest

from trainer.algo.probe_stats import bootstrap_band, curve, figures, powers_of_two, solvable_all_wrong
from trainer.algo.recommend import BROADEN_MIN, broad_n, recommend
from trainer.algo.schedule import stage_lr
from trainer.probe import chunk_plan
from trainer.probe_spec import ProbeSpec, base_job_spec
from trainer.spec import JobSpec

TASK = {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
                          "train_size": 200, "eval_size": 64}}


def _brute_mean(counts, n, k):
    """Mean over prompts of the share of k-subsets holding a correct sample, by enumeration."""
    out = []
    for c in counts:
        samples = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(range(n), k))
        out.append(sum(any(samples[i] for i in s) for s in subsets) / len(subsets))
    return sum(out) / len(out)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_curve_matches_brute_force(n):
    counts = list(range(n + 1)) + [0, 1]
    got = curve(counts, n)
    assert list(got) == [str(k) for k in powers_of_two(n)]
    for k, row in got.items():
        assert row["mean"] == pytest.approx(_brute_mean(counts, n, int(k)), abs=1e-12)
        assert row["lo"] <= row["mean"] + 1e-12 and row["mean"] <= row["hi"] + 1e-12


def test_solvable_all_wrong_is_pass_at_n_minus_pass_at_k():
    n, counts = 8, [0, 1, 2, 8, 3, 0]
    for k in (1, 2, 4):
        want = sum(1 for c in counts if c > 0) / len(counts) - _brute_mean(counts, n, k)
        assert solvable_all_wrong(counts, n, k) == pytest.approx(want, abs=1e-12)
    assert solvable_all_wrong(counts, n, 8) is None  # k >= n: nothing beyond k to solve


def test_bootstrap_band_narrows_with_more_prompts_and_is_reproducible():
    few, many = [0.0, 1.0] * 4, [0.0, 1.0] * 200
    lo_f, hi_f = bootstrap_band(few, seed=3)
    lo_m, hi_m = bootstrap_band(many, seed=3)
    assert hi_m - lo_m < (hi_f - lo_f) / 3
    assert bootstrap_band(few, seed=3) == (lo_f, hi_f)
    assert bootstrap_band([0.5] * 10) == (0.5, 0.5)


@pytest.mark.parametrize("prompts,n,chunk", [(5, 32, 64), (3, 100, 64), (1, 4096, 1024), (7, 64, 64)])
def test_chunk_plan_covers_each_prompt_n_times_within_the_bound(prompts, n, chunk):
    seen = [0] * prompts
    for idx, count in chunk_plan(prompts, n, chunk):
        assert len(idx) * count <= max(chunk, n if n <= chunk else chunk)
        for p in idx:
            seen[p] += count
    assert seen == [n] * prompts


def _base(**schedule) -> JobSpec:
    stage = {"n": 16, "prompts_per_step": 32, "steps": 100, **schedule}
    return JobSpec(name="t", task=TASK, rollout={"schedule": [stage], "max_new_tokens": 32},
                   optim={"lr": 1e-4})


def _figures(counts, n, truncated=0.0):
    fig = figures(counts, n, [c / n for c in counts])
    fig["truncated_frac"] = truncated
    return fig


def test_flat_curve_stays_narrow():
    # Every prompt either solved often (found by 16 samples) or never: pass@k flat beyond 16.
    n = 512
    counts = [200] * 40 + [0] * 24
    rec = recommend(_figures(counts, n), _base())
    assert rec["verdict"] == "narrow" and not rec["broaden"]
    assert rec["schedule"] == [{"n": 16, "prompts_per_step": 32, "steps": 100, "lr": 1e-4}]
    assert rec["figures"]["solvable_all_wrong@16"] < 0.01
    assert "cost pass@1" in rec["reason"]
    assert JobSpec.model_validate(rec["spec"]).rollout.schedule[0].n == 16


def test_many_solvable_all_wrong_prompts_broaden():
    # Half the prompts are solved 2 times in 512: 16 samples almost always miss them.
    n = 512
    counts = [2] * 32 + [300] * 32
    fig = _figures(counts, n)
    assert fig["solvable_all_wrong"]["16"] > BROADEN_MIN
    rec = recommend(fig, _base())
    assert rec["verdict"] == "broaden" and rec["broaden"]
    stage = rec["schedule"][0]
    assert stage["n"] == broad_n(fig["pass_at_k"], n) and 64 <= stage["n"] <= 512
    assert stage["prompts_per_step"] == 32  # prompts kept (results.md 6a)
    base = _base()
    assert stage["lr"] == pytest.approx(stage_lr(base, stage["n"] * 32, 32))
    spec = JobSpec.model_validate(rec["spec"])
    assert spec.rollout.schedule[0].n == stage["n"] and spec.optim.lr == pytest.approx(stage["lr"])


def test_paper_lr_rule_raises_the_broad_stages_lr():
    counts = [2] * 32 + [300] * 32
    base = JobSpec(name="t", task=TASK, rollout={"schedule": [{"n": 16, "prompts_per_step": 32, "steps": 10}],
                                                 "max_new_tokens": 32},
                   optim={"lr": 1e-4, "lr_batch": "samples"})
    rec = recommend(_figures(counts, 512), base)
    assert rec["schedule"][0]["lr"] == pytest.approx(1e-4 * (rec["schedule"][0]["n"] / 16) ** 0.5)


def test_middle_share_broadens_on_a_plateau():
    counts = [6] * 12 + [300] * 52  # ~15 % all-wrong at 16 yet solved
    rec = recommend(_figures(counts, 512), _base())
    assert rec["verdict"] == "narrow_then_broaden" and not rec["broaden"]
    b = JobSpec.model_validate(rec["spec"]).rollout.broaden
    assert b is not None and b.prompts == "keep_prompts" and b.max_n >= 64


def test_out_of_reach_and_truncation_say_broadening_will_not_help():
    rec = recommend(_figures([0] * 60 + [1] * 2, 512), _base())
    assert rec["verdict"] == "out_of_reach" and "will not help" in rec["reason"]
    rec = recommend(_figures([2] * 32 + [300] * 32, 512, truncated=0.8), _base())
    assert rec["verdict"] == "fix_truncation" and not rec["broaden"]
    rec = recommend(_figures([3, 5], 16), _base())
    assert rec["verdict"] == "probe_more"


def test_probe_spec_names_bad_fields():
    from pydantic import ValidationError

    from trainer.spec import spec_errors

    for body, field in [({"task": TASK, "n": 5000}, "n"), ({"n": 64}, "task"),
                        ({"task": TASK, "max_new_tokens": 8}, "max_new_tokens"),
                        ({"task": TASK, "prompts": 0}, "prompts")]:
        with pytest.raises(ValidationError) as err:
            ProbeSpec.model_validate(body)
        assert field in [e["field"] for e in spec_errors(err.value)], body
    ref = ProbeSpec.model_validate({"model": {"job": "job_X", "step": 4}})
    assert ref.task is None and ref.n == 512 and ref.prompts == 64
    base = base_job_spec(ProbeSpec.model_validate({"task": TASK, "max_new_tokens": 40, "seed": 3}))
    assert base.seed == 3 and base.rollout.max_new_tokens == 40
