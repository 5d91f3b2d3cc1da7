"""Agents end to end: the three ways in (`task.env`) trained through `brorl up` on a CPU.

One stack (the real API, Celery worker and trainer) runs four jobs side by side, each two
steps on the suite's shared warm-started builtin:tiny (tests/support/tinyprebuild.py, a folder
under BRORL_MODEL_ROOTS) with the hf engine:
- a `verifiers` ToolEnv and a MultiTurnEnv written with the library's own classes
  (tests/support/vf_envs/vf_calc.py, vf_guess.py, on the worker's PYTHONPATH and listed in
  BRORL_ENVIRONMENTS), prompts and reward their own;
- an OpenEnv server this test starts (openenv-core's own classes, tests/support/openenv_server),
  listed by name in BRORL_OPENENV_SERVERS, prompts from reset, reward the server's;
- built-in tools: the tenant's Python `add` and the code interpreter, run in the sandbox, the
  built-in verifier rewarding the final answer; its model is the shared one taught to call
  `add` first (`tool_calling_model`, 20 s), so its episodes hold real tool calls and results.
Each succeeds with the episode metrics (env/*, time/env_s) in every trained step, and its stored
samples read turn by turn (GET /v1/jobs/{id}/samples: messages with roles), on the job page in
Chromium too. Afterwards nothing
is left: no sandbox process with the job's tag, every OpenEnv session free again. An unlisted
name is refused at submission by the same stack (tests/api/test_env_submission.py has the rest).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.client import BrorlAPIError, BrorlClient
from tests.dashboard import conftest as dashboard
from tests.dashboard.helpers import shot
from tests.support.openenv_server import guess_server
from tests.support.services import grader_sandbox_missing, needs_service
from tests.support.tinyprebuild import SHARED_SEED, shared_model_dir, shared_task
from tests.support.upstack import Stack, running_stack

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900),
              needs_service("a grader sandbox", grader_sandbox_missing())]

browser = dashboard.browser   # the dashboard tests' Chromium, one per module (skips without it)
REPO = Path(__file__).resolve().parents[2]
VF_ENVS = REPO / "tests" / "support" / "vf_envs"
MAX_SESSIONS = 16   # the test server's capacity: twice what a step of the openenv job opens
N, PROMPTS, STEPS = 4, 2, 2
ENV_METRICS = ("env/turns_mean", "env/tool_calls_mean", "env/tool_errors_mean",
               "env/budget_truncated_frac", "env/errors", "time/env_s")
ADD = '''
def add(a: int, b: int) -> int:
    """Add two whole numbers exactly.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def _reward(messages: list) -> float:
    """Runs in the sandbox after the episode: a quarter per message of the transcript."""
    return 0.25 * len(messages)
