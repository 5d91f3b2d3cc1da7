"""Property test: every spec the API accepts survives what happens to it next unchanged.

The API validates a job spec, stores `spec.model_dump(mode="json")` (every default written
out) in a JSON column, and the worker re-validates that stored dict (`JobSpec.model_validate`
in worker/training_job.py); a probe's spec goes the same way. A validator that looks at which
fields were *set* (pydantic's `model_fields_set`) sees the stored defaults as set and may
refuse what the API accepted: an uploaded dataset + grader job was accepted with a 201 and
then failed at the worker. Here hypothesis draws specs over the whole spec space,
built by walking the real pydantic models (every field omitted or drawn from its annotation
and bounds), with the task's free-form parts (reasoning-gym configs, graders) drawn from valid
ones, and checks that what was accepted re-validates, after a JSON round trip, to the same
dump.
"""
from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings as hsettings, strategies as st
from pydantic import BaseModel, ValidationError

from trainer.probe_spec import ProbeSpec
from trainer.spec import DatasetTask, JobSpec, ReasoningGymTask

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Graders of every type the service takes (the examples', and a multi of python + check).
GRADERS = [json.loads(p.read_text()) for p in sorted((EXAMPLES / "graders").glob("*.json"))] + [
    {"type": "python", "name": "ref", "source": "def grade(sample, item):\n    return float("
     "item['reference_answer'] in sample['output_text'])\n"},
    {"type": "multi", "name": "m", "calculate_output": "0.5 * a + 0.5 * b", "graders": {
        "a": {"type": "string_check", "name": "a", "input": "{{ sample.output_text }}",
              "reference": "{{ item.answer }}", "operation": "eq"},
        "b": {"type": "python", "name": "b", "source": "def grade(sample, item):\n    return 1.0\n"}}},
]
# Reasoning-gym tasks and configs that their own checks accept.
RG = st.sampled_from([
    {"name": "chain_sum", "config": {}},
    {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
    {"name": "basic_arithmetic", "config": {}},
    {"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 3}},
])
# The task's free-form fields: drawn from valid values, not from their `dict[str, Any]` type.
OVERRIDES: dict[str, st.SearchStrategy] = {
    "task.grader": st.one_of(st.none(), st.sampled_from(GRADERS)),
    "task.reasoning_gym.name": st.nothing(),  # drawn with its config (RG)
    "task.reasoning_gym.config": st.nothing(),
    "task.dataset.id": st.from_regex(r"ds_[0-9a-f]{8}", fullmatch=True),
    "model.path": st.sampled_from(["builtin:tiny", "/models/qwen", "Qwen/Qwen2.5-0.5B"]),
    "model.lora.target_modules": st.one_of(st.just("all-linear"), st.lists(
        st.sampled_from(["q_proj", "v_proj", "down_proj"]), min_size=1, max_size=3, unique=True)),
    "rollout.broaden.metric": st.sampled_from(["eval/pass@1", "eval/pass@4", "eval/pass@16"]),
    "task.env.args": st.dictionaries(st.sampled_from(["num_examples", "difficulty"]), st.integers(0, 9), max_size=2),
    "task.env.name": st.sampled_from([None, "vf-calc", "wordle"]),
    "task.env.tools": st.sampled_from([None, 'def add(a: int, b: int) -> int:\n    """Add.\n\n    Args:\n'
                                             '        a: x\n        b: y\n    """\n    return a + b\n']),
    "name": st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12),
}
# Small numbers for the fields whose cross-field rules bound each other (samples per step,
# eval.k within samples_per_prompt): huge draws would only be refused.
SMALL = {"n", "prompts_per_step", "steps", "samples_per_prompt", "mini_batches", "max_n",
         "probe_n", "factor", "gpus_per_node"}


def _bounds(metadata: list) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metadata:
        for name in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            if getattr(m, name, None) is not None:
                out[name] = getattr(m, name)
    return out


def _number(kind: type, b: dict[str, Any], small: bool) -> st.SearchStrategy:
    lo = b.get("ge", b.get("gt"))
    hi = b.get("le", b.get("lt"))
    if kind is int:
        lo = -10**6 if lo is None else int(lo) + (1 if "gt" in b else 0)
        hi = 10**6 if hi is None else int(hi) - (1 if "lt" in b else 0)
        if small:
            hi = min(hi, max(lo, 32))
        return st.integers(lo, hi)
    return st.floats(-1e6 if lo is None else lo, 1e6 if hi is None else hi,
                     exclude_min="gt" in b, exclude_max="lt" in b, allow_nan=False,
                     allow_infinity=False, allow_subnormal=False)


def _of(annotation: Any, metadata: list, path: str) -> st.SearchStrategy:
    """A strategy for values of `annotation` (with pydantic's bounds in `metadata`)."""
    if path in OVERRIDES:
        return OVERRIDES[path]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _of(args[0], [*metadata, *args[1:]], path)
    if hasattr(annotation, "metadata") and hasattr(annotation, "annotation"):  # a FieldInfo
        return _of(annotation.annotation, [*metadata, *annotation.metadata], path)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_of(a, metadata, path) for a in args])
    if origin is Literal:
        return st.sampled_from(args)
    if annotation is type(None):
        return st.none()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model(annotation, path + ".")
    b = _bounds(metadata)
    leaf = path.rsplit(".", 1)[-1]
    if annotation is bool:
        return st.booleans()
    if annotation in (int, float):
        return _number(annotation, b, leaf in SMALL)
    if annotation is str:
        if "pattern" in b:
            return st.from_regex(re.compile(b["pattern"]), fullmatch=True)
        return st.text(min_size=b.get("min_length", 0), max_size=min(b.get("max_length", 20), 20))
    if origin is list:
        return st.lists(_of(args[0], [], path + "[]"), min_size=b.get("min_length", 0),
                        max_size=min(b.get("max_length", 4), 4))
    if origin is tuple:
        return st.tuples(*[_of(a, [], path) for a in args])
    raise NotImplementedError(f"{path}: no strategy for {annotation!r}; add one to OVERRIDES")


