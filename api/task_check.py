"""The submission check: a job's reasoning-gym config must build quickly, checked before 201.

The spec's bounds (`trainer.tasks.config_limits`) keep each number in range; whether a
config within them is cheap only running it tells. So before a job is written, the dataset
and a few examples are built in a child process with a time and a memory limit
(`trainer.tasks.isolated.check_config`); a config that fails or runs over is a 422 naming
`task.reasoning_gym.config`, and the worker never sees it. A config that passed is
remembered (per process, `CACHE_SIZE` of them, with the limits it passed under), so
resubmitting it forks nothing.

At most `max_concurrent_task_checks` checks run at once per API process (each is a child
process); a request that cannot get a slot within the check's timeout is a 503 with
`Retry-After`, and the per-key concurrency cap (api.guards) keeps one key from taking them all.
`task_check_timeout_s = 0` turns the check off (the worker's limits still apply).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from store.settings import Settings
from trainer.spec import JobSpec
from trainer.tasks.isolated import TaskBuildError, check_config

from api.errors import ApiError, field_error

CACHE_SIZE = 1024
_passed: OrderedDict[str, None] = OrderedDict()
_passed_lock = threading.Lock()


class TaskCheck:
    def __init__(self, settings: Settings):
        self.timeout_s = settings.task_check_timeout_s
        self.memory_mb = settings.task_check_memory_mb
        self._slots = threading.BoundedSemaphore(max(1, settings.max_concurrent_task_checks))

    def check(self, spec: JobSpec) -> None:
        """Raise a 422 unless the spec's reasoning-gym task builds within the limits.
        Blocking: call it from a worker thread (a sync route)."""
        task = spec.task.reasoning_gym
        if task is None or self.timeout_s <= 0:
            return
        key = json.dumps([self.timeout_s, self.memory_mb, task.name, task.config], sort_keys=True)
        with _passed_lock:
            if key in _passed:
                _passed.move_to_end(key)
                return
        if not self._slots.acquire(timeout=self.timeout_s):
            raise ApiError(503, "too many task configs are being checked; retry shortly",
                           type_="unavailable", headers={"Retry-After": "2"})
        try:
            check_config(task.name, task.config, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        except TaskBuildError as exc:
            raise field_error("task.reasoning_gym.config", str(exc)) from None
        finally:
            self._slots.release()
        with _passed_lock:
            _passed[key] = None
            if len(_passed) > CACHE_SIZE:
                _passed.popitem(last=False)
