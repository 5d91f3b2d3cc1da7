"""Task configs are bounded for every registered task, and tasks are built in a child process
with a time and a memory limit that a stop (a cancel) cuts short."""

from __future__ import annotations

import time

import pytest
from reasoning_gym.factory import DATASETS

from trainer import tasks
from trainer.spec import ReasoningGymTask, TaskSpec
from trainer.stop import StopRequested
from trainer.tasks.config_limits import ConfigProblem, check_config, field_cap
from trainer.tasks.isolated import TaskBuildError, hardest_variant, run_isolated


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_task_default_config_is_within_bounds(name):
    # The bounds must never refuse what reasoning-gym itself ships as the default.
    try:
        check_config(name, {})
    except ConfigProblem as exc:
        assert exc.field == "task.reasoning_gym.config" and name == "composite", exc


def test_bounds_scale_with_the_default():
    assert field_cap("chain_sum", "max_digits", 4) == 100  # the floor
    assert field_cap("count_primes", "max_n", 10_000) == 100_000
    assert field_cap("tower_of_hanoi", "max_disks", 7) == 12  # exponential: a table entry
    assert field_cap("x", "ranges", [(0.0, 25.0)]) == 250


def test_hardest_variant_raises_each_min_to_its_max():
    assert hardest_variant({"min_terms": 2, "max_terms": 9, "max_digits": 4}) == {
        "min_terms": 9, "max_terms": 9, "max_digits": 4, "min_digits": 4}
    assert hardest_variant({"allow_negation": True}) is None


def test_a_config_that_raises_anything_is_a_problem_with_the_config():
    with pytest.raises(ValueError, match="task.reasoning_gym.config: invalid for calendar"):
        ReasoningGymTask(name="calendar_arithmetic", config={"tasks": [1]})


def _slow_spec() -> TaskSpec:
    # Within the bounds, yet minutes of work: a few 12x12 futoshiki boards.
    return TaskSpec(reasoning_gym={"name": "futoshiki", "train_size": 50, "eval_size": 5,
                                   "config": {"min_board_size": 12, "max_board_size": 12}})


def test_a_build_past_its_time_limit_fails_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("BRORL_TASK_BUILD_TIMEOUT_S", "2")
    start = time.monotonic()
    with pytest.raises(TaskBuildError, match="futoshiki took longer than 2 s"):
        tasks.build_task(_slow_spec(), seed=0)
    assert time.monotonic() - start < 20


def test_a_stop_kills_the_build_within_a_poll():
    started = time.monotonic()

    def stop_after_one_second() -> None:
        if time.monotonic() - started > 1:
            raise StopRequested

    with pytest.raises(StopRequested):
        tasks.build_task(_slow_spec(), seed=0, stop_check=stop_after_one_second)
    assert time.monotonic() - started < 10


def test_memory_past_the_limit_fails_the_build_not_the_caller():
    with pytest.raises(TaskBuildError, match="needed more than 256 MiB"):
        run_isolated(bytearray, (2 * 1024**3,), what="building a big buffer", timeout_s=30,
                     memory_mb=256)


def test_a_huge_power_holding_the_gil_does_not_block_the_caller():
    # 10**(10**12) never returns and holds the GIL in the child; the parent keeps running.
    ticks = []
    start = time.monotonic()
    with pytest.raises(TaskBuildError, match="took longer than 2 s"):
        run_isolated(pow, (10, 10**12), what="building a huge power", timeout_s=2, memory_mb=512,
                     stop_check=lambda: ticks.append(time.monotonic()))
    assert len(ticks) >= 4 and time.monotonic() - start < 20
