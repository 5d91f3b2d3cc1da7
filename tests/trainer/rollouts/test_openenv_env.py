"""OpenEnv servers as environments: the operator's list, the mapping, and episodes against a real
server written with openenv-core's own classes (tests/support/openenv_server: a guessing game)
driven by scripted model turns: reset, step, done and reward; concurrent episodes in their own
sessions; a server that fails (retried, then the episode's error), hangs (bounded), rejects an
action (the model reads why), refuses handshakes, or runs out of sessions; and the doors a
tenant might try (a URL or an unlisted name)."""
from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
import zlib

import pytest

from tests.support.openenv_server import _free_port, guess_server
from trainer.rollouts.environments import openenv_env as oe
from trainer.rollouts.environments.base import AssistantTurn, Environment, Episode
from trainer.settings import trainer_settings
from trainer.tasks.base import Example


def settings_for(url: str, **entry) -> dict:
    return {"openenv_servers": json.dumps({"guess": {"url": url, **entry}})}


def spec(**args) -> dict:
    return {"type": "openenv", "name": "guess", "args": args}


def secret(seed: int, low: int = 1, high: int = 100) -> int:
    """The game's rule (server.py): random.Random(seed).randint(low, high)."""
    return random.Random(seed).randint(low, high)


def example(seed: int) -> Example:
    return Example(question=f"guess reset seed {seed}", answer="", payload={"openenv": "guess", "seed": seed})


def turn(text: str) -> AssistantTurn:
    return AssistantTurn(text=text)


# ------------------------------------------------------------------ the operator's list


def test_the_setting_takes_urls_and_entries_and_names_itself_when_wrong():
    servers = oe.parse_servers(json.dumps({"echo": "http://echo:8000/", "game": {
        "url": "wss://h.example/envs/game", "observation_field": "board", "reward": "last"}}))
    assert servers["echo"].url == "http://echo:8000" and servers["echo"].ws_url() == "ws://echo:8000/ws"
    assert servers["game"].ws_url() == "wss://h.example/envs/game/ws"
    assert servers["game"].http_url("/health") == "https://h.example/envs/game/health"
    assert oe.parse_servers("") == {}
    for bad, words in [("{not json", "not JSON"), ('["http://a"]', "JSON object"),
                       ('{"a": "file:///etc/passwd"}', "url"), ('{"a": "http://a?x=1"}', "query"),
                       ('{"a b": "http://a"}', "server name"), ('{"a": {"url": "http://a", "nope": 1}}', "nope"),
                       ('{"a": {"url": "http://a", "timeout_s": 0}}', "timeout_s")]:
        with pytest.raises(ValueError, match=oe.SETTING) as err:
            oe.parse_servers(bad)
        assert words in str(err.value)


def test_the_setting_is_read_from_the_environment_like_every_trainer_setting():
    raw = json.dumps({"guess": "http://127.0.0.1:9"})
    s = trainer_settings({"BRORL_OPENENV_SERVERS": raw})
    assert oe.server_config("guess", s).url == "http://127.0.0.1:9"
    assert trainer_settings({}).openenv_servers == ""


def test_a_job_names_a_listed_server_never_a_url():
    s = settings_for("http://127.0.0.1:9")
    for name in ["nope", "http://169.254.169.254/latest", "ws://127.0.0.1:9", "", None]:
        with pytest.raises(ValueError, match="BRORL_OPENENV_SERVERS"):
            oe.check({"type": "openenv", "name": name, "args": {}}, s)
        with pytest.raises(ValueError, match="BRORL_OPENENV_SERVERS"):
            oe.build({"type": "openenv", "name": name, "args": {}}, settings=s, tag="t")
    with pytest.raises(ValueError, match=r"\(none listed\)"):
        oe.check(spec(), {"openenv_servers": ""})
    # The arguments go to reset only: no field in them reaches the connection.
    with pytest.raises(ValueError, match="seed"):
        oe.check(spec(seed=3), s)
    with pytest.raises(ValueError, match="train_size"):
        oe.check(spec(train_size=-1), s)
    oe.check(spec(train_size=4, eval_size=0, url="http://evil", low=1), s)


def test_the_task_is_reset_seeds_drawn_from_the_job_seed():
    s = settings_for("http://127.0.0.1:9")
    t = oe.task(spec(train_size=50, eval_size=10, low=3), s, seed=7)
    seeds = [e.payload["seed"] for e in t.train + t.eval]
    assert len(t.train) == 50 and len(t.eval) == 10 and len(set(seeds)) == 60
    assert all(0 <= x < 2**31 for x in seeds)
    assert [e.payload for e in oe.task(spec(train_size=50, eval_size=10), s, seed=7).train] == \
        [e.payload for e in t.train]
    assert t.train != oe.task(spec(train_size=50, eval_size=10), s, seed=8).train
    assert len(oe.task(spec(), s, seed=0).train) == oe.DEFAULT_TRAIN_SIZE
    assert t.name == "openenv:guess" and oe.no_reference("x", "", {}) == 0.0


