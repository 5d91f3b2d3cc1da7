"""Environments that fail on purpose (tests of what the trainer does when one does).

`load_environment(mode=...)`: `load` raises while loading; `response` raises in env_response on
the second turn; `calls_model` asks the policy a side question from env_response (the
environment calls the model itself); `group` has a group-level reward function; `rollout`
replaces the rollout loop; `setup` fails in setup_state with a library error.
"""
from __future__ import annotations

import verifiers as vf
from datasets import Dataset


class Broken(vf.MultiTurnEnv):
    def __init__(self, mode: str, **kwargs):
        super().__init__(**kwargs)
        self.mode = mode

    async def setup_state(self, state: vf.State) -> vf.State:
        if self.mode == "setup":
            raise vf.InfraError("the environment's sandbox did not start")
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        if self.mode == "response" and len(state["trajectory"]) >= 2:
            raise KeyError("the environment's own bug")
        if self.mode == "calls_model":
            await self.get_model_response(state, [vf.UserMessage(content="rate this")])
        return [vf.UserMessage(content="go on")]


class OwnRollout(Broken):
    async def rollout(self, input, client, model, sampling_args=None):  # noqa: D102
        raise AssertionError("never run")


def group_reward(completions: list) -> list[float]:
    return [1.0 for _ in completions]


def load_environment(mode: str = "response") -> vf.Environment:
    if mode == "load":
        raise FileNotFoundError("the environment's data file is missing")
    data = Dataset.from_list([{"question": "Say something.", "answer": "x"}] * 4)
    rubric = vf.Rubric(funcs=[group_reward]) if mode == "group" else vf.Rubric(funcs=[lambda completion: 0.5])
    cls = OwnRollout if mode == "rollout" else Broken
    return cls(mode=mode, dataset=data, rubric=rubric, max_turns=5)
