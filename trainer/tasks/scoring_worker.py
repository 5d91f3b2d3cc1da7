"""What runs inside a scoring worker process: the verifier cache, the per-sample timer, a chunk.

A worker rebuilds the verifier from its `VerifierSpec` once (some reasoning-gym datasets are
slow to create) and then scores chunks of samples. Each sample runs under a SIGALRM timer
that interrupts pure-Python hangs (sleeps, loops, sympy) after `timeout_s`, so the rest of
the chunk goes on. Hangs inside C code ignore the timer; the parent's hard timeout on the
whole chunk (pebble kills the process) catches those, see `trainer.tasks.scoring`.
"""
from __future__ import annotations

import importlib
import signal
import time
from typing import Any, Callable

from trainer.tasks.base import Verifier, VerifierSpec
from trainer.tasks.prompts import extract_answer

OK, TIMEOUT, ERROR = 0, 1, 2

Item = tuple[str, str, dict]  # (completion, reference answer, payload)


def _import(ref: str) -> Callable:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _callable_verifier(options: dict[str, Any]) -> Verifier:
    # Extension point (and the tests' way in): "package.module:function" with the Verifier
    # signature, importable in the worker.
    return _import(options["ref"])


BUILDERS: dict[str, Callable[[dict[str, Any]], Verifier]] = {
    "reasoning_gym": lambda options: _import("trainer.tasks.reasoning_gym_task:make_verifier")(options),
    "dataset": lambda options: _import("trainer.tasks.dataset_task:make_verifier")(options),
    "callable": _callable_verifier,
}

_VERIFIERS: dict[VerifierSpec, Verifier] = {}


def get_verifier(spec: VerifierSpec) -> Verifier:
    """The process's verifier for `spec`, built on first use."""
    if spec not in _VERIFIERS:
        _VERIFIERS[spec] = BUILDERS[spec.kind](spec.options)
    return _VERIFIERS[spec]


class SampleTimeout(BaseException):
    """Raised by the timer. A BaseException, so verifiers' `except Exception` cannot eat it."""


_armed = False


def _on_alarm(signum, frame) -> None:
    # Ignore a late alarm that lands after the sample finished (between return and disarm).
    if _armed:
        raise SampleTimeout()


def init_worker(spec: VerifierSpec) -> None:
    """Pool initializer: install the timer and build the verifier before any deadline runs."""
    signal.signal(signal.SIGALRM, _on_alarm)
    extract_answer("")  # imports reasoning-gym (~1 s) now, not inside a sample's deadline
    try:
        get_verifier(spec)
    except Exception:  # noqa: BLE001 - a failing initializer makes pebble respawn forever;
        pass  # the error surfaces per chunk instead (and the parent built it once already)


def _timed(fn: Callable[[], float], timeout_s: float | None) -> float:
    global _armed
    if timeout_s is None:
        return fn()
    _armed = True
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn()
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _clamp(score: Any) -> float:
    value = float(score)
    if value != value:  # NaN: a broken verifier, not a score
        raise ValueError("verifier returned NaN")
    return min(1.0, max(0.0, value))


def score_item(verifier: Verifier, item: Item, timeout_s: float | None) -> tuple[float, int]:
    """(score, status) of one sample; a missing <answer> scores 0 without asking the verifier."""
    completion, answer, payload = item

    def run() -> float:
        extracted = extract_answer(completion)
        return 0.0 if extracted is None else _clamp(verifier(extracted, answer, payload))

    try:
        return _timed(run, timeout_s), OK
    except SampleTimeout:
        return 0.0, TIMEOUT
    except Exception:  # noqa: BLE001 - any verifier failure scores 0 and is counted
        return 0.0, ERROR


def score_chunk(spec: VerifierSpec, items: list[Item], timeout_s: float | None,
                budget_s: float = float("inf")) -> list[tuple[float, int]]:
    """Scores of a prefix of `items`: it stops starting samples once `budget_s` has passed.

    The budget keeps a slow but healthy chunk well inside the parent's hard timeout; the
    parent resubmits whatever was not reached. At least one sample is always scored.
    """
    verifier = get_verifier(spec)
    start = time.monotonic()
    out = []
    for item in items:
        if out and time.monotonic() - start > budget_s:
            break
        out.append(score_item(verifier, item, timeout_s))
    return out
