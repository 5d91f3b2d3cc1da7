"""`model.path` at submission: a 422 on `model.path` for anything `store.model_policy` refuses
(the worker checks the same rule again before loading)."""

from __future__ import annotations

from store.model_policy import model_path_problem
from store.settings import Settings

from api.errors import field_error

FIELD = "model.path"


def check_model_path(path: str, settings: Settings) -> None:
    """Raise a 422 naming `model.path` unless this deployment lets tenants use `path`."""
    problem = model_path_problem(path, settings)
    if problem is not None:
        raise field_error(FIELD, problem)
