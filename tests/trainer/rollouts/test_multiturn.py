"""The multi-turn driver (trainer/rollouts/multiturn.py) against small environments written here
(a unit test of one room): batching (engine calls per turn), every way a trajectory ends,
environments that raise, malformed tool calls, the reward modes, the stop check, and the
trained ids equal to the sampled ones under a template that would change them. The HF engine
on a random builtin:tiny model where the engine itself matters; a scripted one where the
model's text must be known."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from tests.support.chat_tokenizers import chat_tokenizer
from tests.support.scripted_engine import ScriptedEngine
from trainer.models.tiny import build_untrained
from trainer.rollouts import SamplingConfig
from trainer.rollouts.chat_tokens import ChatTokens
from trainer.rollouts.environments.base import EnvReply
from trainer.rollouts.multiturn import run_episodes
from trainer.stop import StopRequested


class Env:
    """Each episode: opens with the example's question; answers every turn with a tool message
    (`reply(k, sample, episode)` -> EnvReply for the k-th reply, default: a tool result, never done); records every call."""

    name = "fake"

    def __init__(self, reply=None, tools=None, raise_at=None, finish_reward=None):
        self.tools = tools
        self.reply_fn = reply or (lambda k, s, ep: EnvReply(messages=[{"role": "tool", "content": f"r{k}"}],
                                                            tool_calls=1))
        self.raise_at = raise_at or {}        # (sample, where) -> exception
        self.finish_reward = finish_reward
        self.episodes, self.closed, self.turns_seen = [], [], []

    def episode(self, example, sample):
        if (sample, "episode") in self.raise_at:
            raise self.raise_at[(sample, "episode")]
        ep = Episode(self, example, sample)
        self.episodes.append(ep)
        return ep

    def close(self):
        pass


class Episode:
    def __init__(self, env, example, sample):
        self.env, self.example, self.sample, self.k = env, example, sample, 0

    async def start(self):
        await asyncio.sleep(0)
        if (self.sample, "start") in self.env.raise_at:
            raise self.env.raise_at[(self.sample, "start")]
        return [{"role": "user", "content": self.example.question}]

    async def step(self, turn):
        self.env.turns_seen.append((self.sample, self.k, turn))
        if (self.sample, "step") in self.env.raise_at and self.k == 1:
            raise self.env.raise_at[(self.sample, "step")]
        self.k += 1
        return self.env.reply_fn(self.k, self.sample, self)

    async def finish(self, transcript):
        self.transcript = transcript
        if (self.sample, "finish") in self.env.raise_at:
            raise self.env.raise_at[(self.sample, "finish")]
        return self.env.finish_reward(self) if self.env.finish_reward else None

    async def close(self):
        self.env.closed.append(self.sample)


class Counting:
    """An engine wrapper that records each call's prompts and sampling."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, sampling):
        gen = self.engine.generate(prompts, sampling)
        self.calls.append((prompts, sampling, gen))
        return gen


class Scorer:
    """Correct when the final text holds the example's answer; records what it read."""

    def __init__(self):
        self.seen = []

    def score(self, texts, examples, truncated):
        self.seen.append((texts, examples, truncated))
        correct = [not t and ex.answer in str(x) for x, ex, t in zip(texts, examples, truncated)]
        return SimpleNamespace(rewards=[float(c) for c in correct], correct=correct, scores=[float(c) for c in correct])


def _examples(*qs):
    return [SimpleNamespace(question=q, answer=a, payload={}) for q, a in qs]


@pytest.fixture(scope="module")
def tiny():
    from trainer.engines.hf_engine import HFEngine

    model, tok = build_untrained(seed=3)
    return HFEngine(model.eval(), tok, seed=0), tok


