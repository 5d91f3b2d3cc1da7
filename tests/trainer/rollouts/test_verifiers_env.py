"""verifiers environments through `trainer.rollouts.environments.verifiers_env`: environments
written with the library's own classes (tests/support/vf_envs: a MultiTurnEnv guessing game, a
ToolEnv calculator, environments that fail on purpose), listed in BRORL_ENVIRONMENTS, driven
turn by turn with scripted model turns as the multi-turn driver would drive them."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import threading
from pathlib import Path

import pytest

from tests.support.scripted_engine import ScriptedEngine
from trainer.rollouts.environments import verifiers_env as ve
from trainer.rollouts.environments.base import AssistantTurn, Episode, Environment, ToolCall
from trainer.settings import trainer_settings

ENVS = Path(__file__).resolve().parents[2] / "support" / "vf_envs"
LISTED = "vf-guess,vf-calc,vf-broken,vf-single"
SETTINGS = {"environments": LISTED}


@pytest.fixture(scope="module", autouse=True)
def env_packages():
    """The test environments importable as installed packages (the operator's pip install)."""
    sys.path.insert(0, str(ENVS))
    yield
    sys.path.remove(str(ENVS))


def vspec(name: str, **args) -> dict:
    return {"type": "verifiers", "name": name, "args": args}


@pytest.fixture(scope="module")
def guess():
    task = ve.task(vspec("vf-guess", num_examples=10), SETTINGS, seed=3)
    env = ve.build(vspec("vf-guess", num_examples=10), settings=SETTINGS, tag="t")
    yield task, env
    env.close()


@pytest.fixture(scope="module")
def calc():
    task = ve.task(vspec("vf-calc"), SETTINGS, seed=0)
    env = ve.build(vspec("vf-calc"), settings=SETTINGS, tag="t")
    yield task, env
    env.close()


def run(coro):
    return asyncio.run(coro)


def run_all(coros):
    async def together():
        return await asyncio.gather(*coros)

    return asyncio.run(together())


async def play(env, example, texts, sample=0):
    """Start an episode and answer with `texts` (str or AssistantTurn) until it ends; returns
    (transcript, replies, reward)."""
    episode = env.episode(example, sample)
    transcript = await episode.start()
    replies = []
    try:
        for text in texts:
            turn = text if isinstance(text, AssistantTurn) else AssistantTurn(text=text)
            transcript.append(turn.message())
            reply = await episode.step(turn)
            replies.append(reply)
            transcript += reply.messages
            if reply.done:
                break
        return transcript, replies, await episode.finish(transcript)
    finally:
        await episode.close()


# ----------------------------------------------------------------------------- the setting


def test_setting_is_a_comma_list_of_ids():
    assert trainer_settings({"BRORL_ENVIRONMENTS": " vf-guess, acme/calc_tools ,vf-guess"}).environments == (
        "vf-guess", "acme/calc_tools")
    assert trainer_settings({"BRORL_ENVIRONMENTS": ""}).environments == ()
    for bad in ("../etc", "a b", "x;rm", "-flag", "a/b/c"):
        with pytest.raises(ValueError, match="BRORL_ENVIRONMENTS"):
            trainer_settings({"BRORL_ENVIRONMENTS": bad})


def test_an_unlisted_id_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="BRORL_ENVIRONMENTS") as err:
        ve.build(vspec("os"), settings=SETTINGS)
    assert "'os'" in str(err.value) and "vf-guess" in str(err.value)
    with pytest.raises(ValueError, match="BRORL_ENVIRONMENTS"):
        ve.task(vspec("vf-guess"), {"environments": ""}, 0)
    with pytest.raises(ValueError, match="task.env.name"):
        ve.check({"type": "verifiers", "name": None}, SETTINGS)
    ve.check(vspec("vf-guess", num_examples=3), SETTINGS)


def test_arguments_are_checked_before_the_environment_runs():
    with pytest.raises(ValueError, match="argument name"):
        ve.check({"name": "vf-guess", "args": {"a b": 1}}, SETTINGS)
    with pytest.raises(ValueError, match="JSON object"):
        ve.check({"name": "vf-guess", "args": [1, 2]}, SETTINGS)
    with pytest.raises(ValueError, match="bytes"):
        ve.check({"name": "vf-guess", "args": {"x": "y" * (ve.MAX_ARGS_BYTES + 1)}}, SETTINGS)
    # load_environment declares its parameters: anything else is refused by name, unrun.
    with pytest.raises(ValueError, match=r"takes no argument '__class__'.*num_examples"):
        ve.build(vspec("vf-guess", __class__="x"), settings=SETTINGS)