def test_the_mapping_of_observations_and_json_actions():
    assert oe.observation_text({"echoed_message": "hi", "message_length": 2}, None, 100) == "hi"
    assert oe.observation_text({"a": "x", "b": "y"}, "b", 100) == "y"
    assert json.loads(oe.observation_text({"a": "x", "b": "y"}, None, 100)) == {"a": "x", "b": "y"}
    assert oe.observation_text({"board": [[1, 0]]}, "board", 100) == "[[1, 0]]"
    cut = oe.observation_text({"m": "x" * 500}, None, 100)
    assert cut.startswith("x" * 100) and "400 more characters cut" in cut and len(cut) < 150
    assert oe._schema_text_field({"properties": {"message": {"type": "string"}, "metadata": {}}}) == "message"
    assert oe._schema_text_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}}) is None
    assert oe._last_json_object('think {"x": 1} then {"x": 2, "y": {"z": 3}} done') == {"x": 2, "y": {"z": 3}}
    assert oe._last_json_object("no object {here") is None


# ------------------------------------------------------------------ against a real server


@pytest.fixture(scope="module")
def server():
    with guess_server(max_sessions=8) as url:
        yield url


def run(coro):
    return asyncio.run(coro)


def test_an_episode_resets_steps_and_is_paid_by_the_server(server):
    env = oe.build(spec(train_size=2), settings=settings_for(server), tag="job-1")
    assert isinstance(env, Environment) and env.tools is None
    assert env.action_field == "guess"          # the action schema's one text field
    seed = 1234
    target = secret(seed)

    async def go():
        ep = env.episode(example(seed), 0)
        assert isinstance(ep, Episode)
        opening = await ep.start()
        assert opening == [{"role": "user", "content": "I picked a number from 1 to 100. Guess it."}]
        wrong = target + 1 if target < 100 else target - 1
        r1 = await ep.step(turn(f"My guess is {wrong}"))
        assert r1.messages == [{"role": "user", "content": "lower" if wrong > target else "higher"}]
        assert not r1.done and r1.reward is None and r1.tool_errors == 0
        r2 = await ep.step(turn(f"{target}"))
        assert r2.messages[0]["content"] == "correct" and r2.done
        assert r2.reward == pytest.approx(0.9)            # -0.1 + 1.0: the sum of step rewards
        assert (await ep.step(turn("again"))).done        # nothing is sent after done
        assert await ep.finish([]) == pytest.approx(0.9)
        await ep.close()
    try:
        run(go())
        assert not env.sessions
    finally:
        env.close()


def test_reset_arguments_and_the_last_reward(server):
    env = oe.build(spec(low=5, high=5), settings=settings_for(server, reward="last"), tag="job-2")

    async def go():
        ep = env.episode(example(99), 0)
        assert (await ep.start())[0]["content"] == "I picked a number from 5 to 5. Guess it."
        await ep.step(turn("4"))
        done = await ep.step(turn("5"))   # the secret is 5 whatever the seed: low=high=5
        assert done.done and done.reward == 1.0 and await ep.finish([]) == 1.0
        await ep.close()
    try:
        run(go())
    finally:
        env.close()


def test_an_example_of_the_jobs_own_task_is_posed_by_its_text(server):
    """With task.reasoning_gym or task.dataset, reset gets the question and a seed drawn from it."""
    env = oe.build(spec(), settings=settings_for(server), tag="job-13")
    question = Example(question="Guess my number, it is below 100.", answer="", payload={"row": 1})
    target = secret(zlib.crc32(question.question.encode()) % 2**31)

    async def go():
        eps = [env.episode(question, i) for i in range(2)]
        openings = await asyncio.gather(*(ep.start() for ep in eps))
        assert openings == [[{"role": "user", "content": question.question}]] * 2
        replies = await asyncio.gather(*(ep.step(turn(str(target))) for ep in eps))
        assert all(r.done and r.reward == 1.0 for r in replies)    # one secret for the N samples
        await asyncio.gather(*(ep.close() for ep in eps))
    try:
        run(go())
    finally:
        env.close()


