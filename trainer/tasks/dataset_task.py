"""Uploaded JSONL datasets: format validation, a seeded train/eval split, and the verifier.

Each line is a JSON object in one of two formats (docs/graders.md, Dataset formats):
- `{"prompt": str, ...}`: the prompt is rendered with task.prompt_template or the default
  instruction to answer inside <answer></answer>;
- OpenAI's reinforcement fine-tuning rows `{"messages": [...], ...}` (a row with `messages`
  is one, whatever else it holds): the messages are the prompt, verbatim
  (trainer.tasks.messages renders them).
Any other JSON fields travel in the example's payload: a grader sees the whole row as its
`item`. The reference answer, `answer` or else `reference_answer` (a string or a number), is
needed only by what reads it: the built-in verifiers, or a grader whose templates name it
(`trainer.graders.dataset_check` checks a dataset against the job's reward at submission).
`count_valid_rows` is what the API's upload handler calls, so this module imports neither
torch nor anything heavy.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

from trainer.tasks.base import DatasetSection, Example, Task, Verifier, VerifierSpec
from trainer.tasks.messages import MessagesError, parse_messages, plain_text
from trainer.tasks.verifiers import ANSWER_CHECKS, VERIFIERS


class DatasetFormatError(ValueError):
    """A bad dataset line; `line_no` is 1-based, 0 when the problem is the whole file."""

    def __init__(self, line_no: int, message: str):
        where = f"line {line_no}" if line_no else "dataset"
        super().__init__(f"{where}: {message}")
        self.line_no = line_no
        self.message = message


ANSWER_FIELDS = ("answer", "reference_answer")  # the verifier's reference, in this order


def answer_field(row: dict) -> str | None:
    """Which field holds the row's reference answer: `answer`, else OpenAI's
    `reference_answer`; None when it has neither."""
    return next((name for name in ANSWER_FIELDS if name in row), None)


def row_question(row: dict) -> str:
    """The row's question as text: its `prompt`, or the plain rendering of its `messages`."""
    if "messages" in row:
        return plain_text(parse_messages(row["messages"]))
    return row["prompt"]


def _check_answer(line_no: int, row: dict) -> None:
    name = answer_field(row)
    if name is None:
        raise DatasetFormatError(line_no, "needs a field 'answer' (or 'reference_answer') that is "
                                 "a non-empty string or a number, for the built-in verifier")
    value = row[name]
    # bool is an int in Python but never a sensible answer; NaN/inf cannot be matched.
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if is_number and not math.isfinite(value):
        raise DatasetFormatError(line_no, f"field '{name}' must be a finite number")
    if not (is_number or (isinstance(value, str) and value.strip())):
        raise DatasetFormatError(line_no, f"field '{name}' must be a non-empty string or a number "
                                 "for the built-in verifier (a grader can read any JSON)")


def _row(line_no: int, raw: str | bytes, need_answer: bool = True) -> dict | None:
    """The line's object, None for a blank line; DatasetFormatError when it is invalid."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DatasetFormatError(line_no, "is not valid UTF-8") from None
    if not raw.strip():
        return None
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(line_no, f"is not valid JSON ({exc.msg})") from None
    except RecursionError:  # e.g. 50,000 nested brackets
        raise DatasetFormatError(line_no, "is nested too deeply") from None
    if not isinstance(row, dict):
        raise DatasetFormatError(line_no, f"must be a JSON object, got {type(row).__name__}")
    if "messages" in row:
        try:
            parse_messages(row["messages"])
        except MessagesError as exc:
            raise DatasetFormatError(line_no, str(exc)) from None
    else:
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetFormatError(line_no, "needs a non-empty string field 'prompt' or "
                                     "OpenAI's 'messages' (a list of {role, content})")
    if need_answer:
        _check_answer(line_no, row)
    return row


def iter_rows(lines: Iterable[str | bytes], verifier: str | None = None,
              need_answer: bool = True) -> Iterator[dict]:
    """The rows of a JSONL file one by one (blank lines skipped); DatasetFormatError at the
    first bad line. With `verifier`, the answers are also checked for it (numbers for
    `numeric`, valid patterns for `regex`); `need_answer=False` accepts rows without one."""
    check = ANSWER_CHECKS.get(verifier or "") if need_answer else None
    for line_no, raw in enumerate(lines, start=1):
        row = _row(line_no, raw, need_answer)
        if row is None:
            continue
        if check is not None:
            try:
                check(str(row[answer_field(row)]))
            except ValueError as exc:
                raise DatasetFormatError(line_no, str(exc)) from None
        yield row


def validate_jsonl(lines: Iterable[str | bytes], verifier: str | None = None,
                   need_answer: bool = True) -> list[dict]:
    """All rows of a JSONL file (see `iter_rows`); DatasetFormatError if there are none."""
    rows = list(iter_rows(lines, verifier, need_answer))
    if not rows:
        raise DatasetFormatError(0, "has no examples")
    return rows


def capped_lines(fh: BinaryIO, max_line_bytes: int) -> Iterator[bytes]:
    """The file's lines, never reading more than `max_line_bytes` of one line into memory."""
    line_no = 0
    while line := fh.readline(max_line_bytes + 1):
        line_no += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):  # newline not counted
            raise DatasetFormatError(line_no, f"is longer than {max_line_bytes} bytes")
        yield line


