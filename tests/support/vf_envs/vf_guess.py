"""A number-guessing game written with the verifiers library's own classes (a MultiTurnEnv).

The model guesses a whole number; the environment answers "higher" or "lower" until the guess
is right, then says "Correct" (its `final_env_response`) and the episode ends. The reward is 1
when the last guess is the number, with a small bonus for fewer guesses.
"""
from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM = "Guess the secret whole number. Reply with one number and nothing else."


def last_number(text: str | None) -> int | None:
    found = re.findall(r"-?\d+", text or "")
    return int(found[-1]) if found else None


class GuessEnv(vf.MultiTurnEnv):
    async def setup_state(self, state: vf.State) -> vf.State:
        state["guesses"] = 0
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        guess = last_number(messages[-1].content)
        target = int(state["answer"])
        state["guesses"] += 1
        if guess is None:
            return [vf.UserMessage(content="Answer with a whole number.")]
        if guess == target:
            state["final_env_response"] = [vf.UserMessage(content=f"Correct! It was {target}.")]
            return state["final_env_response"]
        return [vf.UserMessage(content="higher" if guess < target else "lower")]


def solved(completion: vf.Messages, answer: str) -> float:
    guesses = [m for m in completion if m.role == "assistant"]
    return 1.0 if guesses and last_number(guesses[-1].content) == int(answer) else 0.0


def guesses(state: vf.State) -> float:
    return float(state.get("guesses", 0))


def load_environment(low: int = 1, high: int = 16, num_examples: int = 20, max_turns: int = 6,
                     seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    rows = [{"question": f"The number is between {low} and {high}. Your guess?",
             "answer": str(rng.randint(low, high))} for _ in range(num_examples)]
    rubric = vf.Rubric(funcs=[solved, guesses], weights=[1.0, 0.0])
    return GuessEnv(dataset=Dataset.from_list(rows), system_prompt=SYSTEM, rubric=rubric,
                    max_turns=max_turns)
