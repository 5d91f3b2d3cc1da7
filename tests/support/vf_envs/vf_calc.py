"""A calculator tool environment written with the verifiers library's own classes (a ToolEnv).

The model gets long sums and products and calculator tools (plain Python functions: the library
makes their schemas from the type hints and docstrings); it answers in <answer> tags. The
reward is 1 when the answer is the row's.
"""
from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM = ("Use the calculator tools for arithmetic. When you know the result, reply with it in "
          "<answer></answer> tags and call no tool.")


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b


def correct(completion: vf.Messages, answer: str) -> float:
    finals = [m for m in completion if m.role == "assistant" and not m.tool_calls]
    if not finals:
        return 0.0
    found = re.findall(r"<answer>\s*(-?\d+)\s*</answer>", finals[-1].content or "")
    return 1.0 if found and found[-1] == answer else 0.0


def load_environment(num_examples: int = 20, digits: int = 6, max_turns: int = 4,
                     num_eval: int = 5, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)

    def row() -> dict:
        a, b = rng.randrange(10 ** (digits - 1), 10 ** digits), rng.randrange(10 ** (digits - 1), 10 ** digits)
        return {"question": f"What is {a} + {b}?", "answer": str(a + b)}

    train = Dataset.from_list([row() for _ in range(num_examples)])
    evals = Dataset.from_list([row() for _ in range(num_eval)])
    return vf.ToolEnv(dataset=train, eval_dataset=evals, tools=[add, multiply, divide],
                      system_prompt=SYSTEM, rubric=vf.Rubric(funcs=[correct]), max_turns=max_turns)
