"""Property test: hostile task configs for every registered reasoning-gym task, against the
real API (both databases): never a 500, never more than a few seconds.

For each task, hypothesis draws configs made of the task's own field names and made-up
ones, holding wrong types, missing and extra keys, huge and negative numbers (around the
bounds, too, so that some reach the submission check), nesting, unicode, NUL and lone
surrogates. Each answer must be a 201 or a 422 in the error shape, and a config accepted
with a 201 must really build a few examples within seconds (checked here in a child
process with a time limit, as a worker would build it).
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st
from reasoning_gym.factory import DATASETS

from api.app import create_app
from tests.api.helpers import make_spec
from trainer.tasks.config_limits import field_cap
from trainer.tasks.isolated import TaskBuildError, check_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLES_PER_TASK = 5
CHECK_TIMEOUT_S = 3.0
MAX_SECONDS = 2 * CHECK_TIMEOUT_S + 4  # the check's two builds and a fork each

NUMBERS = st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -2**63, 10**30, 1e308, -0.0]))
TEXT = st.one_of(st.text(max_size=8),
                 st.sampled_from(["\x00", "\ud800", "a\x00b", "..", "/etc/passwd"]))
LEAVES = st.one_of(NUMBERS, TEXT, st.booleans(), st.none())
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=3)), max_leaves=8)


def _fields(name: str) -> dict[str, object]:
    _, config_cls = DATASETS[name]
    out = {}
    for f in dataclasses.fields(config_cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        out[f.name] = default
    return out


def _near_bound(task: str, field: str, default: object) -> st.SearchStrategy:
    """Numbers near the field's bound and its default: in range, so the check builds them."""
    cap = field_cap(task, field, default)
    base = default if isinstance(default, (int, float)) and not isinstance(default, bool) else 1
    return st.sampled_from([int(cap), int(cap) + 1, -int(cap), base, base * 2, base * 5])


def configs(task: str) -> st.SearchStrategy:
    fields = _fields(task)
    keys = st.one_of(st.sampled_from(sorted(fields)), TEXT) if fields else TEXT
    near = [st.tuples(st.just(k), _near_bound(task, k, d)) for k, d in fields.items()
            if isinstance(d, (int, float)) and not isinstance(d, bool)]
    in_range = (st.lists(st.one_of(near), max_size=3).map(dict) if near else st.just({}))
    hostile = st.dictionaries(keys, VALUES, max_size=4)
    one_wrong = (st.tuples(st.sampled_from(sorted(fields)), VALUES).map(lambda kv: dict([kv]))
                 if fields else hostile)
    return st.one_of(in_range, one_wrong, hostile, VALUES)


def _post(client: TestClient, auth: dict, task: str, config: object):
    spec = make_spec(task={"reasoning_gym": {"name": task, "config": config,
                                             "train_size": 20, "eval_size": 4}})
    body = json.dumps(spec)  # ASCII escapes: lone surrogates travel as \\ud800
    start = time.monotonic()
    resp = client.post("/v1/jobs", content=body,
                       headers={**auth, "Content-Type": "application/json"})
    return resp, time.monotonic() - start


def test_hostile_configs_for_every_task(settings, enqueued, auth):
    app = create_app(settings.model_copy(update={"rate_limit_per_s": 0,
                                                 "task_check_timeout_s": CHECK_TIMEOUT_S,
                                                 "max_active_jobs_per_tenant": 10**6}),
                     enqueue=enqueued)
    with TestClient(app) as client:
        for task in sorted(DATASETS):
            @given(config=configs(task))
            @hypothesis_settings(max_examples=EXAMPLES_PER_TASK, deadline=None,
                                 derandomize=True, database=None,
                                 suppress_health_check=list(HealthCheck))
            def one(config):
                resp, seconds = _post(client, auth, task, config)
                assert resp.status_code in (201, 422), (task, config, resp.text)
                assert seconds < MAX_SECONDS, (task, config, seconds)
                if resp.status_code == 422:
                    assert resp.json()["error"]["field"].startswith(("task", "name")), resp.text
                    return
                try:  # accepted: it must really be cheap to build
                    check_config(task, config, timeout_s=MAX_SECONDS, memory_mb=2048)
                except TaskBuildError as exc:
                    pytest.fail(f"{task} {config!r} was accepted but does not build: {exc}")

            one()