def test_a_failing_load_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'vf-broken' failed to load: FileNotFoundError: the environment's data"):
        ve.build(vspec("vf-broken", mode="load"), settings=SETTINGS)


def test_an_unimportable_listed_id_says_so():
    with pytest.raises(ValueError, match="not importable"):
        ve.build(vspec("vf-missing"), settings={"environments": "vf-missing"})


def test_unsupported_environments_are_refused_at_build():
    with pytest.raises(ve.UnsupportedEnvironment, match="replaces rollout"):
        ve.build(vspec("vf-broken", mode="rollout"), settings=SETTINGS)
    with pytest.raises(ve.UnsupportedEnvironment, match="group-level reward"):
        ve.build(vspec("vf-broken", mode="group"), settings=SETTINGS)


def test_loading_leaves_the_process_signal_handlers_alone():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread")
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    ve.build(vspec("vf-broken", mode="response"), settings=SETTINGS).close()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_loading_off_the_main_thread_works():
    # The library's Environment.__post_init__ calls signal.signal, which raises off the main thread.
    out = {}

    def load():
        try:
            out["env"] = ve.build(vspec("vf-broken", mode="response"), settings=SETTINGS)
        except Exception as exc:  # noqa: BLE001 - reported below
            out["error"] = exc

    t = threading.Thread(target=load)
    t.start()
    t.join()
    assert "error" not in out, out.get("error")
    out["env"].close()


# ----------------------------------------------------------------------------- the task


def test_task_takes_the_environments_dataset(guess, calc):
    task, env = guess
    assert isinstance(env, Environment) and env.tools is None
    assert task.name == "verifiers:vf-guess"
    assert len(task.train) + len(task.eval) == 10 and len(task.eval) == 1   # a held-out share
    ex = task.train[0]
    # The row as the library formatted it: its system prompt before the question.
    assert ex.payload["prompt"][0] == {"role": "system", "content": "Guess the secret whole number. "
                                       "Reply with one number and nothing else."}
    assert ex.payload["prompt"][-1]["content"] == ex.question and ex.answer == ex.payload["answer"]
    json.dumps(ex.payload)
    again = ve.task(vspec("vf-guess", num_examples=10), SETTINGS, seed=3)
    assert [e.payload for e in again.eval] == [e.payload for e in task.eval]
    ctask, _ = calc
    assert (len(ctask.train), len(ctask.eval)) == (20, 5)          # its own eval_dataset


# ----------------------------------------------------------------------------- a MultiTurnEnv


def test_guessing_game_answers_until_the_guess_is_right(guess):
    task, env = guess
    ex = task.train[0]
    target = int(ex.answer)
    low, high = (target - 1, target + 1) if target > 1 else (target + 1, target + 2)
    transcript, replies, reward = run(play(env, ex, [str(low), str(high), f"It is {target}", "unused"]))
    assert transcript[:2] == ex.payload["prompt"]
    assert [r.messages for r in replies[:2]] == [[{"role": "user", "content": "higher"}],
                                                 [{"role": "user", "content": "lower"}]]
    assert not replies[0].done and not replies[1].done
    last = replies[2]
    assert last.done and last.messages == [{"role": "user", "content": f"Correct! It was {target}."}]
    assert last.info["stop_condition"] == "has_final_env_response"
    assert len(replies) == 3 and reward == 1.0


def test_the_environments_max_turns_ends_the_episode(guess):
    task, env = guess
    ex = task.train[1]
    wrong = str(int(ex.answer) + 100)
    _, replies, reward = run(play(env, ex, [wrong] * 10))
    assert len(replies) == 6 and replies[-1].done                  # vf_guess's max_turns
    assert replies[-1].info["stop_condition"] == "max_turns_reached" and reward == 0.0