def model(cls: type[BaseModel], prefix: str = "") -> st.SearchStrategy[dict]:
    """Dicts for `cls`: each required field drawn, each optional one omitted (its default) or
    drawn, from the real model's fields."""
    required, optional = {}, {}
    for name, info in cls.model_fields.items():
        strategy = _of(info.annotation, list(info.metadata), prefix + name)
        (required if info.is_required() else optional)[name] = strategy
    if cls.__name__ == "ReasoningGymTask":  # name and config drawn together, valid for the task
        return st.tuples(RG, st.fixed_dictionaries({}, optional={
            k: v for k, v in optional.items() if k != "config"})).map(lambda p: {**p[1], **p[0]})
    return st.fixed_dictionaries(required, optional=optional)


def _accepted(cls: type[BaseModel], raw: dict) -> BaseModel:
    """What the API accepts: the body arrives as JSON."""
    try:
        return cls.model_validate(json.loads(json.dumps(raw)))
    except ValidationError:
        assume(False)
        raise  # unreachable


def _round_trips(cls: type[BaseModel], spec: BaseModel) -> None:
    stored = json.loads(json.dumps(spec.model_dump(mode="json")))  # the database's JSON column
    try:
        again = cls.model_validate(stored)  # the worker's re-validation
    except ValidationError as exc:
        pytest.fail(f"accepted, then refused after the round trip: {exc}\nstored: {stored}")
    assert again.model_dump(mode="json") == spec.model_dump(mode="json")
    assert again == spec


SETTINGS = hsettings(max_examples=300, deadline=None,
                     suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@SETTINGS
@given(model(JobSpec))
def test_every_accepted_job_spec_survives_storage_and_revalidation(raw):
    _round_trips(JobSpec, _accepted(JobSpec, raw))


@SETTINGS
@given(model(ProbeSpec))
def test_every_accepted_probe_spec_survives_storage_and_revalidation(raw):
    _round_trips(ProbeSpec, _accepted(ProbeSpec, raw))


# The shapes the issue names, each drawn over the rest of the spec: hypothesis must not depend
# on finding them by chance.
DATASET_TASKS = st.fixed_dictionaries(
    {"dataset": model(DatasetTask, "task.dataset."),
     "grader": st.sampled_from(GRADERS)},
    optional={"reward": st.sampled_from(["binary", "score"])})
RG_TASKS = st.fixed_dictionaries({"reasoning_gym": model(
    ReasoningGymTask, "task.reasoning_gym."),
    "grader": st.sampled_from(GRADERS)})


@SETTINGS
@given(model(JobSpec), st.one_of(DATASET_TASKS, RG_TASKS),
       st.one_of(st.none(), st.fixed_dictionaries({"rank": st.integers(1, 64)})))
def test_grader_jobs_with_lora_and_eval_round_trip(raw, task, lora):
    raw = {**raw, "task": task}
    if lora is not None:
        raw["model"] = {**raw.get("model", {}), "lora": lora}
        raw["optim"] = {**raw.get("optim", {}), "optimizer_state": "fp32"}
    _round_trips(JobSpec, _accepted(JobSpec, raw))


def test_a_dataset_and_grader_job_round_trips():
    """The issue's own case, spelled out: no verifier given, a grader, stored, re-validated."""
    spec = JobSpec.model_validate({"name": "x", "task": {"dataset": {"id": "ds_1"},
                                                         "grader": GRADERS[0]}})
    again = JobSpec.model_validate(json.loads(json.dumps(spec.model_dump(mode="json"))))
    assert again == spec and again.task.dataset.verifier is None


def test_a_verifier_and_a_grader_together_are_still_refused():
    for dataset in ({"id": "ds_1", "verifier": "exact"}, {"id": "ds_1", "numeric_tolerance": 0.1}):
        with pytest.raises(ValidationError, match="give either task.grader or the dataset's verifier"):
            JobSpec.model_validate({"name": "x", "task": {"dataset": dataset, "grader": GRADERS[0]}})


def test_every_example_spec_validates_and_round_trips():
    specs = [p for p in sorted(EXAMPLES.rglob("*.y*ml")) if "task" in (yaml.safe_load(p.read_text()) or {})]
    assert len(specs) >= 4  # examples/*.yaml, examples/graders/code_spec.yaml, ...
    for path in specs:
        _round_trips(JobSpec, JobSpec.model_validate(yaml.safe_load(path.read_text())))