def test_concurrent_episodes_have_sessions_of_their_own(server):
    env = oe.build(spec(), settings=settings_for(server), tag="job-3")
    seeds = [11, 12, 13, 14]
    assert len({secret(s) for s in seeds}) == len(seeds)

    async def play(ep, seed):
        await ep.start()
        low, high, turns = 1, 100, 0
        while True:                                   # binary search against its own secret
            guess = (low + high) // 2
            reply = await ep.step(turn(str(guess)))
            turns += 1
            hint = reply.messages[0]["content"]
            if hint == "correct":
                return guess, turns
            assert not reply.done, "seven wrong guesses: the sessions crossed"
            low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)

    async def go():
        # Two samples of one example and samples of others, turn by turn in one gather.
        eps = [env.episode(example(s), i) for i, s in enumerate(seeds)] + [env.episode(example(11), 1)]
        found = await asyncio.gather(*(play(ep, ep.seed) for ep in eps))
        await asyncio.gather(*(ep.close() for ep in eps))
        return found
    try:
        found = run(go())
        assert [g for g, _ in found] == [secret(s) for s in seeds + [11]]
    finally:
        env.close()


def test_turns_may_run_in_different_event_loops(server):
    """A driver that starts a loop per turn still talks to the same session."""
    env = oe.build(spec(low=1, high=2), settings=settings_for(server), tag="job-4")
    try:
        ep = env.episode(example(5), 0)
        run(ep.start())
        hints = [run(ep.step(turn(g))).messages[0]["content"] for g in ("1", "2")]
        assert "correct" in hints and run(ep.finish([])) is not None
        run(ep.close())
    finally:
        env.close()


def test_a_failing_server_is_retried_then_the_episode_raises(server):
    env = oe.build(spec(), settings=settings_for(server, retries=2), tag="job-5")

    async def go():
        ep = env.episode(example(1), 0)
        await ep.start()
        flaky = await ep.step(turn("!flaky"))             # fails once, then answers
        assert flaky.messages[0]["content"] == "not a number" and flaky.tool_errors == 0
        t0 = time.monotonic()
        with pytest.raises(oe.OpenEnvError, match=r"failed step 3 times.*EXECUTION_ERROR.*the game broke"):
            await ep.step(turn("!crash"))
        assert time.monotonic() - t0 >= oe.BACKOFF_S * 3   # waited 0.25 + 0.5 between tries
        await ep.close()
    try:
        run(go())
    finally:
        env.close()


def test_a_rejected_action_is_shown_to_the_model(server):
    """JSON actions: the model's own fields; one the action schema refuses (the server's 422)
    and text that is no JSON are answered with an error, and the episode goes on."""
    env = oe.build(spec(low=7, high=7), settings=settings_for(server, action_format="json"), tag="job-7")

    async def go():
        ep = env.episode(example(1), 0)
        await ep.start()
        bad = await ep.step(turn('{"guess": 7}'))          # an int where the action wants text
        assert bad.tool_errors == 1 and not bad.done
        assert bad.messages[0]["content"].startswith("error: the environment rejected the action: VALIDATION_ERROR")
        none = await ep.step(turn("seven"))
        assert none.tool_errors == 1 and "JSON object" in none.messages[0]["content"]
        good = await ep.step(turn('I will say {"guess": "7"}'))
        assert good.done and good.reward == 1.0
        await ep.close()
    try:
        run(go())
    finally:
        env.close()


def test_refused_handshakes_are_retried_then_raise(server):
    key = uuid.uuid4().hex
    ok = oe.build(spec(), settings=settings_for(server, retries=3, headers={
        "x-reject-key": key, "x-reject-first": "2"}), tag="job-8")
    key2 = uuid.uuid4().hex
    never = oe.build(spec(), settings=settings_for(server, retries=1, headers={
        "x-reject-key": key2, "x-reject-first": "99"}), tag="job-9")
    try:
        ep = ok.episode(example(3), 0)
        assert run(ep.start())[0]["content"].startswith("I picked")   # third handshake succeeds
        run(ep.close())
        with pytest.raises(oe.OpenEnvError, match="failed reset 2 times; last: the WebSocket handshake got HTTP 503"):
            run(never.episode(example(3), 0).start())
    finally:
        ok.close()
        never.close()


def test_sessions_past_the_servers_capacity_fail_and_close_frees_them(server):
    env = oe.build(spec(), settings=settings_for(server, retries=1), tag="job-10")
    try:
        eps = [env.episode(example(s), 0) for s in range(9)]

        async def start_all():
            return await asyncio.gather(*(ep.start() for ep in eps), return_exceptions=True)
        results = run(start_all())
        errors = [r for r in results if isinstance(r, Exception)]
        assert len(errors) == 1 and "CAPACITY_REACHED" in str(errors[0])
        assert len(env.sessions) == 9           # the failed one's too: close() releases it all
    finally:
        env.close()
    assert all(ep.session.ws is None for ep in eps)
    again = oe.build(spec(), settings=settings_for(server), tag="job-11")
    try:
        more = [again.episode(example(s), 0) for s in range(8)]   # the server has all 8 free again

        async def start_close():
            await asyncio.gather(*(ep.start() for ep in more))
            await asyncio.gather(*(ep.close() for ep in more))
        run(start_close())
    finally:
        again.close()


