"""Two tenants' graders through /v1/graders/run, on both sandbox layers: a hostile grader
that tries to plant state, steal rows and rewrite rewards, and an honest one, interleaved
in any order (hypothesis), never see each other; the API's sandboxes are bounded while
calls run and gone when they return (the review's findings 1 and 6)."""
from __future__ import annotations

import concurrent.futures
import time
import uuid

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings, strategies as st

from api.routes import graders as graders_route
from tests.sandbox.conftest import LAYERS, force_layer
from trainer.graders.sandbox.process import processes_with

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

# Tries every way this review found to reach another call: plant files, builtins and
# environment, patch the runner's module, leave a raw thread recording what comes later,
# forge reply frames onto every descriptor; then looks for anything an honest call left
# (its secret) in files, the environment and every object in memory. Reward 1 = a leak.
HOSTILE = {"type": "python", "source": '''
import _thread, builtins, gc, json, os, struct, sys, time
SEEN = []
def spy():
    while True:
        for obj in gc.get_objects():
            if isinstance(obj, dict) and "secret" in obj:
                SEEN.append(str(obj["secret"]))
        time.sleep(0.01)
def grade(sample, item):
    found = 0.0
    for root in ("/tmp", "/dev/shm"):
        try:
            for name in os.listdir(root):
                try:
                    if "brorl-secret-" in open(os.path.join(root, name)).read():
                        found = 1.0
                except OSError:
                    pass
        except OSError:
            pass
    if any("brorl-secret-" in v for v in os.environ.values()) or SEEN:
        found = 1.0
    if any(isinstance(o, str) and o.startswith("brorl-secret-") for o in gc.get_objects()):
        found = 1.0
    try:
        with open("/tmp/planted", "w") as f:
            f.write("planted")
    except OSError:
        pass
    os.environ["PLANTED"] = "1"
    builtins.PLANTED = True
    builtins.float = lambda x=0: 0.0
    main = sys.modules["__main__"]
    for name in dir(main):
        if callable(getattr(main, name)) and not name.startswith("__"):
            setattr(main, name, lambda *a, **k: {"reward": 0.0, "error": None})
    _thread.start_new_thread(spy, ())
    frame = json.dumps({"reward": 0.0, "error": None, "id": "x", "i": 0}).encode()
    for fd in range(0, 128):
        try:
            os.write(fd, struct.pack(">I", len(frame)) + frame)
        except OSError:
            pass
    return found
'''}
HONEST = {"type": "python", "source": '''
import builtins, os
def grade(sample, item):
    if os.path.exists("/tmp/planted") or "PLANTED" in os.environ or hasattr(builtins, "PLANTED"):
        raise RuntimeError("saw another call's state")
    return 1.0 if sample["output_text"] == item["answer"] else 0.0
'''}


@pytest.fixture(params=LAYERS)
def grader_client(request, monkeypatch, app):
    force_layer(monkeypatch, request.param)
    with TestClient(app) as client:
        yield client
    verifiers = getattr(app.state, "grader_verifiers", None)
    if verifiers is not None:
        verifiers.close()


def _run(client, auth, grader, sample, item) -> dict:
    r = client.post("/v1/graders/run", headers=auth,
                    json={"grader": grader, "model_sample": sample, "item": item})
    assert r.status_code == 200, r.text
    return r.json()


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.lists(st.booleans(), min_size=2, max_size=6),
       answers=st.lists(st.sampled_from(["right", "wrong"]), min_size=6, max_size=6))
def test_a_hostile_and_an_honest_tenant_never_see_each_other(grader_client, auth, other_auth,
                                                             order, answers):
    for hostile, answer in zip(order, answers):
        if hostile:
            out = _run(grader_client, auth, HOSTILE, "x", {"answer": "right"})
            assert out["reward"] == 0.0, out  # found nothing of the other tenant's
        else:
            secret = "brorl-secret-" + uuid.uuid4().hex
            out = _run(grader_client, other_auth, HONEST, answer,
                       {"answer": "right", "secret": secret})
            errors = out["metadata"]["errors"]
            assert not any(v for k, v in errors.items() if k.endswith("_error")), errors
            assert out["reward"] == (1.0 if answer == "right" else 0.0), out
    assert processes_with(graders_route.TAG) == []


def test_the_apis_sandboxes_are_bounded_and_reclaimed(grader_client, auth, monkeypatch, app):
    """Six concurrent calls with two slots: at most two sandboxes at once (each call's own),
    none left when they return (four calls used to leave four runners, 3.2 GiB)."""
    monkeypatch.setenv("BRORL_GRADER_API_CONCURRENCY", "2")
    app.state.grader_slots = None  # sized from the setting on first use
    slow = {"type": "python", "source": "import time\ndef grade(s, i):\n"
                                        "    time.sleep(0.5)\n    return 1.0\n"}
    peak, done = 0, []
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(_run, grader_client, auth, slow, "x", {}) for _ in range(6)]
        while not all(f.done() for f in futures):
            runners = [p for p in processes_with(graders_route.TAG)]
            peak = max(peak, len({_runner_token(p) for p in runners} - {None}))
            time.sleep(0.02)
        done = [f.result()["reward"] for f in futures]
    assert done == [1.0] * 6
    assert 1 <= peak <= 2, peak
    assert processes_with(graders_route.TAG) == []


def _runner_token(pid: int) -> str | None:
    """The runner token a sandbox process carries (one per sandbox)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    return next((a.decode() for a in args if a.startswith(graders_route.TAG.encode())), None)
