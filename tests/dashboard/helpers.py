"""The browser tests' jobs and helpers: the two tiny specs, an API client on the stack, polling."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from cli.client import BrorlClient
from tests.support.jobs import FAKE_ENTRYPOINT
from tests.support.tinyprebuild import SHARED_SEED, shared_task
from tests.support.upstack import Stack, running_stack

SHOTS = os.environ.get("BRORL_DASHBOARD_SCREENSHOTS")


def shot(page, name: str, full_page: bool = False) -> None:
    """Saves a screenshot when BRORL_DASHBOARD_SCREENSHOTS names a folder (for people to look at)."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name), full_page=full_page)


def tiny_spec(name: str, schedule: list[dict], *, checkpoint_every: int = 4) -> dict:
    return {
        "spec_version": 1, "name": name, "seed": SHARED_SEED,
        "model": {"path": "builtin:tiny"},
        "task": shared_task(),
        "rollout": {"engine": "hf", "schedule": schedule, "max_new_tokens": 24},
        "eval": {"every": 2, "samples_per_prompt": 2, "k": [1, 2]},
        "checkpoint": {"every": checkpoint_every, "keep_last": 2},
        "algo": {"mini_batches": 1},
        "optim": {"lr": 1e-4},
    }


SPEC_A = tiny_spec("dash-a", [{"n": 4, "prompts_per_step": 2, "steps": 4},
                              {"n": 8, "prompts_per_step": 2, "steps": 4}])
SPEC_B = tiny_spec("dash-b", [{"n": 8, "prompts_per_step": 2, "steps": 4}])


def client(stack: Stack, key: str | None = None) -> BrorlClient:
    return BrorlClient(stack.url, key or stack.key, timeout=30)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(interval)


def fake_trainer_stack(tmp_path_factory, name: str, **env: str | None) -> Iterator[Stack]:
    """A module's own `brorl up` with the test trainer (tests/support/fake_trainer.py) and `env`:
    `yield from` it in a module-scoped `stack` fixture."""
    with running_stack(tmp_path_factory.mktemp(name), {"BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT, **env}) as st:
        yield st
