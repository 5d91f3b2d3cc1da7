"""The nouns every task shares: an `Example`, a `Task` and the `VerifierSpec`.

A task is data plus a recipe for its verifier. The recipe (`VerifierSpec`) is small, hashable
and picklable so that the scorer can send it to worker processes, which rebuild the verifier
once per process (`trainer.tasks.scoring_worker`) instead of shipping live objects around.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Example:
    """One prompt of a task.

    `question` is the raw question (the prompt template is applied later, see `prompts`),
    `answer` the reference answer as text, `payload` whatever the verifier needs besides the
    answer (the reasoning-gym entry, or the extra fields of a JSONL row). It must stay
    picklable and JSON-able: it travels to scoring workers and into logs.
    """

    question: str
    answer: str
    payload: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class VerifierSpec:
    """How to rebuild a verifier in another process: a builder `kind` and its options.

    Options are kept as canonical JSON so that the spec is hashable (it keys the
    per-process verifier cache) even when a task config holds lists or dicts.
    """

    kind: str
    options_json: str = "{}"

    @classmethod
    def of(cls, kind: str, **options: Any) -> "VerifierSpec":
        return cls(kind, json.dumps(options, sort_keys=True, default=list))

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json)


class Verifier(Protocol):
    """Scores an extracted answer (never None: the scorer gives a missing answer 0)."""

    def __call__(self, extracted: str, answer: str, payload: dict) -> float: ...


@dataclass
class Task:
    """A built task: training and held-out examples and the recipe of their verifier."""

    name: str
    train: list[Example]
    eval: list[Example]
    verifier_spec: VerifierSpec


# What building a task reads of the job spec's `task` section (`trainer.spec_task`). The spec
# sits above this package (its validators call `config_limits`), so the package names the
# fields it reads instead of importing the spec's classes; the spec's models satisfy these.


class ReasoningGymSection(Protocol):
    """`task.reasoning_gym` (`trainer.spec_task.ReasoningGymTask`)."""

    name: str
    config: dict[str, Any]
    train_size: int
    eval_size: int
    eval_disjoint: bool


class DatasetSection(Protocol):
    """`task.dataset` (`trainer.spec_task.DatasetTask`)."""

    id: str
    eval_fraction: float

    @property
    def verifier_name(self) -> str: ...

    @property
    def tolerance(self) -> float: ...


class TaskSection(Protocol):
    """`task` (`trainer.spec_task.TaskSpec`): one of a reasoning-gym task or a dataset."""

    reasoning_gym: ReasoningGymSection | None
    dataset: DatasetSection | None
    grader: dict[str, Any] | None