def test_a_large_observation_is_cut(server):
    env = oe.build(spec(), settings=settings_for(server, max_observation_chars=1000), tag="job-12")
    try:
        ep = env.episode(example(1), 0)
        run(ep.start())
        text = run(ep.step(turn("!big"))).messages[0]["content"]
        assert text.startswith("x" * 1000) and text.endswith("999000 more characters cut]")
        run(ep.close())
    finally:
        env.close()


def test_a_server_that_does_not_answer_fails_the_build():
    port = _free_port()
    with pytest.raises(oe.OpenEnvError, match=r"'guess' \(BRORL_OPENENV_SERVERS\) does not answer /health"):
        oe.build(spec(), settings=settings_for(f"http://127.0.0.1:{port}", retries=0, connect_timeout_s=1), tag="t")


def test_a_hanging_server_is_a_bounded_error(server):
    """Last of the server's tests: the hung step holds its session on the server for 30 s."""
    env = oe.build(spec(), settings=settings_for(server, timeout_s=1, retries=3), tag="job-6")

    async def go():
        ep = env.episode(example(1), 0)
        await ep.start()
        t0 = time.monotonic()
        with pytest.raises(oe.OpenEnvError, match="no answer to step within 1 s"):
            await ep.step(turn("!hang"))
        assert time.monotonic() - t0 < 3                   # not retried: the session is unknown
        assert ep.session.ws is None
        await ep.close()
        # A caller that gives up first (its own deadline) leaves no session to answer late.
        other = env.episode(example(2), 0)
        await other.start()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(other.step(turn("!hang")), 0.3)
        await asyncio.sleep(0.1)
        assert other.session.ws is None
        with pytest.raises(oe.OpenEnvError, match="dropped the episode's session"):
            await other.step(turn("50"))
        await other.close()
    try:
        run(go())
    finally:
        env.close()
        env.close()                                        # twice is harmless


@pytest.mark.integration  # warm-starts builtin:tiny (shared with the loop tests): minutes on 2 cores
@pytest.mark.timeout(900)
def test_the_driver_plays_the_server_with_the_tiny_model():
    """`run_episodes` with the HF engine on builtin:tiny against the real server: each
    trajectory opens with the game's prompt, the server answers every model turn, its rewards
    are the trajectory's, and the server's tokens carry no loss. A server of its own: the
    module's server still holds the hung session of the test above for 30 s, and its 8
    trajectories need all 8 slots."""
    with guess_server(max_sessions=8) as url:
        _drive_the_tiny_model(url)


def _drive_the_tiny_model(server):
    from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
    from trainer.evaluate import opened
    from trainer.rollouts import SamplingConfig
    from trainer.rollouts.multiturn import run_episodes
    from trainer.spec import JobSpec

    job = JobSpec.model_validate({"name": "openenv-driver", "seed": SHARED_SEED, "task": shared_task(),
                                  "rollout": {"engine": "hf", "max_new_tokens": 24,
                                              "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 1}]}})
    prebuild(job)
    env = oe.build(spec(train_size=2, eval_size=0), settings=settings_for(server), tag="job-drv")
    examples = oe.task(spec(train_size=2, eval_size=0), settings_for(server), seed=3).train
    try:
        with opened(job, prompts=1, max_num_seqs=8) as ctx:
            eps = run_episodes(ctx.engine, ctx.tokenizer, env, ctx.scorer, examples,
                               SamplingConfig(n=4, max_new_tokens=8, seed=3), max_turns=3,
                               max_total_tokens=200, reward_mode="env")
    finally:
        env.close()
    assert len(eps) == 8 and eps.env_errors == 0, eps.infos
    assert eps.prompt_index == [0] * 4 + [1] * 4
    hints = {"higher", "lower", "not a number", "correct"}
    for i in range(8):
        msgs = eps.messages[i]
        assert msgs[0] == {"role": "user", "content": "I picked a number from 1 to 100. Guess it."}
        assert [m["role"] for m in msgs[1:]] == ["assistant", "user"] * eps.turns[i]
        assert all(m["content"] in hints for m in msgs[2::2])
        steps = eps.turns[i]
        solved = msgs[-1]["content"] == "correct"
        assert eps.rewards[i] == pytest.approx(-0.1 * (steps - solved) + 1.0 * solved)
        mask = eps.loss_mask[i]
        assert len(mask) == len(eps.completion_ids[i]) and 0 < sum(mask) < len(mask)
        assert all(lp == 0.0 for lp, m in zip(eps.logprobs[i], mask) if m == 0)
    assert max(eps.turns) == 3 and eps.env_s > 0