def test_a_driver_cut_ends_the_library_loop_and_scores_the_last_turn(guess):
    task, env = guess

    async def cut(last_text):
        episode = env.episode(task.train[2], 0)
        transcript = await episode.start()
        turn = AssistantTurn(text="0")
        transcript += [turn.message(), *(await episode.step(turn)).messages]
        # The driver's token budget ends the next turn: step never sees it, finish does.
        transcript.append(AssistantTurn(text=last_text, truncated=True).message())
        reward = await episode.finish(transcript)
        state = episode._state
        await episode.close()
        return reward, state

    reward, state = run(cut(task.train[2].answer))                 # the cut turn was right
    assert reward == 1.0 and len(state["trajectory"]) == 2
    assert state["stop_condition"] == "has_final_env_response"
    reward, state = run(cut("no idea"))
    assert reward == 0.0 and len(state["trajectory"]) == 2
    # The next request fails as a context that ran out, which the library ends normally.
    assert state["stop_condition"] == "prompt_too_long" and state["is_truncated"] and state["error"] is None


def test_episodes_run_concurrently_and_across_event_loops(guess):
    task, env = guess
    examples = task.train[:4]

    async def open_all():
        episodes = [env.episode(ex, i) for i, ex in enumerate(examples)]
        await asyncio.gather(*(e.start() for e in episodes))
        return episodes

    episodes = run(open_all())            # the driver may run each turn in a loop of its own
    answers = [AssistantTurn(text=ex.answer) for ex in examples]
    replies = run_all([e.step(t) for e, t in zip(episodes, answers)])
    assert all(r.done for r in replies)
    rewards = run_all([e.finish([]) for e in episodes])
    assert rewards == [1.0] * 4
    run_all([e.close() for e in episodes])
    assert not env._episodes


def test_a_single_turn_env_ends_after_the_first_turn():
    env = ve.build(vspec("vf-single"), settings=SETTINGS)
    task = ve.task(vspec("vf-single"), SETTINGS, 0)
    try:
        ex = task.train[0]
        _, replies, reward = run(play(env, ex, [f"It is {ex.answer}", "unused"]))
        assert len(replies) == 1 and replies[0].done and replies[0].messages == []
        assert replies[0].info["stop_condition"] == "max_turns_reached" and reward == 1.0
        _, _, reward = run(play(env, ex, ["no idea"]))
        assert reward == 0.0
    finally:
        env.close()


# ----------------------------------------------------------------------------- a ToolEnv


def numbers(question: str) -> tuple[int, int]:
    a, b = map(int, re.findall(r"\d+", question))
    return a, b


