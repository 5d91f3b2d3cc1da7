"""Reasoning Gym tasks: train and eval splits from a registered generator, and its scorer.

Generation is deterministic in (seed, index), so a task is rebuilt identically on resume.
The eval split comes from another seed, with questions that also occur in train removed,
so that eval measures generalisation rather than memorised items. Small task spaces (e.g.
chain_sum over 1-digit numbers) may not hold enough unseen questions: the eval split is
then completed with questions moved out of train (train shrinks; the splits stay
disjoint). Train is materialised as a list: cheap for the usual sizes (10k chain_sum items
take ~0.1 s), but a multi-million train_size costs memory in proportion.
"""
from __future__ import annotations

import functools
import json
from typing import Any

from trainer.tasks.base import Example, ReasoningGymSection, Task, Verifier, VerifierSpec

# Any large prime keeps the eval generator's seeds away from the train generator's.
EVAL_SEED_OFFSET = 1_000_003


def _dataset(name: str, config: dict[str, Any], seed: int, size: int):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)


def _example(entry: dict) -> Example:
    return Example(question=str(entry["question"]), answer=str(entry["answer"]), payload=entry)


def _eval_entries(spec: ReasoningGymSection, seed: int, seen: set[str]) -> list[dict]:
    """Up to eval_size entries of the eval seed whose questions are new and distinct."""
    # Bounded scan: a small task space cannot supply unseen questions forever.
    budget = 4 * spec.eval_size + 1000
    dataset = _dataset(spec.name, spec.config, seed + EVAL_SEED_OFFSET, budget)
    out, taken = [], set(seen)
    for i in range(budget):
        entry = dataset[i]
        if entry["question"] not in taken:
            taken.add(entry["question"])
            out.append(entry)
            if len(out) == spec.eval_size:
                break
    return out


def _move_from_train(train: list[dict], eval_: list[dict], wanted: int) -> tuple[list[dict], list[dict]]:
    """Complete eval with distinct train questions (taken from the end), dropping them from train."""
    have = {e["question"] for e in eval_}
    moved: dict[str, dict] = {}
    for entry in reversed(train):
        if len(eval_) + len(moved) >= wanted:
            break
        if entry["question"] not in have and entry["question"] not in moved:
            moved[entry["question"]] = entry
    kept = [e for e in train if e["question"] not in moved]
    return kept, eval_ + list(moved.values())


def build(spec: ReasoningGymSection, seed: int) -> Task:
    """The task's train split (seed) and eval split (seed + EVAL_SEED_OFFSET), disjoint in
    questions unless `spec.eval_disjoint` is false (then simply the eval seed's first items)."""
    dataset = _dataset(spec.name, spec.config, seed, spec.train_size)
    train = [dataset[i] for i in range(spec.train_size)]
    if spec.eval_disjoint:
        eval_ = _eval_entries(spec, seed, {e["question"] for e in train})
        if len(eval_) < spec.eval_size:
            train, eval_ = _move_from_train(train, eval_, spec.eval_size)
    else:
        eval_set = _dataset(spec.name, spec.config, seed + EVAL_SEED_OFFSET, spec.eval_size)
        eval_ = [eval_set[i] for i in range(spec.eval_size)]
    if not train or not eval_:
        raise ValueError(
            f"reasoning-gym task {spec.name} with config {spec.config} has too few distinct "
            f"questions for a train and an eval split")
    return Task(
        name=spec.name,
        train=[_example(e) for e in train],
        eval=[_example(e) for e in eval_],
        verifier_spec=VerifierSpec.of("reasoning_gym", name=spec.name, config=spec.config),
    )


@functools.lru_cache(maxsize=16)
def _scoring_dataset(name: str, config_json: str):
    # Creating a dataset can be slow (some load word lists): once per process and config.
    # Size 1 is enough: score_answer reads the entry, not the generated items.
    return _dataset(name, json.loads(config_json), seed=0, size=1)


def answer_is_plausible(extracted: str, answer: str) -> bool:
    """Guards in front of a task's own scorer, which may be lenient (chain_sum pays
    "1245, 1246" for 1245): no enormous answers, no other scripts' digits, and where the
    reference is a number the answer must be one number too."""
    from trainer.tasks.verifiers import MAX_ANSWER_CHARS, ascii_digits_only, parse_number

    if len(extracted) > MAX_ANSWER_CHARS or not ascii_digits_only(extracted):
        return False
    if parse_number(answer) is not None:
        return parse_number(extracted, strict=True) is not None
    return True


def make_verifier(options: dict[str, Any]) -> Verifier:
    """The task's own `score_answer(answer, entry)` (partial credit where the task gives it)."""
    dataset = _scoring_dataset(options["name"], json.dumps(options["config"], sort_keys=True))

    def verify(extracted: str, answer: str, payload: dict) -> float:
        if not answer_is_plausible(extracted, answer):
            return 0.0
        return dataset.score_answer(extracted, payload)

    return verify
