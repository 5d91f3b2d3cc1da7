"""pass@k against brute-force enumeration of k-subsets."""
import itertools
import math

import pytest

from trainer.algo.passk import pass_at_k, pass_at_k_mean


def _brute(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute(n, c, k), abs=1e-12)


def test_large_n_stable_and_matches_binomials():
    n, c, k = 512, 3, 16
    want = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(want, rel=1e-12)
    assert pass_at_k(4096, 0, 64) == 0.0 and pass_at_k(4096, 4096 - 63, 64) == 1.0


def test_pass_at_1_is_fraction_correct():
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)


def test_mean_and_errors():
    assert pass_at_k_mean([0, 4, 2], 4, 2) == pytest.approx((0 + 1 + _brute(4, 2, 2)) / 3)
    assert pass_at_k_mean([], 4, 1) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
