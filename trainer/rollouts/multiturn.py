"""The multi-turn driver: N trajectories of each prompt run turn by turn against an environment.

`run_episodes` is the multi-turn half of the rollout seam (generate.py is the single-turn one)
and returns the same `Episodes`. Per example it opens N episodes (`Environment.episode`), and:

- turn 0: each episode's opening messages through the chat template with the environment's
  tools (`ChatTokens.opening`); one engine request of n = N per distinct opening (the N
  episodes of an example usually open alike), so the engine shares the prompt as today;
- every later turn: ONE engine call over all live trajectories (n = 1 each, the whole context
  as ids; vLLM's prefix cache reuses what earlier turns computed, the HF engine runs it);
- each turn's text is parsed for tool calls (`tool_calls.parse_turn`), every live episode's
  `step` is awaited together (asyncio.gather), and the reply's messages become token ids after
  the model's turn (`ChatTokens.reply`): the environment's tokens, loss mask 0, log-prob 0.
  The model's tokens are kept exactly as sampled (never re-tokenised).

A trajectory ends when its episode says done, after `max_turns` model turns, or when the
budget runs out: `max_total_tokens` counts every completion token (the model's and the
environment's), a turn may write at most min(rollout.max_new_tokens, what is left), and a
trajectory whose model turn is cut by what is left, or whose environment reply does not fit
with room for another turn, is truncated (`budget_truncated`). A trajectory whose last model
turn was cut is truncated too, as a single-turn completion cut at max_new_tokens is.

Rewards (`reward_mode`, the spec's `task.env.reward`):
- env: the environment's own (`Episode.finish`, else the reward of the reply that said done;
  none is 0). Kept for a truncated trajectory too: the environment judged it as it stands.
  `correct` is a reward >= 1 (a full score, as the dynamic-sampling filter reads it).
- grader: the run's scorer over the final assistant message's text (a grader's `sample` also
  gets `output_tools`, every tool call of the episode in OpenAI's shape, and `messages`, the
  transcript). A truncated trajectory is never graded: the scorer's truncated reward (0).
- sum: both added; `correct` is the scorer's.

An environment that raises (`start`, `step` or `finish`: its own failure, never the model's)
ends that trajectory with reward 0, counts it in `env_errors` and keeps the error in the
sample's `infos`; its loss mask is all 0, so no update learns from a broken environment.
Every episode's `close` is awaited whatever happens, a stop (`check` runs between turns and
may raise) included.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from trainer.rollouts.batch import SamplingConfig
from trainer.rollouts.chat_tokens import ChatTokens
from trainer.rollouts.environments.base import AssistantTurn, Message
from trainer.rollouts.generate import Episodes, _grader_detail
from trainer.rollouts.tool_calls import call_format, parse_turn
from trainer.stop import never

REWARD_MODES = ("env", "grader", "sum")
MAX_ERROR_CHARS = 2_000
CLOSE_TIMEOUT_S = 60.0     # an episode's close() that hangs past this is abandoned (and counted)
CORRECT_EPS = 1e-9


@dataclass
class _Trajectory:
    example: int
    sample: int
    episode: Any = None
    prompt: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    live: bool = False
    last_cut: bool = False
    budget_truncated: bool = False
    env_reward: float | None = None
    error: str | None = None
    info: dict = field(default_factory=dict)
    turn: AssistantTurn | None = None
    turn_ids: list[int] = field(default_factory=list)

    def fail(self, exc: BaseException, where: str) -> None:
        self.live = False
        self.error = f"{where}: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        self.info["error"] = self.error

    @property
    def truncated(self) -> bool:
        return self.budget_truncated or self.last_cut


def run_episodes(engine: Any, tokenizer: Any, env: Any, scorer: Any, examples: Sequence[Any],
                 sampling: SamplingConfig, *, max_turns: int, max_total_tokens: int, reward_mode: str = "grader",
                 check: Callable[[], None] = never, max_context: int | None = None) -> Episodes:
    """`sampling.n` trajectories of each example, run to their ends and scored (module docstring).

    `max_context`: the engine's longest sequence (prompt + completion); a trajectory whose
    next turn would not fit is ended as by the budget.
    """
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
    if max_turns < 1 or max_total_tokens < 1:
        raise ValueError("max_turns and max_total_tokens must be at least 1")
    driver = _Driver(engine, tokenizer, env, sampling, max_turns, max_total_tokens, check, max_context)
    trajs = [_Trajectory(example=i, sample=s) for i in range(len(examples)) for s in range(sampling.n)]
    _run_async(driver.run(trajs, examples))
    t = time.perf_counter()
    episodes = _scored(driver, trajs, examples, scorer, reward_mode, tokenizer)
    episodes.score_s = time.perf_counter() - t
    return episodes


class _Driver:
    def __init__(self, engine, tokenizer, env, sampling, max_turns, max_total, check, max_context):
        self.engine, self.tokenizer, self.env, self.sampling = engine, tokenizer, env, sampling
        self.max_turns, self.max_total, self.check, self.max_context = max_turns, max_total, check, max_context
        self.chat = ChatTokens(tokenizer, getattr(env, "tools", None))
        self.fmt = call_format(tokenizer)
        self.gen_s = self.env_s = 0.0
        self.engine_calls: list[int] = []     # per turn: engine calls made (tests count them)

    async def run(self, trajs: list[_Trajectory], examples: Sequence[Any]) -> None:
        try:
            for t in trajs:
                try:
                    t.episode = self.env.episode(examples[t.example], t.sample)
                except Exception as exc:  # noqa: BLE001 - the environment's failure: this trajectory ends
                    t.fail(exc, "episode")
            await self._start([t for t in trajs if t.episode is not None])
            for turn in range(self.max_turns):
                live = [t for t in trajs if t.live]
                if not live:
                    break
                self._generate(live, turn)
                self.check()
                await self._step([t for t in live if t.live], turn)
                self.check()
            await self._finish([t for t in trajs if t.episode is not None and t.error is None])
        finally:
            await self._close([t for t in trajs if t.episode is not None])

    async def _timed(self, calls: list[Awaitable]) -> list[Any]:
        t = time.perf_counter()
        try:
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            self.env_s += time.perf_counter() - t

    async def _start(self, trajs: list[_Trajectory]) -> None:
        for t, opened in zip(trajs, await self._timed([t.episode.start() for t in trajs])):
            if isinstance(opened, BaseException):
                _reraise_stop(opened)
                t.fail(opened, "start")
                continue
            try:
                t.messages = [dict(m) for m in opened]
                t.prompt = self.chat.opening(t.messages)
            except Exception as exc:  # noqa: BLE001 - messages the template cannot render
                t.fail(exc, "start")
                continue
            t.live = bool(t.prompt)
            if not t.prompt:
                t.fail(ValueError("the opening messages render to no tokens"), "start")

    def _generate(self, live: list[_Trajectory], turn: int) -> None:
        """One turn of every live trajectory: n = N per distinct opening at turn 0, then one
        call of n = 1 per trajectory over its whole context."""
        allowance = {id(t): self._allowance(t) for t in live}
        for t in live:
            if allowance[id(t)] < 1:   # no room for a token: ended by the budget
                t.live, t.budget_truncated = False, True
        live = [t for t in live if t.live]
        if not live:
            self.engine_calls.append(0)
            return
        seed = self.sampling.seed if turn == 0 else (self.sampling.seed * 1_000_003 + 7_919 * turn) % 2**31
        calls = 0
        t0 = time.perf_counter()
        for group, contexts in self._requests(live, turn):
            n = len(group) // len(contexts)
            top = max(allowance[id(t)] for t in group)
            cfg = dataclasses.replace(self.sampling, n=n, max_new_tokens=min(self.sampling.max_new_tokens, top),
                                      seed=seed)
            gen = self.engine.generate(contexts, cfg)
            calls += 1
            for t, p, ids, lps, fin in zip(group, gen.prompt_index, gen.token_ids, gen.logprobs, gen.finished):
                self._take(t, contexts[p], list(ids), list(lps), bool(fin), allowance[id(t)], turn)
        self.gen_s += time.perf_counter() - t0
        self.engine_calls.append(calls)

    def _allowance(self, t: _Trajectory) -> int:
        left = self.max_total - len(t.ids)
        if self.max_context is not None:
            left = min(left, self.max_context - len(t.prompt) - len(t.ids))
        return left

    def _requests(self, live: list[_Trajectory], turn: int) -> list[tuple[list[_Trajectory], list[list[int]]]]:
        """(trajectories, contexts) per engine call, trajectories in the engine's prompt-major
        order. Turn 0: distinct openings, n = how many share each (one call per distinct n;
        usually one). Later: one call, n = 1."""
        if turn > 0:
            return [(live, [t.prompt + t.ids for t in live])]
        by_opening: dict[tuple, list[_Trajectory]] = {}
        for t in live:
            by_opening.setdefault(tuple(t.prompt), []).append(t)
        by_n: dict[int, list[list[_Trajectory]]] = {}
        for members in by_opening.values():
            by_n.setdefault(len(members), []).append(members)
        return [([t for m in groups for t in m], [groups_m[0].prompt for groups_m in groups])
                for _, groups in sorted(by_n.items())]

    def _take(self, t: _Trajectory, context: list[int], ids: list[int], lps: list[float], finished: bool,
              allowance: int, turn: int) -> None:
        """`context`: the engine's prompt this turn was sampled from (the request's own list)."""
        cut_by_budget = len(ids) > allowance or (not finished and len(ids) >= allowance)
        ids, lps = ids[:allowance], lps[:allowance]
        t.ids += ids
        t.logprobs += lps
        t.mask += [1] * len(ids)
        t.turns += 1
        t.last_cut = cut_by_budget or not finished
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        t.turn = parse_turn(text, turn=turn, fmt=self.fmt, truncated=t.last_cut)
        t.turn.prompt_ids, t.turn.token_ids, t.turn.logprobs = context, ids, lps
        t.turn_ids = ids
        t.messages.append(t.turn.message())
        if cut_by_budget:
            t.live, t.budget_truncated = False, True

    async def _step(self, stepping: list[_Trajectory], turn: int) -> None:
        replies = await self._timed([t.episode.step(t.turn) for t in stepping])
        for t, reply in zip(stepping, replies):
            if isinstance(reply, BaseException):
                _reraise_stop(reply)
                t.fail(reply, f"step (turn {turn + 1})")
                continue
            try:
                messages = [dict(m) for m in (reply.messages or [])]
                t.messages += messages
                t.tool_calls += int(reply.tool_calls or 0)
                t.tool_errors += int(reply.tool_errors or 0)
                if reply.info:
                    t.info.update(reply.info)
                if reply.done:
                    t.live = False
                    t.env_reward = None if reply.reward is None else float(reply.reward)
                    continue
                if turn + 1 >= self.max_turns:
                    t.live = False
                    continue
                env_ids = self.chat.reply(messages, t.turn_ids)
            except Exception as exc:  # noqa: BLE001 - a malformed reply is the environment's failure
                t.fail(exc, f"step (turn {turn + 1})")
                continue
            if len(t.ids) + len(env_ids) >= self.max_total or (
                    self.max_context is not None and len(t.prompt) + len(t.ids) + len(env_ids) >= self.max_context):
                t.live, t.budget_truncated = False, True   # no room for the reply and another turn
                continue
            t.ids += env_ids
            t.logprobs += [0.0] * len(env_ids)
            t.mask += [0] * len(env_ids)

    async def _finish(self, trajs: list[_Trajectory]) -> None:
        rewards = await self._timed([t.episode.finish(list(t.messages)) for t in trajs])
        for t, reward in zip(trajs, rewards):
            if isinstance(reward, BaseException):
                _reraise_stop(reward)
                t.fail(reward, "finish")
            elif reward is not None:
                try:
                    t.env_reward = float(reward)
                except (TypeError, ValueError) as exc:
                    t.fail(exc, "finish")

    async def _close(self, trajs: list[_Trajectory]) -> None:
        async def close(t: _Trajectory) -> None:
            await asyncio.wait_for(t.episode.close(), CLOSE_TIMEOUT_S)

        for t, out in zip(trajs, await self._timed([close(t) for t in trajs])):
            if isinstance(out, BaseException):
                t.info["close_error"] = f"{type(out).__name__}: {out}"[:MAX_ERROR_CHARS]


def _reraise_stop(exc: BaseException) -> None:
    """A stop or an interrupt raised inside an episode is not the environment's failure."""
    from trainer.stop import StopRequested

    if isinstance(exc, (StopRequested, KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
        raise exc


# ----------------------------------------------------------------------------- scoring


def _scored(driver: _Driver, trajs: list[_Trajectory], examples: Sequence[Any], scorer: Any,
            reward_mode: str, tokenizer: Any) -> Episodes:
    """The trajectories as `Episodes`, rewarded as `reward_mode` says (module docstring)."""
    _fill_broken(trajs, tokenizer, examples)
    ok = [i for i, t in enumerate(trajs) if t.error is None]
    n = len(trajs)
    rewards, correct, scores = [0.0] * n, [False] * n, [0.0] * n
    grades: list = []
    sub_rewards: dict[str, list[float]] = {}
    timeouts = 0
    if reward_mode in ("grader", "sum") and ok:
        graded = scorer.score([_final_output(trajs[i], scorer) for i in ok], [examples[trajs[i].example] for i in ok],
                              [trajs[i].truncated for i in ok])
        timeouts = int(getattr(graded, "timeouts", 0) or 0)
        raw = getattr(graded, "scores", None)
        for k, i in enumerate(ok):
            rewards[i], correct[i] = float(graded.rewards[k]), bool(graded.correct[k])
            scores[i] = float(raw[k]) if raw is not None else rewards[i]
        results, subs = _grader_detail(scorer)
        if results:
            grades = [None] * n
            for k, i in enumerate(ok):
                grades[i] = results[k]
            sub_rewards = {key: [0.0] * n for key in subs}
            for key, values in subs.items():
                for k, i in enumerate(ok):
                    sub_rewards[key][i] = values[k]
    if reward_mode in ("env", "sum"):
        for i in ok:
            env = trajs[i].env_reward or 0.0
            rewards[i] = env if reward_mode == "env" else rewards[i] + env
            if reward_mode == "env":
                scores[i] = env
                correct[i] = env >= 1.0 - CORRECT_EPS
    texts = [_final_text(t) for t in trajs]
    return Episodes(
        prompt_index=[t.example for t in trajs], prompt_ids=[t.prompt for t in trajs],
        completion_ids=[t.ids for t in trajs], logprobs=[t.logprobs for t in trajs], texts=texts,
        truncated=[t.truncated for t in trajs], rewards=rewards, correct=correct, scores=scores,
        timeouts=timeouts, grades=grades, sub_rewards=sub_rewards, loss_mask=[t.mask for t in trajs],
        gen_s=driver.gen_s, messages=[t.messages for t in trajs], turns=[t.turns for t in trajs],
        tool_calls=[t.tool_calls for t in trajs], tool_errors=[t.tool_errors for t in trajs],
        budget_truncated=[t.budget_truncated for t in trajs], infos=[t.info for t in trajs],
        env_errors=sum(t.error is not None for t in trajs), env_s=driver.env_s)


def _fill_broken(trajs: list[_Trajectory], tokenizer: Any, examples: Sequence[Any]) -> None:
    """A trajectory the environment broke trains on nothing (its mask all 0); one broken
    before any token gets a sibling's opening (or its question's text) and one EOS, so
    that every sample has a prompt and a token for the update's shapes."""
    openings = {t.example: t.prompt for t in trajs if t.prompt}
    eos = getattr(tokenizer, "eos_token_id", None)
    eos = int(eos) if isinstance(eos, int) else 0
    for t in trajs:
        if t.error is None:
            continue
        if not t.prompt:
            t.prompt = openings.get(t.example) or _question_ids(tokenizer, examples[t.example]) or [eos]
        if not t.ids:
            t.ids, t.logprobs = [eos], [0.0]
        t.mask = [0] * len(t.ids)
        t.logprobs = t.logprobs[:len(t.ids)] + [0.0] * (len(t.ids) - len(t.logprobs))


def _question_ids(tokenizer: Any, example: Any) -> list[int]:
    try:
        return list(tokenizer(str(getattr(example, "question", "")) + "\n", add_special_tokens=False)["input_ids"])
    except Exception:  # noqa: BLE001 - a fallback only
        return []


def _final_text(t: _Trajectory) -> str:
    """The last assistant message's text: what a verifier reads."""
    for m in reversed(t.messages):
        if m.get("role") == "assistant":
            return m.get("content") or ""
    return ""


def _final_output(t: _Trajectory, scorer: Any) -> Any:
    """What the scorer reads: the final text for a built-in verifier; for a grader, OpenAI's
    `sample` with `output_tools` (every call of the episode) and `messages` (the transcript)."""
    text = _final_text(t)
    if getattr(scorer, "last_results", None) is None:
        return text
    tools = [c for m in t.messages if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])]
    return {"output_text": text, "output_tools": tools, "messages": t.messages}


# ----------------------------------------------------------------------------- event loop

_LOOPS = threading.local()


def _run_async(coro: Awaitable) -> Any:
    """Run `coro` to its end on this thread's own event loop, kept between calls (an
    environment's async clients may be bound to the loop that made them); from inside a
    running loop (an async caller), on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = getattr(_LOOPS, "loop", None)
        if loop is None or loop.is_closed():
            loop = _LOOPS.loop = asyncio.new_event_loop()
        return loop.run_until_complete(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = _run_async(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["exc"] = exc

    thread = threading.Thread(target=target, name="brorl-episodes")
    thread.start()
    thread.join()
    if "exc" in box:
        raise box["exc"]
    return box.get("out")
