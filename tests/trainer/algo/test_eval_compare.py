"""An evaluation's figures: intervals on hand-computed cases, paired deltas, prompts gained and
lost, and both "best checkpoint" rules."""
from __future__ import annotations

import pytest

from trainer.algo.eval_compare import (best_from_training, best_of, delta_intervals, pass_at_k_intervals,
                                       prompt_changes)


def test_the_interval_of_one_solved_prompt_in_ten_is_the_bootstrap_binomial():
    """Ten prompts, one always solved (c = n), nine never: a resample's mean is X / 10 with
    X ~ Binomial(10, 0.1). P(X = 0) = 0.349 > 2.5 %, so the low end is 0; P(X <= 2) = 0.930 and
    P(X <= 3) = 0.987 straddle 97.5 %, so the high end is 0.3, whatever the seed."""
    for seed in (0, 1, 2):
        out = pass_at_k_intervals([4] + [0] * 9, n=4, ks=[1, 2], seed=seed)
        assert out["1"] == {"mean": pytest.approx(0.1), "lo": 0.0, "hi": pytest.approx(0.3)}
        assert out["2"]["mean"] == pytest.approx(0.1)


def test_an_interval_over_identical_prompts_has_no_width_and_pass_at_k_is_unbiased():
    out = pass_at_k_intervals([2, 2, 2], n=4, ks=[1, 2, 4])
    assert out["1"] == {"mean": pytest.approx(0.5), "lo": pytest.approx(0.5), "hi": pytest.approx(0.5)}
    assert out["2"]["mean"] == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert out["4"]["mean"] == pytest.approx(1.0)


def test_the_delta_is_paired_by_prompt():
    """Prompts of very different difficulty, each up by exactly 1/4: separate intervals would
    overlap widely, the paired delta is exactly 0.25 wide zero."""
    base = [0, 1, 2, 3, 0, 1, 2, 3]
    better = [c + 1 for c in base]
    delta = delta_intervals(base, better, n=4, ks=[1])["1"]
    assert delta == {"mean": pytest.approx(0.25), "lo": pytest.approx(0.25), "hi": pytest.approx(0.25)}
    separate = pass_at_k_intervals(base, 4, [1])["1"], pass_at_k_intervals(better, 4, [1])["1"]
    assert separate[0]["hi"] > separate[1]["lo"]  # the unpaired view could not tell them apart


def test_a_delta_on_one_gained_prompt_of_two_spans_zero_to_one():
    """diffs [0, 1]: a resample's mean is 0 (1/4), 0.5 (1/2) or 1 (1/4): the 95 % band is [0, 1]."""
    delta = delta_intervals([0, 0], [0, 4], n=4, ks=[1])["1"]
    assert delta == {"mean": pytest.approx(0.5), "lo": 0.0, "hi": 1.0}


def test_counts_must_fit_n_and_prompts_must_match():
    with pytest.raises(ValueError):
        pass_at_k_intervals([5], n=4, ks=[1])
    with pytest.raises(ValueError):
        delta_intervals([1, 2], [1], n=4, ks=[1])


def test_prompts_gained_and_lost():
    changes = prompt_changes([0, 0, 3, 2, 1], [2, 0, 0, 4, 1])
    assert changes == {"gained": [0], "lost": [2], "better": 2, "worse": 1}


def test_best_from_training_takes_the_highest_eval_at_a_stored_checkpoint_earliest_on_ties():
    metrics = [(0, {"eval/pass@1": 0.2}), (10, {"eval/pass@1": 0.5, "loss": 1}), (20, {"eval/pass@1": 0.5}),
               (25, {"loss": 0.3}), (30, {"eval/pass@1": 0.4})]
    step, why = best_from_training([10, 20, 30], metrics)
    assert step == 10 and "0.5" in why and "step 10" in why
    # A checkpoint without an eval at its own step cannot be judged; a pruned one cannot be chosen.
    step, why = best_from_training([25, 30], [*metrics, (5, {"eval/pass@1": 0.9})])
    assert step == 30 and "step 5 scored 0.9" in why
    assert best_from_training([25], metrics) is None
    assert best_from_training([], metrics) is None


def test_best_of_an_evaluation_ignores_the_base():
    row = lambda step, p: {"step": step, "pass_at_k": {"1": {"mean": p}}}  # noqa: E731
    assert best_of([row(None, 0.9), row(10, 0.4), row(20, 0.6), row(30, 0.6)])["step"] == 20
    assert best_of([row(None, 0.9)]) is None
