"""The built-in verifiers' scorers, kept warm and bounded.

A verifier grader (`type: verifier`) scores with `trainer.tasks.scoring.Scorer`, a process
pool that runs this project's verifiers (never tenant code) and costs seconds to start, so
scorers are kept by verifier spec and reused. At most `max_entries` live at once (the least
recently used one is closed to make room), and one unused for `idle_s` is closed at the next
use of the cache: a long-lived API process keeps a handful, not one per config ever seen.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any


class VerifierScorers:
    def __init__(self, max_entries: int = 4, idle_s: float | None = None,
                 timeout_s: float = 30.0):
        self.max_entries, self.idle_s, self.timeout_s = max(1, max_entries), idle_s, timeout_s
        self._scorers: OrderedDict[Any, tuple[Any, threading.Lock]] = OrderedDict()
        self._used: dict[Any, float] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._scorers)

    def _retire(self, now: float) -> list:
        """Entries to close: idle past idle_s, and the oldest over max_entries - 1."""
        gone = []
        if self.idle_s is not None:
            for spec in [s for s, used in self._used.items() if now - used > self.idle_s]:
                gone.append(self._scorers.pop(spec)[0])
                self._used.pop(spec)
        while len(self._scorers) >= self.max_entries:
            spec, (scorer, _) = self._scorers.popitem(last=False)
            self._used.pop(spec)
            gone.append(scorer)
        return gone

    def score_each(self, spec: Any, rows: list) -> list:
        """(score, status) per row; builds the spec's scorer on first use (its errors, such as
        a config the task refuses, propagate)."""
        from trainer.tasks.scoring import Scorer

        now, gone = time.monotonic(), []
        with self._lock:
            entry = self._scorers.get(spec)
            if entry is None:
                gone = self._retire(now)
        for scorer in gone:  # outside the lock: closing a pool takes a moment
            scorer.close()
        if entry is None:
            built = Scorer(SimpleNamespace(verifier_spec=spec), reward="score",
                           timeout_s=self.timeout_s)
            with self._lock:
                entry = self._scorers.setdefault(spec, (built, threading.Lock()))
            if entry[0] is not built:  # another thread built it first
                built.close()
        with self._lock:
            self._used[spec] = now
            if spec in self._scorers:
                self._scorers.move_to_end(spec)
        scorer, busy = entry
        with busy:  # one batch at a time per scorer
            return scorer.score_each(rows)

    def close(self) -> None:
        with self._lock:
            scorers = [s for s, _ in self._scorers.values()]
            self._scorers.clear()
            self._used.clear()
        for scorer in scorers:
            scorer.close()