def test_tool_env_runs_the_tools_and_scores_the_answer(calc):
    task, env = calc
    assert [t["function"]["name"] for t in env.tools] == ["add", "multiply", "divide"]
    assert env.tools[0]["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    ex = task.train[0]
    a, b = numbers(ex.question)
    call = AssistantTurn(text='<tool_call>{"name": "add"}</tool_call>',
                         tool_calls=[ToolCall("call-1", "add", {"a": a, "b": b})])
    transcript, replies, reward = run(play(env, ex, [call, f"<answer>{a + b}</answer>"]))
    first = replies[0]
    assert first.messages == [{"role": "tool", "content": str(a + b), "tool_call_id": "call-1"}]
    assert (first.tool_calls, first.tool_errors, first.done) == (1, 0, False)
    assert replies[1].done and replies[1].info["stop_condition"] == "no_tools_called"
    assert transcript[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": a, "b": b}}
    assert reward == 1.0


def test_failing_tool_calls_are_answered_and_counted(calc):
    task, env = calc
    ex = task.train[1]
    a, b = numbers(ex.question)
    bad = AssistantTurn(text="calls", tool_calls=[
        ToolCall("c1", "divide", {"a": 1, "b": 0}),            # the tool raises
        ToolCall("c2", "rm_rf", {"path": "/"}),                 # no such tool
        ToolCall("c3", "add", {"a": "x", "b": [1]}),            # the tool raises on its arguments
        ToolCall("c4", "add", {"a": a, "b": b})])
    _, replies, reward = run(play(env, ex, [bad, "<answer>1</answer>"]))
    msgs = replies[0].messages
    assert [m["tool_call_id"] for m in msgs] == ["c1", "c2", "c3", "c4"]
    assert msgs[0]["content"] == "division by zero" and msgs[3]["content"] == str(a + b)
    assert (replies[0].tool_calls, replies[0].tool_errors) == (4, 3)
    assert reward == 0.0


def test_an_unparsable_tool_call_counts_and_ends_as_the_library_would(calc):
    task, env = calc
    turn = AssistantTurn(text='<tool_call>{"name": add}</tool_call>', parse_error="bad JSON")
    _, replies, reward = run(play(env, task.train[2], [turn]))
    # vLLM's parser would have left it as text: a turn without tool calls ends a ToolEnv.
    assert replies[0].done and replies[0].tool_errors == 1 and reward == 0.0


# ----------------------------------------------------------------------------- environments that fail


def test_an_environment_that_raises_fails_its_episode_only():
    env = ve.build(vspec("vf-broken", mode="response"), settings=SETTINGS)
    task = ve.task(vspec("vf-broken", mode="response"), SETTINGS, 0)
    try:
        async def go():
            episode = env.episode(task.train[0], 0)
            await episode.start()
            first = await episode.step(AssistantTurn(text="hello"))
            with pytest.raises(ve.EnvironmentFailed, match="KeyError"):
                await episode.step(AssistantTurn(text="again"))
            reward = await episode.finish([])
            await episode.close()
            return first, reward

        first, reward = run(go())
        assert first.messages == [{"role": "user", "content": "go on"}] and reward is None
        # Another episode of the same environment still runs.
        ok = run(play(env, task.train[1], ["only one"]))
        assert ok[1][0].messages == [{"role": "user", "content": "go on"}]
    finally:
        env.close()
    assert not env.loop.thread.is_alive()


def test_an_environment_raising_on_a_turn_the_budget_cut_fails_finish():
    env = ve.build(vspec("vf-broken", mode="response"), settings=SETTINGS)
    task = ve.task(vspec("vf-broken", mode="response"), SETTINGS, 0)
    try:
        async def go():
            episode = env.episode(task.train[0], 0)
            transcript = await episode.start()
            transcript += [{"role": "assistant", "content": "one"}, *(await episode.step(AssistantTurn("one"))).messages]
            transcript.append(AssistantTurn("two", truncated=True).message())   # never stepped
            try:
                with pytest.raises(ve.EnvironmentFailed, match="KeyError"):
                    await episode.finish(transcript)
            finally:
                await episode.close()

        run(go())
    finally:
        env.close()


def test_an_environment_calling_the_model_itself_is_refused():
    env = ve.build(vspec("vf-broken", mode="calls_model"), settings=SETTINGS)
    task = ve.task(vspec("vf-broken", mode="calls_model"), SETTINGS, 0)
    try:
        with pytest.raises(ve.UnsupportedEnvironment, match="calls the model itself"):
            run(play(env, task.train[0], ["hi", "again"]))
    finally:
        env.close()


def test_a_setup_error_fails_the_start():
    env = ve.build(vspec("vf-broken", mode="setup"), settings=SETTINGS)
    task = ve.task(vspec("vf-broken", mode="setup"), SETTINGS, 0)
    try:
        with pytest.raises(ve.EnvironmentFailed, match="sandbox did not start"):
            run(play(env, task.train[0], ["hi"]))
    finally:
        env.close()


def test_close_stops_live_episodes_and_the_loop(guess):
    env = ve.build(vspec("vf-guess", num_examples=4), settings=SETTINGS)
    task = ve.task(vspec("vf-guess", num_examples=4), SETTINGS, 0)
    episode = env.episode(task.train[0], 0)
    assert isinstance(episode, Episode)
    run(episode.start())
    rollout = episode._rollout
    env.close()                                                    # the episode was never finished
    assert rollout.done() and not env.loop.thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        env.episode(task.train[0], 1)


# ----------------------------------------------------------------------------- through the driver


def _Sampler(tok, script):  # noqa: N802 - reads as the engine it makes
    """Each token's log-prob distinct (its position in the context), so a mix-up shows."""
    return ScriptedEngine(tok, script, logprob=lambda context, k: -0.01 * (context + k))


def test_the_environment_sees_the_sampled_token_ids_and_logprobs():
    """The library's client contract: each model response carries what the engine sampled
    (`ResponseTokens`: the context's ids, the turn's ids, their log-probs) and the library keeps
    it in the state's trajectory steps, where an environment reads it. Through the driver, those
    are exactly the ids and log-probs the trajectory trains on."""
    from tests.support.chat_tokenizers import chat_tokenizer
    from trainer.rollouts.batch import SamplingConfig
    from trainer.rollouts.multiturn import run_episodes

    tok = chat_tokenizer()
    env = ve.build(vspec("vf-guess", num_examples=4), settings=SETTINGS, tag="tokens")
    task = ve.task(vspec("vf-guess", num_examples=4), SETTINGS, 0)
    seen: dict[str, list] = {}
    library_step = env.env.add_trajectory_step

    async def add_trajectory_step(state, step):   # the library's hook for an environment's own use
        seen.setdefault(state["trajectory_id"], []).append(step["tokens"])
        await library_step(state, step)

    env.env.add_trajectory_step = add_trajectory_step
    # Sample j opens with guess j + 1, then every turn guesses 3 more than its last turn count.
    engine = _Sampler(tok, lambda ctx, j: str(ctx.count("<|im_start|>assistant") * 3 + j - 2))
    try:
        ep = run_episodes(engine, tok, env, None, task.train[:1], SamplingConfig(n=2, max_new_tokens=8),
                          max_turns=3, max_total_tokens=400, reward_mode="env")
    finally:
        env.close()
    assert ep.env_errors == 0, ep.infos
    assert len(seen) == 2 and sorted(len(steps) for steps in seen.values()) == sorted(ep.turns)
    matched = set()
    for steps in seen.values():
        assert all(s is not None for s in steps), "a response without tokens"
        sampled = [x for s in steps for x in s["completion_ids"]]
        logprobs = [x for s in steps for x in s["completion_logprobs"]]
        i = next(i for i in range(len(ep)) if [x for x, m in zip(ep.completion_ids[i], ep.loss_mask[i]) if m] == sampled)
        matched.add(i)
        assert logprobs == [x for x, m in zip(ep.logprobs[i], ep.loss_mask[i]) if m]
        full = ep.prompt_ids[i] + ep.completion_ids[i]
        for s in steps:   # each turn's context and ids are the trajectory's own, in order
            assert s["prompt_mask"] == [0] * len(s["prompt_ids"]) and s["completion_mask"] == [1] * len(s["completion_ids"])
            assert full[:len(s["prompt_ids"]) + len(s["completion_ids"])] == s["prompt_ids"] + s["completion_ids"]
        assert steps[0]["prompt_ids"] == ep.prompt_ids[i]
    assert matched == {0, 1} and max(ep.turns) > 1


@pytest.mark.integration  # warm-starts builtin:tiny (shared with the loop tests): minutes on 2 cores
@pytest.mark.timeout(900)
def test_the_driver_runs_a_verifiers_env_on_the_tiny_hf_engine():
    """run_episodes with the HF engine on builtin:tiny against the guessing game: the env's
    opening prompt, its answers between the model's turns as masked context, its reward."""
    from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
    from trainer.evaluate import opened
    from trainer.rollouts.batch import SamplingConfig
    from trainer.rollouts.multiturn import run_episodes
    from trainer.spec import JobSpec

    spec = JobSpec.model_validate({"name": "vf", "seed": SHARED_SEED, "task": shared_task(),
                                   "rollout": {"engine": "hf", "max_new_tokens": 24,
                                               "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 1}]}})
    prebuild(spec)
    task = ve.task(vspec("vf-guess", num_examples=6), SETTINGS, 0)
    env = ve.build(vspec("vf-guess", num_examples=6), settings=SETTINGS, tag="driver")
    examples = task.train[:2]
    try:
        with opened(spec, prompts=2, max_num_seqs=16) as ctx:
            ep = run_episodes(ctx.engine, ctx.tokenizer, env, ctx.scorer, examples,
                              SamplingConfig(n=4, max_new_tokens=24, seed=3), max_turns=3,
                              max_total_tokens=160, reward_mode="env")
    finally:
        env.close()
    assert not env.loop.thread.is_alive()
    assert len(ep) == 8 and ep.env_errors == 0, ep.infos
    for i in range(8):
        ex = examples[ep.prompt_index[i]]
        msgs = ep.messages[i]
        assert msgs[:2] == ex.payload["prompt"] and msgs[2]["role"] == "assistant"
        said = {m["content"] for m in msgs[3:] if m["role"] == "user"}
        assert said <= {"higher", "lower", "Answer with a whole number.", f"Correct! It was {ex.answer}."}
        assert ep.turns[i] == sum(1 for m in msgs if m["role"] == "assistant") >= 1
        mask = ep.loss_mask[i]
        assert len(mask) == len(ep.completion_ids[i]) and mask[0] == 1
        assert (0 in mask) == (ep.turns[i] > 1)      # the env's answers are context, no loss
        assert ep.rewards[i] in (0.0, 1.0)
    assert any(t > 1 for t in ep.turns), "the environment answered and the model went on"
