"""What every section of the job spec shares: the bounds, the frozen base model, the cross-field
error type and the check that a text can be stored by every database (trainer/spec.py)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

MAX_SAMPLES_PER_STEP = 1_048_576
MAX_TOTAL_STEPS = 1_000_000


MAX_TASK_CONFIG_BYTES = 16 * 1024
MAX_EVAL_K = 16
MAX_KEEP_LAST = 100
MAX_WALL_SECONDS = 30 * 86_400


class _Frozen(BaseModel):
    # allow_inf_nan=False: JSON's NaN/Infinity literals are refused in every float field
    # (a NaN weight_decay once trained a NaN model; Postgres and SQLite then disagree on it).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class FieldError(ValueError):
    """A cross-field rule broken at `path` (dotted, relative to the whole spec)."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def text_problem(text: str) -> str | None:
    """Why a database could not store `text`, or None: PostgreSQL refuses NUL in text and
    JSONB, and no database stores a lone surrogate (it has no UTF-8 encoding)."""
    if "\x00" in text:
        return "must not contain NUL (\\u0000) characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (it holds a lone surrogate)"
    return None


def _first_bad_text(value: Any, path: str, depth: int = 0) -> tuple[str, str] | None:
    """(dotted path, problem) of the first string in raw input a database would refuse."""
    if isinstance(value, str):
        problem = text_problem(value)
        return (path, problem) if problem else None
    if depth > 32:
        return None
    items: Any = ()
    if isinstance(value, dict):
        for key in value:
            if isinstance(key, str) and text_problem(key):
                return path or "(body)", f"a key {text_problem(key)}"
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    for key, item in items:
        found = _first_bad_text(item, f"{path}.{key}" if path else str(key), depth + 1)
        if found:
            return found
    return None


