"""Stopping inside a long phase: `should_stop()` turned into a check that raises.

The loop polls `should_stop()` once per step, but one phase can take minutes (builtin:tiny's
warm start, a large generation, evaluation). Those phases call `stop_check()` between their
own units of work; a `StopRequested` abandons the step in progress (nothing of it is saved:
the last checkpoint stands) and `train` returns as stopped.
"""
from __future__ import annotations

from typing import Callable


class StopRequested(Exception):
    """should_stop() turned true inside a long phase."""


def stop_check(should_stop: Callable[[], bool]) -> Callable[[], None]:
    def check() -> None:
        if should_stop():
            raise StopRequested
    return check


def never() -> None:
    """The stop check of a run that nobody stops (tools, benchmarks)."""