'''
ENVS = {
    "verifiers": {"type": "verifiers", "name": "vf-calc", "max_turns": 3, "max_total_tokens": 96,
                  "args": {"num_examples": 8, "digits": 3, "num_eval": 2, "max_turns": 3}},
    "verifiers-multiturn": {"type": "verifiers", "name": "vf-guess", "max_turns": 3, "max_total_tokens": 96,
                            "args": {"num_examples": 20, "max_turns": 3}},
    "openenv": {"type": "openenv", "name": "guess", "max_turns": 3, "max_total_tokens": 96,
                "args": {"train_size": 8, "eval_size": 2}},
    # reward sum: the built-in verifier over the final answer plus the tools' own _reward
    # (run in the sandbox for every episode, so the job's sandboxes run whether or not the
    # model calls a tool).
    "tools": {"type": "tools", "tools": ADD, "code_interpreter": True, "tool_timeout_s": 5,
              "max_turns": 3, "max_total_tokens": 192, "reward": "sum"},
}


# The tools job's model: the shared one taught to open every episode with this call and to
# answer from the tool's result (the shared model alone never calls a tool), so the job's
# episodes carry real tool calls and tool results through the sandbox.
CALL = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>'


def tool_calling_model(model_dir: Path, out: Path) -> Path:
    """`model_dir`'s model fitted on two-turn transcripts (trainer.models.tiny_tools) of the
    shared task's questions as the tools job opens them: the call, the tool's "3", then
    <answer>3</answer>. About 60 steps, 20 s on one core; saved to `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.models.tiny import build_tokenizer, encode, save_folder
    from trainer.models.tiny_tools import transcript_ids, warm_start_transcripts
    from trainer.rollouts.chat_tokens import plain_opening
    from trainer.rollouts.environments.tool_schema import schemas
    from trainer.spec import ReasoningGymTask
    from trainer.tasks import reasoning_gym_task
    from trainer.tasks.prompts import render_prompt

    tools = schemas(ADD, code_interpreter=True)
    task = reasoning_gym_task.build(ReasoningGymTask(**shared_task()["reasoning_gym"]), seed=SHARED_SEED)
    openings = [[{"role": "user", "content": render_prompt(ex.question, None).rstrip("\n")}]
                for ex in task.train[:64]]
    rows = [transcript_ids(o, tools, [(CALL, [{"role": "tool", "content": "3"}]), ("<answer>3</answer>", None)])
            for o in openings]
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), build_tokenizer()

    def calls(m, seed: int) -> float:   # sampled as the job samples (temperature 1)
        torch.manual_seed(seed)
        hits = 0
        for o in openings[:8]:
            prompt = torch.tensor([encode(plain_opening(o, tools))])
            out_ids = m.generate(prompt, do_sample=True, temperature=1.0, max_new_tokens=len(CALL) + 2)
            hits += tok.decode(out_ids[0, prompt.shape[1]:].tolist(), skip_special_tokens=True).startswith(CALL)
        return hits / 8

    report = warm_start_transcripts(model, rows, seed=0, score_fn=calls, target=(0.0, 1.0), aim=0.75,
                                    max_steps=300, eval_every=10, batch_size=8, warmup_steps=5)
    assert report["pass_rate"] >= 0.5, f"the tool-call warm start did not take: {report}"
    return save_folder(model, tok, out)


def spec(kind: str, model_dir: Path, tool_model: Path | None = None) -> dict:
    task = {"env": ENVS[kind]}
    tokens = 24
    if kind == "tools":
        task.update(shared_task())
        model_dir, tokens = tool_model or model_dir, len(CALL) + 8
    return {
        "spec_version": 1, "name": f"agents-{kind}", "seed": SHARED_SEED,
        "model": {"path": str(model_dir)},
        "task": task,
        "rollout": {"engine": "hf", "max_new_tokens": tokens,
                    "schedule": [{"n": N, "prompts_per_step": PROMPTS, "steps": STEPS}]},
        "algo": {"mini_batches": 1, "dynamic_sampling": False},
        "eval": {"every": 0, "samples_per_prompt": 2, "k": [1]},
        "checkpoint": {"every": 0, "keep_last": 1},
        "samples": {"per_step": N * PROMPTS, "max_chars": 2000},
        "optim": {"lr": 1e-4},
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Stack, Path, str, Path]]:
    model_dir = shared_model_dir()
    assert (model_dir / "config.json").exists()
    tool_model = tool_calling_model(model_dir, tmp_path_factory.mktemp("models") / "tiny-tools")
    with guess_server(max_sessions=MAX_SESSIONS) as server_url:
        path = os.pathsep.join(p for p in (str(VF_ENVS), os.environ.get("PYTHONPATH", "")) if p)
        with running_stack(tmp_path_factory.mktemp("agents"), {
                "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1",
                "BRORL_MODEL_ROOTS": os.pathsep.join((str(model_dir.parent), str(tool_model.parent))),
                "PYTHONPATH": path,
                "BRORL_ENVIRONMENTS": "vf-calc,vf-guess",
                "BRORL_OPENENV_SERVERS": json.dumps({"guess": server_url})}) as stack:
            yield stack, model_dir, server_url, tool_model


@pytest.fixture(scope="module")
def finished(stack) -> dict[str, dict]:
    stack, model_dir, _, tool_model = stack
    started = time.monotonic()
    with BrorlClient(stack.url, stack.key, timeout=30) as client:
        ids = {kind: client.submit(spec(kind, model_dir, tool_model))["id"] for kind in ENVS}
        jobs, tagged = {}, set()
        for kind, job_id in ids.items():
            deadline = time.monotonic() + 600
            while (job := client.get_job(job_id))["status"] not in ("succeeded", "failed", "cancelled"):
                assert time.monotonic() < deadline, job
                if kind == "tools" and job["status"] == "running":
                    tagged.update(_job_sandboxes(job_id))
                time.sleep(0.25)
            job["sandboxes_seen"] = sorted(tagged) if kind == "tools" else []
            job["metric_rows"] = client.metrics(job_id)["data"]
            job["event_rows"] = client.events(job_id)["data"]
            job["sample_rows"] = [s for step in range(1, STEPS + 1) for s in client._json(
                "GET", f"/v1/jobs/{job_id}/samples", params={"step": step})["data"]]
            jobs[kind] = job
    print(f"agents e2e: {len(ids)} jobs in {time.monotonic() - started:.0f} s")
    return jobs


def _job_sandboxes(job_id: str) -> list[int]:
    """Live sandbox processes tagged with the job (trainer.run.job_environment's tag:
    brorl-<job id>-attempt-<n>)."""
    from trainer.graders.sandbox.process import processes_with

    return processes_with(f"brorl-{job_id}-attempt-")


def _succeeded(job: dict, stack) -> None:
    assert job["status"] == "succeeded", (job.get("error"), job["event_rows"][-5:],
                                          stack[0].output()[-4000:])


def _trained(job: dict) -> list[dict]:
    return [row["values"] for row in job["metric_rows"] if row["step"] > 0]


def _check_transcripts(samples: list[dict]) -> None:
    assert len(samples) == N * PROMPTS * STEPS
    for s in samples:
        messages = s["messages"]
        assert messages, s
        roles = [m["role"] for m in messages]
        assert set(roles) <= {"system", "user", "assistant", "tool"}, roles
        assert "assistant" in roles and roles[0] in ("system", "user"), roles
        # Turn by turn: the model's turns counted as stored (nothing dropped at this size).
        assert s["messages_dropped"] in (0, None)
        assert s["turns"] == roles.count("assistant"), (s["turns"], roles)
        assert 1 <= s["turns"] <= 3
        assert s["tool_calls"] >= 0 and 0 <= s["tool_errors"] <= s["tool_calls"]
        # Every call counts: those read (stored with the turn) and malformed ones (each an error).
        read = sum(len(m.get("tool_calls") or []) for m in messages)
        assert read <= s["tool_calls"] <= read + s["tool_errors"], s
        assert isinstance(s["reward"], float)


@pytest.mark.parametrize("kind", list(ENVS))
def test_each_way_in_trains_with_episode_metrics_and_readable_transcripts(kind, finished, stack):
    job = finished[kind]
    _succeeded(job, stack)
    rows = _trained(job)
    assert len(rows) == STEPS
    for values in rows:
        missing = [m for m in ENV_METRICS if m not in values]
        assert not missing, (missing, sorted(values))
        assert 1 <= values["env/turns_mean"] <= 3
        assert values["env/errors"] == 0, values     # no episode the environment itself broke
        assert values["time/env_s"] >= 0
    _check_transcripts(job["sample_rows"])
    assert all(s["env_error"] is None for s in job["sample_rows"])


def test_the_verifiers_episode_opens_with_the_environments_own_prompt(finished):
    for s in finished["verifiers"]["sample_rows"]:
        first = s["messages"][0]
        assert first["role"] == "system" and "calculator" in first["content"], first
        assert s["reward"] in (0.0, 1.0)        # vf_calc's rubric


def test_the_verifiers_multiturn_episode_is_answered_by_the_environment_turn_by_turn(finished):
    samples = finished["verifiers-multiturn"]["sample_rows"]
    for s in samples:
        roles = [m["role"] for m in s["messages"]]
        assert roles[:2] == ["system", "user"], roles
        # vf_guess answers every guess ("higher", "lower", "Correct! ..."): turns alternate.
        rest = roles[2:]
        assert rest[0::2] == ["assistant"] * len(rest[0::2]) and set(rest[1::2]) <= {"user"}, roles
        assert s["reward"] in (0.0, 1.0)        # its rubric: solved (guesses weighs 0)
    assert any(s["turns"] >= 2 for s in samples)


def test_the_openenv_episode_is_the_servers_game(finished):
    for s in finished["openenv"]["sample_rows"]:
        assert any(m["role"] == "user" for m in s["messages"])
        # The server pays -0.1 per wrong guess and 1.0 for the right one (server.py).
        assert -0.31 <= s["reward"] <= 1.0
        # Turn by turn: after the opening, the model's turns and the server's answers alternate.
        roles = [m["role"] for m in s["messages"]][1:]
        assert roles[0::2] == ["assistant"] * len(roles[0::2]) and set(roles[1::2]) <= {"user"}, roles
    assert any(s["turns"] >= 2 for s in finished["openenv"]["sample_rows"])


def test_the_tools_reward_runs_in_the_jobs_sandbox_and_nothing_is_left(finished, stack):
    job = finished["tools"]
    _succeeded(job, stack)
    assert job["sandboxes_seen"], "no sandbox process tagged with the job was ever seen"
    # The model calls add(1, 2) (tool_calling_model): the tenant's function answered in the sandbox.
    # Sampled at temperature 1, some calls come out garbled: answered with an error, never a crash.
    results = [m["content"] for s in job["sample_rows"] for m in s["messages"] if m["role"] == "tool"]
    assert "3" in results and all(r == "3" or r.startswith("error:") for r in results), results
    for s in job["sample_rows"]:
        if s["truncated"]:
            continue
        # sum: the verifier's 0 or 1 plus _reward's quarter per message, computed in the sandbox.
        verdict = s["reward"] - 0.25 * len(s["messages"])
        assert min(abs(verdict), abs(verdict - 1)) < 1e-6, (s["reward"], s["messages"])
    deadline = time.monotonic() + 10
    while _job_sandboxes(job["id"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _job_sandboxes(job["id"]) == []


def test_no_openenv_session_is_left_on_the_server(finished, stack):
    """Every session the job opened is closed: the server has all its capacity free again."""
    from trainer.rollouts.environments import openenv_env as oe
    from trainer.tasks.base import Example

    _, _, server_url, _ = stack
    env = oe.build({"type": "openenv", "name": "guess", "args": {}},
                   settings={"openenv_servers": json.dumps({"guess": {"url": server_url, "retries": 1}})},
                   tag="agents-e2e-check")
    async def start_all(episodes):
        return await asyncio.gather(*(ep.start() for ep in episodes), return_exceptions=True)

    async def close_all(episodes):
        await asyncio.gather(*(ep.close() for ep in episodes), return_exceptions=True)

    try:
        # The server frees a session when its own handler for the closed socket has run, which
        # lags under load: every slot must come back within 30 s (a leaked session never does).
        deadline = time.monotonic() + 30
        while True:
            episodes = [env.episode(Example(question=f"seed {s}", answer="", payload={"openenv": "guess", "seed": s}), 0)
                        for s in range(MAX_SESSIONS)]
            failed = [r for r in asyncio.run(start_all(episodes)) if isinstance(r, Exception)]
            if not failed or time.monotonic() > deadline:
                break
            asyncio.run(close_all(episodes))
            time.sleep(1)
        assert not failed, failed
    finally:
        env.close()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def test_the_jobs_page_reads_real_episodes_turn_by_turn(finished, stack, browser):
    """The built-in tools job's page in Chromium: the episode charts are drawn from its rows,
    and each stored episode of the last step reads turn by turn as stored (the opening, the
    model's turns with their tool calls, the tool results, the counts); the guessing game's
    page shows the environment's answers between the model's turns.
    (tests/dashboard/test_agent_page.py covers the rendering in detail against a trainer double.)"""
    from playwright.sync_api import expect

    up = stack[0]
    login = re.search(r"Dashboard \(logs this browser tab in\): (\S+)", up.output())
    assert login, up.output()[-2000:]
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(30_000)
    try:
        page.goto(login.group(1))
        for kind in ("tools", "verifiers-multiturn"):
            job = finished[kind]
            _succeeded(job, stack)
            page.goto(f"{up.url}/jobs/{job['id']}")
            expect(page.locator("#job-status")).to_have_text("succeeded")
            for chart in ("#chart-env", "#chart-envtime"):
                expect(page.locator(chart)).to_have_attribute("data-drawn", "true")
                assert int(page.locator(chart).get_attribute("data-points")) >= STEPS
            expect(page.locator("#chart-env")).to_contain_text("tool calls")
            expect(page.locator("#samples-step")).to_have_value(str(STEPS))
            expect(page.locator("#samples thead th").last).to_have_text("transcript (turn by turn)")
            stored = [s for s in job["sample_rows"] if s["step"] == STEPS]
            assert stored
            expect(page.locator("#samples tbody tr")).to_have_count(len(stored))
            for s in stored:
                row = page.locator(f"#samples tbody tr[data-idx='{s['idx']}']")
                turns = row.locator(".turn[data-role]")
                expect(turns).to_have_count(len(s["messages"]))
                assert [turns.nth(i).get_attribute("data-role") for i in range(len(s["messages"]))] == [
                    m["role"] for m in s["messages"]]
                expect(row.locator(".turn-counts")).to_have_text(
                    f"{_plural(s['turns'], 'turn')} · {_plural(s['tool_calls'], 'tool call')} · "
                    f"{_plural(s['tool_errors'], 'tool error')}")
                calls = [c for m in s["messages"] for c in (m.get("tool_calls") or [])]
                expect(row.locator(".tool-call")).to_have_count(len(calls))
                if calls:   # each call with its tool's name, in order
                    expect(row.locator(".tool-call .tool-name")).to_have_text(
                        [f"→ {c['function']['name']}" for c in calls])
                results = [m["content"] for m in s["messages"] if m["role"] == "tool"]
                expect(row.locator(".turn-tool")).to_have_count(len(results))
                for i, text in enumerate(results):   # each result as text; failed ones marked
                    expect(row.locator(".turn-tool").nth(i)).to_contain_text(text[:60])
                    assert ("turn-error" in row.locator(".turn-tool").nth(i).get_attribute("class")) == \
                        text.startswith("error:")
            page.locator("#samples").scroll_into_view_if_needed()
            shot(page, f"agent-job-{kind}.png")
            if kind == "tools":   # the model's add(1, 2), and the sandbox's answer after it
                expect(page.locator("#samples .tool-args").filter(has_text='{ "a": 1, "b": 2 }').first).to_be_visible()
                expect(page.locator("#samples .turn-tool:not(.turn-error) pre").filter(has_text="3").first).to_be_visible()
    finally:
        context.close()
    assert not errors, errors


def test_an_unlisted_environment_is_refused_by_the_stack(stack):
    stack, model_dir, _, _ = stack
    body = spec("openenv", model_dir)
    body["task"]["env"] = {**ENVS["openenv"], "name": "http://169.254.169.254/latest"}
    with BrorlClient(stack.url, stack.key, timeout=30) as client:
        with pytest.raises(BrorlAPIError) as exc:
            client.submit(body)
    assert exc.value.status == 422
    assert "BRORL_OPENENV_SERVERS" in str(exc.value) and "task.env.name" in str(exc.value)
