"""Graders: the rewards a tenant defines (OpenAI's grader JSON) and the sandbox that runs them.

Pure like the rest of trainer/: no api/, store/ or worker/ imports and no torch. The entry
points are `parse_grader` (validation), `grade_batch` (the trainer's scorer) and `run_grader`
(one sample, OpenAI's run-response shape). Tenant Python and generated programs only ever run
inside `trainer.graders.sandbox`, never in the calling process.
"""
from trainer.graders.batch import (  # noqa: E402
    ERROR_FLAGS, GradeResult, GraderRuntime, grade_batch, make_sample, run_grader,
    validate_grader)
from trainer.graders.schemas import Grader, needs_sandbox, parse_grader  # noqa: E402
from trainer.graders.sandbox.detect import sandbox_layer  # noqa: E402
from trainer.graders.sandbox.layer import SandboxUnavailable  # noqa: E402

__all__ = ["ERROR_FLAGS", "GradeResult", "Grader", "GraderRuntime", "SandboxUnavailable",
           "grade_batch", "make_sample", "needs_sandbox", "parse_grader", "run_grader",
           "sandbox_layer", "validate_grader"]
