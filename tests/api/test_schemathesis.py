"""Property-based fuzzing of every endpoint from the OpenAPI schema, with a valid key: no 5xx.

schemathesis generates valid and invalid parameters and bodies for each operation; the only
check is "not a server error" (4xx answers are the point of the hostile inputs). Examples per
operation are kept small so that each backend takes well under a minute.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings as hypothesis_settings
from schemathesis.checks import not_a_server_error

from fastapi.testclient import TestClient

from api.app import create_app
from tests.api.helpers import make_spec

EXAMPLES_PER_OPERATION = 100

# 100 requests per operation: 15-65 s per backend on 2 cores, the API room's largest share.
pytestmark = pytest.mark.slow


def test_no_server_errors(settings, enqueued, key):
    # No rate limit here: the fuzzer's burst of requests is not what is under test.
    app = create_app(settings.model_copy(update={"rate_limit_per_s": 0}),
                     enqueue=enqueued, stream_poll_seconds=0.01)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = {"Authorization": f"Bearer {key}"}
    # A real job and dataset, so that the fuzzer's parameters reach the queries behind the
    # 404 checks (random ids would stop there).
    with TestClient(app) as client:
        job_id = client.post("/v1/jobs", json=make_spec(), headers=headers).json()["id"]
        dataset_id = client.post("/v1/datasets", headers=headers, files={
            "file": ("d.jsonl", b'{"prompt": "1+1", "answer": "2"}\n')}).json()["id"]
    real = {"job_id": job_id, "dataset_id": dataset_id}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12

    for operation in operations:
        # (The pytest plugin's from_fixture does not work with this pytest; hypothesis's own
        # @given per operation does the same.)
        @given(case=operation.as_strategy())
        @hypothesis_settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None,
                             derandomize=True, database=None,
                             suppress_health_check=list(HealthCheck))
        def fuzz(case):
            for name in set(case.path_parameters or {}) & set(real):
                case.path_parameters[name] = real[name]
            case.call_and_validate(headers=headers, checks=[not_a_server_error])

        fuzz()
