"""The built-in verifiers' scorers stay bounded: a process that meets many verifier configs
(the API serving every tenant's `type: verifier` graders) keeps at most `max_entries`
process pools, closes the least recently used to make room and the idle ones at the next
use (every distinct config used to leave two scorer processes in the API forever)."""
from __future__ import annotations

import time

import psutil
import pytest

from trainer.graders.verifier_cache import VerifierScorers
from trainer.tasks.base import VerifierSpec

pytestmark = pytest.mark.timeout(120)


def spec(tolerance: float) -> VerifierSpec:
    return VerifierSpec.of("dataset", verifier="numeric", numeric_tolerance=tolerance)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def rows(answer: str = "4") -> list:
    return [("<answer>4</answer>", answer, {})]


def test_at_most_max_entries_and_the_evicted_ones_stop():
    """A third config evicts the first: the process count stays where two put it (the
    processes every scorer shares, such as multiprocessing's helpers, aside)."""
    before = children()
    cache = VerifierScorers(max_entries=2, timeout_s=5.0)
    try:
        first = cache.score_each(spec(0.1), rows())
        one = children() - before
        cache.score_each(spec(0.2), rows())
        two = children() - before
        cache.score_each(spec(0.3), rows())
        three = children() - before
        assert len(cache) == 2
        assert first[0][0] == 1.0 and cache.score_each(spec(0.3), rows("banana"))[0][0] == 0.0
        assert len(two) > len(one) and len(three) == len(two), (one, two, three)
        shared = one & two & three
        assert (one - shared) and not (one - shared) & three, "the evicted scorer lives on"
    finally:
        cache.close()
    assert children() - before <= shared


def test_idle_scorers_are_closed_at_the_next_use():
    cache = VerifierScorers(max_entries=4, idle_s=0.2, timeout_s=5.0)
    try:
        cache.score_each(spec(0.1), rows())
        cache.score_each(spec(0.2), rows())
        time.sleep(0.3)
        cache.score_each(spec(0.3), rows())
        assert len(cache) == 1
    finally:
        cache.close()
