"""Bounds on a reasoning-gym task's config, checked before a job is accepted.

A task config comes from the tenant and reasoning-gym trusts it: `chain_sum` computes
`10 ** max_digits`, `tower_of_hanoi` emits 2**disks moves, `spell_backward` reads any file
named in `data_file`. One such config used to pin a worker's CPU (and its GIL: no heartbeat,
no cancel) for minutes. The rules here are generic, so that every registered task is
covered without a hand-written list of 100+ tasks:

- `seed` and `size` are refused: the job's seed and train/eval sizes set them.
- Every number in a field (also inside lists and tuples) is at most `SCALE` times the
  largest magnitude in the field's default, and never above `FLOOR` when that default is
  small (0, 1, None): difficulty knobs keep a useful range, `2**63` digits do not pass.
  `FIELD_CAPS` tightens fields whose cost grows exponentially even within that range.
- Lists hold at most `max(SCALE * len(default), MAX_LIST_FLOOR)` items.
- A field named like a file (`data_file`) must name a file shipped with reasoning-gym.
- `composite` takes reasoning-gym `DatasetSpec` objects, which JSON cannot express: its
  config always fails reasoning-gym's own check below.
- Building the config object and its `validate()` may raise anything (reasoning-gym raises
  AttributeError on some wrong types): every exception is a problem with the config.

These bounds keep a config's cost in a sane range; they cannot prove it cheap. The API
therefore also builds the dataset and a few examples in a child process with a time and
memory limit (`trainer.tasks.isolated.check_config`), and the worker builds the task in one too.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

SCALE = 10
FLOOR = 100
MAX_LIST_FLOOR = 16
RESERVED = {"seed": "set by the job's seed", "size": "set by train_size and eval_size"}

# Fields whose cost is exponential in their value: tighter than SCALE x default.
FIELD_CAPS: dict[tuple[str, str], float] = {
    ("tower_of_hanoi", "max_disks"): 12, ("tower_of_hanoi", "min_disks"): 12,
    ("tower_of_hanoi", "max_pegs"): 8, ("tower_of_hanoi", "min_pegs"): 8,
    ("n_queens", "n"): 12,
    ("circuit_logic", "max_inputs"): 12, ("circuit_logic", "min_inputs"): 12,
    ("propositional_logic", "max_vars"): 12, ("propositional_logic", "min_vars"): 12,
    ("knights_knaves", "n_people"): 8,
    ("rubiks_cube", "cube_size"): 7,
    ("zebra_puzzles", "num_people"): 8, ("zebra_puzzles", "num_characteristics"): 8,
}


class ConfigProblem(ValueError):
    """A config rule broken at `field` (a dotted path relative to the whole job spec)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _numbers(value: Any, depth: int = 0):
    """Every int and float in `value` (lists, tuples, dicts, nested a few levels)."""
    if depth > 8:
        return
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v, depth + 1)


def field_cap(task: str, name: str, default: Any) -> float:
    """The largest magnitude a number in field `name` of `task` may have."""
    if (task, name) in FIELD_CAPS:
        return FIELD_CAPS[(task, name)]
    largest = max((abs(n) for n in _numbers(default)), default=0)
    return max(SCALE * largest, FLOOR)


def _check_field(task: str, name: str, value: Any, default: Any, path: str) -> None:
    cap = field_cap(task, name, default)
    for number in _numbers(value):
        if isinstance(number, float) and not math.isfinite(number):
            raise ConfigProblem(path, "must be a finite number")
        if abs(number) > cap:
            raise ConfigProblem(path, f"{number!r} is out of range for {task}: at most {cap:g} "
                                      f"in magnitude")
    if isinstance(value, (list, tuple, dict)):
        limit = max(SCALE * len(default) if isinstance(default, (list, tuple, dict)) else 0,
                    MAX_LIST_FLOOR)
        if len(value) > limit:
            raise ConfigProblem(path, f"has {len(value)} items; at most {limit} for {task}")
    if "file" in name and value is not None and value != default:
        _check_data_file(value, path)


def _check_data_file(value: Any, path: str) -> None:
    from importlib import resources

    data = resources.files("reasoning_gym.data")
    shipped = sorted(p.name for p in data.iterdir() if p.is_file() and not p.name.startswith("_"))
    if not isinstance(value, str) or value not in shipped:
        raise ConfigProblem(path, f"must name a data file shipped with reasoning-gym "
                                  f"(one of {', '.join(shipped[:8])}, ...)")


def check_config(task: str, config: dict[str, Any],
                 path: str = "task.reasoning_gym.config") -> None:
    """Raise `ConfigProblem` naming the first field of `config` out of bounds for `task`,
    or the config as a whole when reasoning-gym refuses it (any exception)."""
    from reasoning_gym.factory import DATASETS

    _, config_cls = DATASETS[task]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    for key, value in config.items():
        if key in RESERVED:
            raise ConfigProblem(f"{path}.{key}", f"cannot be set here: {RESERVED[key]}")
        if key in fields:
            _check_field(task, key, value, _default(fields[key]), f"{path}.{key}")
    try:
        cfg = config_cls(**config)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except Exception as exc:  # noqa: BLE001 - reasoning-gym raises anything on bad input
        detail = str(exc) or type(exc).__name__
        raise ConfigProblem(path, f"invalid for {task}: {detail[:500]}") from None