def count_valid_rows(fh: BinaryIO, max_line_bytes: int) -> int:
    """Validate a JSONL file line by line, holding one row at a time; returns its row count.

    What the API's upload runs: memory stays at one line (at most `max_line_bytes`) however
    large the file, where `validate_jsonl` keeps every row.
    """
    count = sum(1 for _ in iter_rows(capped_lines(fh, max_line_bytes), need_answer=False))
    if count == 0:
        raise DatasetFormatError(0, "has no examples")
    return count


def item_keys(row: dict) -> set[str]:
    """The top-level fields of the `item` a grader sees for `row`
    (trainer.graders.scorer.example_item): the row's own, `prompt` and `question` always, and
    `answer` where the row has a reference answer (`answer` or `reference_answer`)."""
    return set(row) | {"prompt", "question"} | ({"answer"} if answer_field(row) else set())


def _example(row: dict) -> Example:
    name = answer_field(row)
    value = row.get(name) if name else ""
    answer = value if isinstance(value, str) else json.dumps(value)  # a grader may take any JSON
    if "messages" in row:  # the whole row is the item; the renderer reads payload["messages"]
        return Example(question=row_question(row), answer=answer, payload=dict(row))
    payload = {k: v for k, v in row.items() if k not in ("prompt", "answer")}
    return Example(question=row["prompt"], answer=answer, payload=payload)


def split(n: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Shuffled (train, eval) indices: round(n * eval_fraction) eval rows, at least 1 of each."""
    if n < 2:
        raise ValueError(f"the dataset has {n} example(s); a train and an eval split need at least 2")
    n_eval = min(max(1, round(n * eval_fraction)), n - 1)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order[n_eval:], order[:n_eval]


def dedupe_by_prompt(rows: list[dict]) -> list[dict]:
    """The first row of each distinct prompt: a prompt in both splits would leak the eval."""
    seen: set[str] = set()
    out = []
    for row in rows:
        question = row_question(row)
        if question not in seen:
            seen.add(question)
            out.append(row)
    return out


def build(spec: DatasetSection, path: Path, seed: int, need_answer: bool = True) -> Task:
    """The uploaded dataset at `path`, split deterministically by `seed` (`need_answer`:
    False when a grader, not the verifier, rewards the job)."""
    with open(path, "rb") as fh:
        rows = dedupe_by_prompt(validate_jsonl(fh, verifier=spec.verifier_name, need_answer=need_answer))
    train_idx, eval_idx = split(len(rows), spec.eval_fraction, seed)
    return Task(
        name=spec.id,
        train=[_example(rows[i]) for i in train_idx],
        eval=[_example(rows[i]) for i in eval_idx],
        verifier_spec=VerifierSpec.of(
            "dataset", verifier=spec.verifier_name, numeric_tolerance=spec.tolerance),
    )


def make_verifier(options: dict[str, Any]) -> Verifier:
    """The dataset spec's verifier, called with the spec's options."""
    fn = VERIFIERS[options["verifier"]]
    opts = {k: v for k, v in options.items() if k != "verifier"}

    def verify(extracted: str, answer: str, payload: dict) -> float:
        return fn(extracted, answer, **opts)

    return verify
