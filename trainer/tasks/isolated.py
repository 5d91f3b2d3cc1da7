"""Building tasks from tenant input in a child process with a time and a memory limit.

A task config decides how much work reasoning-gym does, and some of that work holds the
GIL in one C call (`10 ** n` on a huge int): run in the worker's own process it would stop
the heartbeat thread, the cancel check and, with them, the whole worker. Here the build runs
in a child process (pebble, as for the scoring pool): the caller only waits on a future,
polls its stop check meanwhile (a cancel kills the child at once), and a build that runs
past `timeout_s` or allocates past `memory_mb` fails with a `TaskBuildError` that says so.

The same function serves the API's submission check (`check_config`): the dataset and a few examples
built from the config, and from its hardest variant (each `min_x` raised to its `max_x`), so
that a config whose every example is slow is refused at submission with a 422, not after a
queue wait.

Children come from a fork server that has reasoning-gym imported (as the scoring pool's
do): forking the threaded trainer or API process could deadlock the child, and a fresh
interpreter per build would pay reasoning-gym's import (~1 s) each time.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import resource
from typing import Any, Callable

# What a child needs, loaded once in the fork server: a function the child runs must live in
# one of these modules (a function from the API's modules would make each child import
# FastAPI and SQLAlchemy first, seconds on a busy machine). "__main__" is multiprocessing's own
# default. A main run as `python -m` (uvicorn, pytest, celery through cli.main) costs a child
# little; a main run as a script path is imported again by every child (Python 3.11).
PRELOAD = ["__main__", "reasoning_gym", "trainer.tasks.reasoning_gym_task",
           "trainer.tasks.dataset_task", "trainer.tasks.isolated"]
CHECK_EXAMPLES = 4


class TaskBuildError(ValueError):
    """A task could not be built within its limits, or its config made reasoning-gym fail."""


def _limit_memory(memory_mb: int) -> None:
    # RLIMIT_AS counts what the child already maps (the interpreter, reasoning-gym), so the
    # budget is added on top of the current size: `memory_mb` is what the build may add.
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = current + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _call_limited(fn: Callable[..., Any], args: tuple, memory_mb: int) -> Any:
    _limit_memory(memory_mb)
    return fn(*args)


def run_isolated(fn: Callable[..., Any], args: tuple, *, what: str, timeout_s: float,
                 memory_mb: int, stop_check: Callable[[], None] | None = None,
                 poll_s: float = 0.25) -> Any:
    """`fn(*args)` in a fresh child process; its result, or a `TaskBuildError` naming `what`
    (a phrase such as "building reasoning-gym task chain_sum").

    `stop_check()` is called every `poll_s` while the child works; whatever it raises
    (a cancel) kills the child and propagates.
    """
    from pebble import ProcessExpired, ProcessPool

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # ignored once this process's server runs
    pool = ProcessPool(max_workers=1, max_tasks=1, context=context)
    try:
        future = pool.schedule(_call_limited, args=(fn, args, memory_mb), timeout=timeout_s)
        while not future.done():
            cf.wait([future], timeout=poll_s)
            if stop_check is not None and not future.done():
                try:
                    stop_check()
                except BaseException:
                    future.cancel()
                    raise
        try:
            return future.result()
        except TimeoutError:
            raise TaskBuildError(f"{what} took longer than {timeout_s:g} s; "
                                 f"make it smaller") from None
        except MemoryError:
            raise TaskBuildError(f"{what} needed more than {memory_mb} MiB; "
                                 f"make it smaller") from None
        except ProcessExpired as exc:
            raise TaskBuildError(f"{what} crashed its process "
                                 f"(exit code {exc.exitcode})") from None
        except TaskBuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - reasoning-gym raises anything on bad input
            detail = str(exc) or type(exc).__name__
            raise TaskBuildError(f"{what} failed: {detail[:500]}") from None
    finally:
        pool.stop()
        pool.join(timeout=5)


def hardest_variant(config: dict[str, Any]) -> dict[str, Any] | None:
    """`config` with every `min_x` raised to the `max_x` it sets, so that each example is as
    large as the config allows; None when it sets no `max_x`."""
    from_max = {k[4:]: v for k, v in config.items() if k.startswith("max_")}
    hard = dict(config)
    for suffix, high in from_max.items():
        if isinstance(high, (int, float)) and not isinstance(high, bool):
            hard[f"min_{suffix}"] = high
    return hard if hard != config else None


def _build_examples(name: str, config: dict[str, Any], count: int) -> None:
    import reasoning_gym

    for seed in (0, 1):
        dataset = reasoning_gym.create_dataset(name, size=count, seed=seed, **config)
        for i in range(count):
            dataset[i]


def count_rows_in_file(path: str, max_line_bytes: int) -> int | str:
    """The rows of a valid uploaded JSONL file, or its first problem as text ("line N: ...");
    the API runs it here, in a child, for large uploads."""
    from trainer.tasks.dataset_task import DatasetFormatError, count_valid_rows

    try:
        with open(path, "rb") as fh:
            return count_valid_rows(fh, max_line_bytes)
    except DatasetFormatError as exc:
        return str(exc)


def check_config(name: str, config: dict[str, Any], *, timeout_s: float, memory_mb: int) -> None:
    """Raise `TaskBuildError` unless reasoning-gym task `name` builds a dataset and a few
    examples from `config` (and from its hardest variant) within the limits."""
    what = f"building reasoning-gym task {name} with this config"
    run_isolated(_build_examples, (name, config, CHECK_EXAMPLES), what=what,
                 timeout_s=timeout_s, memory_mb=memory_mb)
    hard = hardest_variant(config)
    if hard is None:
        return
    try:
        from trainer.tasks.config_limits import check_config

        check_config(name, hard)
    except ValueError:
        return  # the variant breaks the task's own rules (e.g. a parity): nothing to learn
    run_isolated(_build_examples, (name, hard, CHECK_EXAMPLES),
                 what=f"{what} (every min_ raised to its max_)",
                 timeout_s=timeout_s, memory_mb=memory_mb)