def test_one_engine_call_per_turn_over_every_live_trajectory(tiny):
    engine, tok = tiny
    counting = Counting(engine)
    env = Env()
    sampling = SamplingConfig(n=4, max_new_tokens=6, temperature=1.0, seed=5)
    ep = run_episodes(counting, tok, env, Scorer(), _examples(("1+1=", "2"), ("2+2=", "4")), sampling,
                      max_turns=3, max_total_tokens=200, reward_mode="grader")
    # Turn 0: one call, n = 4 per distinct opening; turns 1 and 2: one call of n = 1 over all 8.
    assert [len(p) for p, _, _ in counting.calls] == [2, 8, 8]
    assert [s.n for _, s, _ in counting.calls] == [4, 1, 1]
    # The last turn is answered too (the environment sees every action), though not rendered.
    assert len(ep) == 8 and ep.turns == [3] * 8 and ep.tool_calls == [3] * 8
    chat = ChatTokens(tok)
    for i in range(8):
        # The completion is turn, reply, turn, reply, turn: the engine's ids at mask 1, as
        # sampled, the reply's rendering at mask 0; the context of each later call is it.
        sampled = [counting.calls[0][2].token_ids[i]] + [counting.calls[k][2].token_ids[i] for k in (1, 2)]
        r1, r2 = (chat.reply([{"role": "tool", "content": f"r{k}"}], sampled[k - 1]) for k in (1, 2))
        expect = sampled[0] + r1 + sampled[1] + r2 + sampled[2]
        assert ep.completion_ids[i] == expect
        assert ep.loss_mask[i] == [1] * len(sampled[0]) + [0] * len(r1) + [1] * len(sampled[1]) + [0] * len(r2) \
            + [1] * len(sampled[2])
        assert ep.logprobs[i][len(sampled[0]):len(sampled[0]) + len(r1)] == [0.0] * len(r1)
        assert counting.calls[2][0][i] == ep.prompt_ids[i] + sampled[0] + r1 + sampled[1] + r2
    assert sorted(env.closed) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ep.env_errors == 0 and ep.env_s >= 0 and ep.gen_s > 0


