"""Whether an uploaded dataset can feed a job's reward: checked at submission, one line at a
time, so a job whose rows its verifier or grader cannot read is a 422 naming the field rather
than a failure at the worker."""
from __future__ import annotations

from typing import BinaryIO

from trainer.graders.schemas import parse_grader
from trainer.spec_base import FieldError
from trainer.tasks.base import TaskSection
from trainer.tasks.dataset_task import DatasetFormatError, capped_lines, item_keys, iter_rows


def check_rows_for(fh: BinaryIO, task: TaskSection, max_line_bytes: int) -> None:
    """FieldError when the dataset cannot feed the job's reward, one line at a time.

    Without a grader every row needs an `answer` the verifier accepts; with one, every row
    needs each top-level field the grader's templates (or its verifier / code type) read.
    """
    lines = capped_lines(fh, max_line_bytes)
    if task.grader is None:
        verifier = task.dataset.verifier_name
        try:
            for _ in iter_rows(lines, verifier):
                pass
        except DatasetFormatError as exc:
            raise FieldError("task.dataset.id", f"the {verifier} verifier cannot use this "
                             f"dataset: {exc}") from None
        return
    fields = sorted(parse_grader(task.grader).item_fields())
    for index, row in enumerate(iter_rows(lines, need_answer=False)):
        keys = item_keys(row)
        for name in fields:
            if name not in keys:
                raise FieldError("task.grader", f"reads item.{name}, but dataset row {index} "
                                 f"has no field {name!r}")
