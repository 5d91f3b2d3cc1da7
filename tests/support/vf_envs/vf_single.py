"""A one-turn question written with the verifiers library's own classes (a SingleTurnEnv): the
reward is 1 when the reply's last number is the row's answer."""
from __future__ import annotations

import re

import verifiers as vf
from datasets import Dataset


def exact(completion: vf.Messages, answer: str) -> float:
    found = re.findall(r"-?\d+", completion[-1].content or "") if completion else []
    return 1.0 if found and found[-1] == answer else 0.0


def load_environment(num_examples: int = 8) -> vf.Environment:
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(num_examples)]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Answer with the number.",
                            rubric=vf.Rubric(funcs=[exact]))