def test_ends_by_done_max_turns_and_budget():
    tok = chat_tokenizer()
    # Sample 0 says done at its 1st reply (reward 0.5); the others go on.
    env = Env(reply=lambda k, s, ep: EnvReply(messages=[{"role": "tool", "content": "ok"}], done=(s == 0), reward=0.5))
    engine = ScriptedEngine(tok, lambda ctx, j: "abc")
    ep = run_episodes(engine, tok, env, Scorer(), _examples(("q", "abc")), SamplingConfig(n=2, max_new_tokens=50),
                      max_turns=3, max_total_tokens=10_000, reward_mode="env")
    assert ep.turns == [1, 3] and ep.truncated == [False, False] and ep.budget_truncated == [False, False]
    assert ep.rewards == [0.5, 0.0] and ep.correct == [False, False]
    # The budget: every completion token counts, the model's and the environment's.
    reply_len = len(ChatTokens(tok).reply([{"role": "tool", "content": "ok"}], [tok.eos_token_id]))
    budget = 4 + reply_len + 2  # turn 1 (abc + EOS), the reply, then 2 tokens of turn 2
    env = Env(reply=lambda k, s, ep: EnvReply(messages=[{"role": "tool", "content": "ok"}]))
    ep = run_episodes(engine, tok, env, Scorer(), _examples(("q", "abc")), SamplingConfig(n=1, max_new_tokens=50),
                      max_turns=5, max_total_tokens=budget, reward_mode="grader")
    assert len(ep.completion_ids[0]) == budget and ep.turns == [2]
    assert ep.budget_truncated == [True] and ep.truncated == [True] and ep.rewards == [0.0]
    assert engine.calls[-1][1].max_new_tokens == 2
    # A reply that does not fit (with room for another turn) ends the trajectory before it.
    ep = run_episodes(engine, tok, env, Scorer(), _examples(("q", "abc")), SamplingConfig(n=1, max_new_tokens=50),
                      max_turns=5, max_total_tokens=4 + reply_len, reward_mode="grader")
    assert ep.completion_ids[0] == tok("abc", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ep.budget_truncated == [True] and ep.turns == [1]


def test_a_turn_cut_by_max_new_tokens_goes_on_but_a_cut_last_turn_is_truncated():
    tok = chat_tokenizer()
    env = Env()
    engine = ScriptedEngine(tok, lambda ctx, j: "x" * 20)
    ep = run_episodes(engine, tok, env, Scorer(), _examples(("q", "x")), SamplingConfig(n=1, max_new_tokens=5),
                      max_turns=2, max_total_tokens=1000, reward_mode="grader")
    assert ep.turns == [2] and [t.truncated for _, _, t in env.turns_seen] == [True, True]
    assert ep.truncated == [True] and ep.budget_truncated == [False]
    assert ChatTokens(tok).reply([{"role": "tool", "content": "r1"}], [1])[:1] == [tok.convert_tokens_to_ids("<|im_end|>")]


def test_an_environment_that_raises_ends_its_trajectory_only():
    tok = chat_tokenizer()
    env = Env(raise_at={(1, "step"): RuntimeError("tool server down"), (2, "start"): OSError("no sandbox"),
                        (3, "finish"): ValueError("rubric broke"), (4, "episode"): KeyError("bad row")},
              finish_reward=lambda e: 1.0)
    engine = ScriptedEngine(tok, lambda ctx, j: "4")
    ep = run_episodes(engine, tok, env, Scorer(), _examples(("q", "4")), SamplingConfig(n=5, max_new_tokens=8),
                      max_turns=3, max_total_tokens=1000, reward_mode="sum")
    assert ep.env_errors == 4
    assert ep.rewards == [2.0, 0.0, 0.0, 0.0, 0.0] and ep.correct == [True, False, False, False, False]
    assert "tool server down" in ep.infos[1]["error"] and "step (turn 2)" in ep.infos[1]["error"]
    assert "no sandbox" in ep.infos[2]["error"] and "rubric broke" in ep.infos[3]["error"]
    assert "bad row" in ep.infos[4]["error"]
    for i in range(1, 5):  # nothing is learnt from a broken environment; shapes stay usable
        assert set(ep.loss_mask[i]) == {0} and ep.completion_ids[i] and ep.prompt_ids[i]
    assert ep.turns[1] == 2 and ep.turns[2] == 0
    assert sorted(env.closed) == [0, 1, 2, 3]  # every episode that was opened is closed
    assert len(env.episodes[0].transcript) == 7  # user, (assistant, tool) x 3


def test_a_malformed_tool_call_is_answered_and_counted():
    tok = chat_tokenizer()

    def reply(k, s, ep):
        turn = ep.env.turns_seen[-1][2]
        if turn.parse_error:
            return EnvReply(messages=[{"role": "tool", "content": "error: " + turn.parse_error}],
                            tool_calls=1, tool_errors=1)
        if turn.tool_calls:
            return EnvReply(messages=[{"role": "tool", "content": "5", "tool_call_id": turn.tool_calls[0].id}],
                            tool_calls=1)
        return EnvReply(done=True)

    texts = ['<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>',
             '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "<answer>5</answer>"]
    engine = ScriptedEngine(tok, lambda ctx, j: texts[ctx.count("<|im_start|>assistant") - 1])
    ep = run_episodes(engine, tok, Env(reply=reply), Scorer(), _examples(("2+3?", "5")),
                      SamplingConfig(n=1, max_new_tokens=80), max_turns=4, max_total_tokens=2000, reward_mode="grader")
    assert ep.turns == [3] and ep.tool_calls == [2] and ep.tool_errors == [1]
    assert ep.rewards == [1.0] and ep.texts == ["<answer>5</answer>"]
    roles = [m["role"] for m in ep.messages[0]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "not valid JSON" in ep.messages[0][2]["content"]
    assert ep.messages[0][3]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}


def test_trained_ids_are_the_sampled_ids_under_a_template_that_changes_them():
    tok = chat_tokenizer()
    turns = ['<think>\nadd\n</think>\n\n<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>',
             "<think>\nit is 5\n</think>\n\n5", "<answer>10</answer>"]
    engine = ScriptedEngine(tok, lambda ctx, j: turns[ctx.count("<|im_start|>assistant") - 1])
    replies = [[{"role": "tool", "content": "5"}], [{"role": "user", "content": "Double it."}]]
    env = Env(reply=lambda k, s, ep: EnvReply(messages=replies[k - 1]) if k <= 2 else EnvReply(done=True),
              tools=[{"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {}, "b": {}}}}}])
    ep = run_episodes(engine, tok, env, Scorer(), _examples(("2+3?", "10")), SamplingConfig(n=1, max_new_tokens=200),
                      max_turns=3, max_total_tokens=4000, reward_mode="grader")
    ids, mask = ep.completion_ids[0], ep.loss_mask[0]
    model_ids = [t for t, m in zip(ids, mask) if m]
    sampled = [x for text in turns for x in tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    assert model_ids == sampled
    # Re-templating the transcript would give other ids (the first turn's <think> dropped, the
    # call's JSON re-rendered): training on those would put the ratios on text never sampled.
    again = tok.apply_chat_template(ep.messages[0], tools=env.tools, tokenize=False)
    full = tok.decode(ep.prompt_ids[0] + ids)
    assert full != again and "<think>\nadd\n</think>" in full and "<think>\nadd" not in again
    assert ep.rewards == [1.0]


def test_reward_modes_and_the_grader_sample():
    tok = chat_tokenizer()
    env = Env(reply=lambda k, s, ep: EnvReply(messages=[], done=True, reward=0.25 + s),
              finish_reward=lambda e: None)
    engine = ScriptedEngine(tok, lambda ctx, j: ["7", "<tool_call>{\"name\": \"f\"}</tool_call> 8"][j])
    ex = _examples(("q", "8"))
    sampling = SamplingConfig(n=2, max_new_tokens=40)
    env_only = run_episodes(engine, tok, env, Scorer(), ex, sampling, max_turns=2, max_total_tokens=500, reward_mode="env")
    assert env_only.rewards == [0.25, 1.25] and env_only.correct == [False, True]
    graded = run_episodes(engine, tok, env, Scorer(), ex, sampling, max_turns=2, max_total_tokens=500, reward_mode="grader")
    assert graded.rewards == [0.0, 1.0]
    both = run_episodes(engine, tok, env, Scorer(), ex, sampling, max_turns=2, max_total_tokens=500, reward_mode="sum")
    assert both.rewards == [0.25, 2.25] and both.correct == [False, True]

    class Grader(Scorer):
        last_results, sub_reward_keys = [], []

        def score(self, samples, examples, truncated):
            self.last_results = [None] * len(samples)
            return super().score([s["output_text"] for s in samples], examples, truncated) if \
                self.seen.append(samples) is None else None

    g = Grader()
    run_episodes(engine, tok, env, g, ex, sampling, max_turns=2, max_total_tokens=500, reward_mode="grader")
    sample = g.seen[0][1]
    assert sample["output_tools"] == [{"id": "call_0_0", "type": "function", "function": {"name": "f", "arguments": {}}}]
    assert [m["role"] for m in sample["messages"]] == ["user", "assistant"]


def test_a_stop_between_turns_still_closes_every_episode():
    tok = chat_tokenizer()
    env = Env()
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise StopRequested

    with pytest.raises(StopRequested):
        run_episodes(ScriptedEngine(tok, lambda ctx, j: "a"), tok, env, Scorer(), _examples(("q", "a")),
                     SamplingConfig(n=3, max_new_tokens=5), max_turns=5, max_total_tokens=500, check=check)
    assert sorted(env.closed) == [0, 1, 2]


def test_bad_arguments_are_refused():
    tok = chat_tokenizer()
    with pytest.raises(ValueError, match="reward_mode"):
        run_episodes(None, tok, Env(), Scorer(), [], SamplingConfig(n=1, max_new_tokens=1), max_turns=1,
                     max_total_tokens=1, reward_mode="best")


def test_an_async_caller_is_served_on_a_thread_of_its_own():
    tok = chat_tokenizer()

    async def main():
        return run_episodes(ScriptedEngine(tok, lambda ctx, j: "a"), tok, Env(), Scorer(), _examples(("q", "a")),
                            SamplingConfig(n=1, max_new_tokens=5), max_turns=2, max_total_tokens=100)

    assert asyncio.run(main()).turns == [2]


def test_episodes_to_rollouts_carries_the_transcripts():
    tok = chat_tokenizer()
    ep = run_episodes(ScriptedEngine(tok, lambda ctx, j: "a"), tok, Env(), Scorer(), _examples(("q", "a")),
                      SamplingConfig(n=2, max_new_tokens=5), max_turns=2, max_total_tokens=100)
    r = ep.to_rollouts()
    assert r.loss_mask == ep.loss_mask and r.model_lengths() == [4, 4]
    assert r.episodes[1]["turns"] == 2 and r.episodes[1]["messages"] == ep.messages[1]
    assert torch.equal(r.select(torch.tensor([1])).group, torch.tensor([0]))
