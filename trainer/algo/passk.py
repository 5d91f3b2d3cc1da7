"""pass@k: the unbiased estimator of Chen et al. (2021) from n samples with c correct.

pass@k = 1 - C(n-c, k) / C(n, k), the probability that k samples drawn without replacement
from the n contain at least one correct one. Computed as the product
prod_{i=n-c+1}^{n} (1 - k / i), which never forms the (huge) binomials.
"""
from __future__ import annotations

from typing import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt: n samples, c of them correct, 1 <= k <= n."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def pass_at_k_mean(correct_counts: Iterable[int], n: int, k: int) -> float:
    """Mean pass@k over prompts, each with n samples and correct_counts[i] correct."""
    counts = [int(c) for c in correct_counts]
    if not counts:
        return 0.0
    return sum(pass_at_k(n, c, k) for c in counts) / len(counts)
