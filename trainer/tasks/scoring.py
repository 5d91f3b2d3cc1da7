"""Scoring a step's completions: rewards from verifiers run in a process pool with timeouts.

Design (N x prompts can be 32k samples a step, and a verifier may hang or crash):
- Samples travel in chunks, not one by one: per-sample IPC would cost more than scoring.
- Inside a worker each sample runs under a SIGALRM timer (`scoring_worker`): a pure-Python
  hang scores 0 as a timeout and the chunk goes on. A worker stops starting samples after
  `timeout_s` of work and returns what it has; the rest is resubmitted as a new chunk.
  So a healthy chunk always returns within about 2 x timeout_s.
- Each chunk also has a hard timeout (2 x timeout_s + grace) enforced by pebble, which kills
  the worker: that covers hangs in C code the timer cannot interrupt. A chunk that hits it,
  or whose worker died (os._exit, segfault), is rerun one sample per task with a hard
  timeout of timeout_s + grace, which isolates the culprit: it scores 0 and is counted;
  every other sample gets its real score. pebble replaces dead workers, so the pool keeps
  working for the next call.
- `workers=0` scores in the calling process: for debugging only, with no timeout and no
  crash protection (a hanging verifier hangs the caller).
Workers are started with "forkserver" by default, the server preloading reasoning-gym and
this package: the trainer process holds torch / CUDA / vLLM threads, and forking a threaded
process can deadlock the child, while forking the clean server makes replacing a killed
worker cost milliseconds instead of a fresh interpreter and imports ("spawn", ~1 s).
"""
from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from trainer.tasks.base import Example, Task
from trainer.tasks.scoring_worker import ERROR, OK, TIMEOUT, get_verifier, init_worker, score_chunk

CORRECT_EPS = 1e-9
MIN_CHUNK = 16
PRELOAD = ["trainer.tasks.scoring_worker", "reasoning_gym", "trainer.tasks.reasoning_gym_task"]


@dataclass
class ScoreResult:
    rewards: list[float]
    scores: list[float]  # raw verifier scores in [0, 1]; 0 for truncated samples
    correct: list[bool]  # score >= 1 - 1e-9, never for truncated samples
    timeouts: int
    errors: int
    seconds: float


def _binary(score: float, correct: bool) -> float:
    return 1.0 if correct else 0.0


def _score(score: float, correct: bool) -> float:
    return score


REWARDS: dict[str, Callable[[float, bool], float]] = {"binary": _binary, "score": _score}


def default_workers() -> int:
    return min(4, os.cpu_count() or 1)


def truncated_flags(completions: Sequence[str], examples: Sequence[Example],
                    truncated: Sequence[bool] | None) -> list[bool]:
    """The per-sample truncated flags (none: all False), after checking the three line up."""
    n = len(completions)
    flags = [False] * n if truncated is None else list(truncated)
    if not (len(examples) == n == len(flags)):
        raise ValueError(f"{n} completions, {len(examples)} examples, {len(flags)} truncated flags")
    return flags


