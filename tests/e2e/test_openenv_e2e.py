"""An OpenEnv server through the service: `brorl up` with the real worker and trainer runs a job
whose episodes play a real OpenEnv server (tests/support/openenv_server, written with
openenv-core's classes) listed by name in BRORL_OPENENV_SERVERS, on builtin:tiny, to success;
its metrics carry env/*, its stored samples the transcripts the server answered. A job that
names an unlisted server, or gives a URL for one, is a 422 naming the setting."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cli.client import BrorlAPIError, BrorlClient
from tests.support.openenv_server import guess_server
from tests.support.tinyprebuild import prebuild
from tests.support.upstack import Stack, running_stack
from trainer.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

OPENING = "I picked a number from 1 to 100. Guess it."
HINTS = {"higher", "lower", "not a number", "correct"}


def spec(name: str = "guess", server: str = "guess") -> dict:
    return {
        "spec_version": 1, "name": name, "seed": 5,
        "model": {"path": "builtin:tiny"},
        "task": {"env": {"type": "openenv", "name": server, "args": {"train_size": 8, "eval_size": 2},
                         "max_turns": 3, "max_total_tokens": 120, "reward": "env"}},
        "rollout": {"engine": "hf", "max_new_tokens": 24,
                    "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 2}]},
        "algo": {"mini_batches": 1, "dynamic_sampling": False},
        "eval": {"every": 0, "samples_per_prompt": 2, "k": [1]},
        "checkpoint": {"every": 0, "keep_last": 1},
        "samples": {"per_step": 8},
        "optim": {"lr": 1e-4},
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with guess_server(max_sessions=16) as url, pytest.MonkeyPatch.context() as mp:
        servers = json.dumps({"guess": url})
        # The warm start builds the job's task here too (its examples are the server's reset
        # seeds): it reads the setting from this process's environment. The server's examples
        # carry no answer, so the warm start learns nothing worth more than a few steps.
        mp.setenv("BRORL_OPENENV_SERVERS", servers)
        prebuild(JobSpec.model_validate(spec("warm")), sft_steps=20)
        with running_stack(tmp_path_factory.mktemp("openenv"), {
                "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1",
                "BRORL_OPENENV_SERVERS": servers}) as stack:
            yield stack


def test_a_job_plays_the_listed_server_to_success(stack: Stack):
    with BrorlClient(stack.url, stack.key, timeout=30) as client:
        job = client.wait(client.submit(spec())["id"], poll=1, timeout=800)
        assert job["status"] == "succeeded", (job, stack.output()[-4000:])
        rows = [r["values"] for r in client.metrics(job["id"])["data"] if r["step"] > 0]
        samples = client._json("GET", f"/v1/jobs/{job['id']}/samples", params={"step": 1})["data"]
    assert len(rows) >= 2
    for values in rows:
        assert values["env/errors"] == 0
        assert 1 <= values["env/turns_mean"] <= 3 and values["time/env_s"] > 0
    assert len(samples) == 8
    for s in samples:
        msgs = s["messages"]
        assert msgs[0]["role"] == "user" and msgs[0]["content"] == OPENING
        # every model turn answered by the server, but a last one the token budget cut
        answered = msgs[2::2]
        assert [m["role"] for m in msgs[1:]] == (["assistant", "user"] * s["turns"])[:len(msgs) - 1]
        assert len(answered) in (s["turns"], s["turns"] - 1)
        assert all(m["content"] in HINTS for m in answered)
        solved = msgs[-1]["content"] == "correct"
        assert s["reward"] == pytest.approx(-0.1 * (len(answered) - solved) + solved)


@pytest.mark.parametrize("name", ["nope", "http://127.0.0.1:1/", "ws://169.254.169.254"])
def test_an_unlisted_server_or_a_url_is_refused_at_submission(stack: Stack, name: str):
    with BrorlClient(stack.url, stack.key, timeout=30) as client:
        with pytest.raises(BrorlAPIError) as err:
            client.submit(spec("bad", server=name))
    assert err.value.status == 422 and err.value.field == "task.env.name"
    assert "BRORL_OPENENV_SERVERS" in err.value.message
