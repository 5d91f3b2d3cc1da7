"""Which `model.path` a tenant may ask for: builtin:tiny, a folder under an allowed root, or
(only when the operator allows it) a model hub id.

Without this, a spec could name any path on the worker (and learn which exist from the error
messages) or make workers download anything from the hub. Roots come from
`BRORL_MODEL_ROOTS` (os.pathsep-separated), hub ids need `BRORL_ALLOW_HUB_MODELS=true`.
The API checks at submission (a 422 on `model.path`, `api.routes.jobs`); the worker checks again before it
loads the model (`worker.training_job`, `worker.probe_job`), because a stored spec or changed roots must not bypass it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from store.settings import Settings
from trainer.spec import TINY_MODEL

# owner/name as the hub spells it; no "..", no leading dot or slash. \Z, not $: "$" also
# matches before a final newline ("gpt2\n" is no hub id); ASCII: \w would take any script.
_HUB_ID = re.compile(r"\A[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?\Z", re.ASCII)


def _is_local(path: str) -> bool:
    return path.startswith(("/", "~", ".")) or "\\" in path or ".." in path.split("/")


def _under_roots(path: str, roots: list[Path]) -> bool:
    # realpath: a symlink inside a root that points outside it does not count as inside.
    target = os.path.realpath(os.path.expanduser(path))
    for root in roots:
        real_root = os.path.realpath(root)
        if os.path.commonpath([target, real_root]) == real_root:
            return True
    return False


def model_path_problem(path: str, settings: Settings) -> str | None:
    """Why this deployment does not let tenants use `path` as `model.path`; None if it does."""
    if path == TINY_MODEL:
        return None
    if _is_local(path):
        if not path.startswith(("/", "~")):
            return "a model folder must be an absolute path"
        if not _under_roots(path, settings.model_root_paths()):
            return ("this folder is not under an allowed model root "
                    "(the operator sets BRORL_MODEL_ROOTS); or use builtin:tiny")
        return None
    if not _HUB_ID.match(path):
        return f"{path!r} is neither builtin:tiny, an absolute folder path nor a model hub id"
    if not settings.allow_hub_models:
        return ("model hub ids are disabled on this deployment (the operator sets "
                "BRORL_ALLOW_HUB_MODELS); use a folder under an allowed model root or builtin:tiny")
    return None