class Scorer:
    """Scores completions of a task's examples; use as a context manager or call close().

    reward: "binary" (1 if the score is 1, else 0) or "score" (the verifier's score).
    truncated_reward: the reward of a response cut at max_new_tokens (never verified).
    workers: pool size (default min(4, cpus)); 0 scores in-process without protection.
    timeout_s: the per-sample limit; a sample over it scores 0 and counts as a timeout.
    """

    def __init__(self, task: Task, reward: str = "binary", truncated_reward: float = 0.0,
                 workers: int | None = None, timeout_s: float = 5.0, *,
                 max_chunk: int = 1024, grace_s: float | None = None,
                 start_method: str = "forkserver"):
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {reward!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.spec = task.verifier_spec
        self.reward_fn = REWARDS[reward]
        self.truncated_reward = float(truncated_reward)
        self.workers = default_workers() if workers is None else workers
        self.timeout_s = timeout_s
        self.max_chunk = max_chunk
        # Slack on top of the hard timeouts: room for IPC and a loaded machine, so that a
        # healthy chunk is not killed (which would only cost a one-by-one rerun).
        self.grace_s = max(2.0, timeout_s) if grace_s is None else grace_s
        self._start_method = start_method
        self._verifier = get_verifier(self.spec)  # fails fast, here, on a bad verifier spec
        self._pool = None
        if self.workers > 0:
            self._ensure_pool()

    # ------------------------------------------------------------------ lifecycle

    def _ensure_pool(self) -> None:
        from pebble import ProcessPool

        if self._pool is not None and self._pool.active:
            return
        context = multiprocessing.get_context(self._start_method)
        if self._start_method == "forkserver":
            # Ignored when the process's fork server is already running: workers then import
            # on start, as with spawn.
            context.set_forkserver_preload(PRELOAD)
        self._pool = ProcessPool(
            max_workers=self.workers, initializer=init_worker, initargs=(self.spec,),
            context=context)
        for _ in range(self.workers):  # start the workers now, while the caller generates
            self._pool.schedule(os.getpid)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ scoring

    def score(self, completions: Sequence[str], examples: Sequence[Example],
              truncated: Sequence[bool] | None = None) -> ScoreResult:
        """Rewards of `completions[i]` as answers to `examples[i]` (truncated ones skip the verifier)."""
        start = time.perf_counter()
        n = len(completions)
        truncated = truncated_flags(completions, examples, truncated)
        todo = [i for i in range(n) if not truncated[i]]
        items = [(completions[i], examples[i].answer, examples[i].payload) for i in todo]
        results = self.score_each(items)

        scores, statuses = [0.0] * n, [OK] * n
        for i, (score, status) in zip(todo, results):
            scores[i], statuses[i] = score, status
        correct = [not t and s >= 1.0 - CORRECT_EPS for s, t in zip(scores, truncated)]
        rewards = [self.truncated_reward if t else self.reward_fn(s, c)
                   for s, c, t in zip(scores, correct, truncated)]
        return ScoreResult(
            rewards=rewards, scores=scores, correct=correct,
            timeouts=statuses.count(TIMEOUT), errors=statuses.count(ERROR),
            seconds=time.perf_counter() - start)

    def score_each(self, items: list[tuple[str, str, dict]]) -> list[tuple[float, int]]:
        """(score, status) of each (completion, answer, payload): status OK, TIMEOUT or ERROR.

        The per-sample view the graders' `verifier` type needs (it reports each sample's error).
        """
        return self._run_local(items) if self.workers == 0 else self._run_pool(items)

    def _run_local(self, items: list) -> list[tuple[float, int]]:
        return score_chunk(self.spec, items, timeout_s=None)

    def _chunk_size(self, n: int) -> int:
        # About 4 chunks per worker balances load; the cap bounds the cost of a chunk rerun.
        return max(MIN_CHUNK, min(self.max_chunk, math.ceil(n / (4 * self.workers))))

    def _run_pool(self, items: list) -> list[tuple[float, int]]:
        self._ensure_pool()
        out: list[tuple[float, int] | None] = [None] * len(items)
        running: dict[cf.Future, tuple[list[int], bool]] = {}

        def submit(idx: list[int], single: bool) -> None:
            hard = self.timeout_s + self.grace_s if single else 2 * self.timeout_s + self.grace_s
            future = self._pool.schedule(
                score_chunk, args=(self.spec, [items[i] for i in idx], self.timeout_s, self.timeout_s),
                timeout=hard)
            running[future] = (idx, single)

        size = self._chunk_size(len(items))
        for lo in range(0, len(items), size):
            submit(list(range(lo, min(lo + size, len(items)))), single=False)
        while running:
            # Some in-flight chunk always finishes within its hard timeout; waiting far longer
            # means the pool itself broke: fail the step loudly instead of hanging it.
            stall_s = 4 * (2 * self.timeout_s + self.grace_s) + 60
            done, _ = cf.wait(running, timeout=stall_s, return_when=cf.FIRST_COMPLETED)
            if not done:
                self.close()  # the next call starts a fresh pool
                raise RuntimeError(f"scoring pool stalled: nothing finished in {stall_s:.0f} s")
            for future in done:
                idx, single = running.pop(future)
                try:
                    got = future.result()
                except Exception as exc:  # noqa: BLE001 - hard timeout, dead worker, pickling
                    if single:
                        out[idx[0]] = (0.0, TIMEOUT if isinstance(exc, TimeoutError) else ERROR)
                    else:
                        for i in idx:  # isolate the culprit
                            submit([i], single=True)
                    continue
                for i, result in zip(idx, got):
                    out[i] = result
                if len(got) < len(idx):  # the worker's budget ran out: the rest goes again
                    submit(idx[len(got):], single)
        return out  # type: ignore[return-value]
