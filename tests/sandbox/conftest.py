"""Each sandbox test runs once per real layer: bubblewrap, and the Landlock fallback forced
by hiding bubblewrap. A layer that does not work here skips its run with the reason, except
in CI, where .ci/run provides both and a missing layer fails the run
(tests/support/services.py)."""
from __future__ import annotations

import functools
import pytest

from trainer.graders.sandbox import detect
from tests.support.services import require_service

LAYERS = ("bubblewrap", "landlock")


@functools.lru_cache(maxsize=None)
def why_not(name: str) -> str:
    return detect._why_not(name)


def force_layer(monkeypatch, name: str) -> None:
    """Make `name` this process's layer for the test, or skip (fail in CI) saying why not."""
    require_service(f"the {name} sandbox layer", why_not(name))
    monkeypatch.setattr(detect, "_detect", lambda: detect.LayerStatus(name))


@pytest.fixture(params=LAYERS)
def layer(request, monkeypatch):
    force_layer(monkeypatch, request.param)
    return request.param
