"""Grader definitions: OpenAI's reinforcement fine-tuning grader JSON, as pydantic models.

A grader JSON that OpenAI accepts (`string_check`, `text_similarity`, `python`,
`score_model`, `label_model`, `multi`) validates here unchanged, as OpenAI's platform took it:
`name` may be left out (it defaults to the type), judge messages' `content` is a string or
OpenAI's content parts, `sampling_params` takes OpenAI's keys. Two types are this service's
own: `code`, which runs the program in a completion against the dataset row's tests, and
`verifier`, the built-in verifiers. Validation checks everything that
can be checked without running anything (templates, formulas, the python source's syntax
and size), so a bad grader is refused with an error naming the field before a job is queued.
Models are frozen and forbid unknown fields, like the job spec they will live in.
"""
from __future__ import annotations

import ast
import difflib

from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, field_validator,
    model_validator)

from trainer.graders import formula, templates

MAX_PYTHON_SOURCE_BYTES = 256 * 1024
MAX_MULTI_GRADERS = 16
ROUGE_METRICS = tuple(f"rouge_{n}" for n in range(1, 6)) + ("rouge_l",)


class _Grader(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        # OpenAI's own examples leave `name` out of python and multi graders (its platform
        # took them): the type is the name then. Filled in before validation, so what is
        # stored and validated again later is the same grader.
        if (isinstance(data, dict) and "name" not in data
                and cls.model_fields["name"].annotation is str):
            return {**data, "name": str(data.get("type") or "grader")}
        return data

    def templates(self) -> dict[str, str]:
        """Field name -> template source, for the fields that are templates."""
        return {}

    def item_fields(self) -> set[str]:
        """Top-level dataset fields the grader's templates read."""
        out: set[str] = set()
        for source in self.templates().values():
            out |= templates.item_fields(source)
        return out


def _template(value: str) -> str:
    try:
        templates.template_paths(value)
    except templates.TemplateError as exc:
        raise ValueError(str(exc)) from None
    return value


class StringCheckGrader(_Grader):
    """1 if `input` and `reference` compare as `operation` says, else 0."""

    type: Literal["string_check"]
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]

    _check_input = field_validator("input", "reference")(_template)

    def templates(self) -> dict[str, str]:
        return {"input": self.input, "reference": self.reference}


class TextSimilarityGrader(_Grader):
    """A similarity score in [0, 1] between `input` and `reference` (`evaluation_metric`)."""

    type: Literal["text_similarity"]
    input: str
    reference: str
    evaluation_metric: Literal[
        "fuzzy_match", "bleu", "gleu", "meteor", "cosine",
        "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"]
    pass_threshold: float = Field(default=0.0, ge=0.0, le=1.0)

    _check_input = field_validator("input", "reference")(_template)

    def templates(self) -> dict[str, str]:
        return {"input": self.input, "reference": self.reference}


class PythonGrader(_Grader):
    """Tenant Python: `source` defines `grade(sample, item) -> float`; run in the sandbox."""

    type: Literal["python"]
    source: str
    image_tag: str | None = Field(default=None, max_length=128)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_PYTHON_SOURCE_BYTES:
            raise ValueError(f"source is {size} bytes; at most {MAX_PYTHON_SOURCE_BYTES}")
        try:
            # Compiling is parsing, not running: the code itself only ever runs sandboxed.
            tree = ast.parse(value, "grader.py")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            line = getattr(exc, "lineno", None)
            raise ValueError(f"source does not compile"
                             f"{f' (line {line})' if line else ''}: {exc}") from None
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
        if "grade" not in defined:
            raise ValueError("source must define grade(sample, item)")
        return value


class CodeGrader(_Grader):
    """Runs the program in the completion against the row's tests; reward = fraction passed.

    `tests` names the dataset field holding the tests: a list whose entries are either
    `{"stdin": ..., "stdout": ...}` (the program reads stdin, its stdout must match) or an
    assert against a function the program defines (`"assert add(1, 2) == 3"`).
    """

    type: Literal["code"]
    input: str = "{{ sample.output_text }}"
    tests: str = Field(default="tests", min_length=1, max_length=128,
                       pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    language: Literal["python"] = "python"
    timeout_s: float = Field(default=2.0, gt=0, le=60)

    _check_input = field_validator("input")(_template)

    def templates(self) -> dict[str, str]:
        return {"input": self.input}

    def item_fields(self) -> set[str]:
        return super().item_fields() | {self.tests}


class VerifierGrader(_Grader):
    """A built-in verifier as a grader, so every reward takes the same path.

    `name` picks it: `exact`, `numeric`, `math`, `regex` (the dataset verifiers) or
    `reasoning_gym` (the task's own scorer; `task` and `config` name the dataset). The
    answer is what the completion puts in <answer>...</answer>, checked against
    `item.answer`; a completion without one scores 0.
    """

    type: Literal["verifier"]
    name: Literal["exact", "numeric", "math", "regex", "reasoning_gym"]
    numeric_tolerance: float = Field(default=1e-6, ge=0, le=1e6)
    task: str | None = Field(default=None, max_length=128)
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _task(self) -> "VerifierGrader":
        if (self.name == "reasoning_gym") != (self.task is not None):
            raise ValueError("task (a reasoning-gym dataset name) is required for "
                             "name 'reasoning_gym' and only for it")
        if self.task is not None:
            from reasoning_gym.factory import DATASETS  # lazily: only this type needs it

            if self.task not in DATASETS:
                close = difflib.get_close_matches(self.task, sorted(DATASETS), n=3)
                raise ValueError(f"task {self.task!r} is not a reasoning-gym dataset"
                                 f"{f' (did you mean {close})' if close else ''}")
        return self

    def item_fields(self) -> set[str]:
        return {"answer"}


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextPart(_Part):
    """OpenAI's `input_text` / `output_text` content part: text, a template."""

    type: Literal["input_text", "output_text"]
    text: str = Field(max_length=templates.MAX_TEMPLATE_CHARS)
    # The SDK's ResponseInputText carries this for prompt caching; it changes nothing here.
    prompt_cache_breakpoint: dict[str, Any] | None = None

    _check_text = field_validator("text")(_template)


class _RefusedPart(_Part):
    model_config = ConfigDict(frozen=True, extra="allow")

    @model_validator(mode="after")
    def _refuse(self) -> "_RefusedPart":
        # What a text-only judge cannot read is refused before a job is queued, not sent
        # to the judge as nothing (a grade that ignored the image would look like a grade).
        raise ValueError(f"{self.type} content is not supported: the judges on this service "
                         f"read text only; give the content as input_text")


class ImagePart(_RefusedPart):
    type: Literal["input_image"]


class AudioPart(_RefusedPart):
    type: Literal["input_audio"]


ContentPart = Annotated[Union[TextPart, ImagePart, AudioPart], Field(discriminator="type")]


def _shape(value: Any) -> str:
    # Picks the one alternative to validate against, so an error names that one only.
    if isinstance(value, list):
        return "parts"
    return "part" if isinstance(value, (dict, _Part)) else "text"


_Item = Annotated[Union[Annotated[str, Tag("text")], Annotated[ContentPart, Tag("part")]],
                  Discriminator(_shape)]
Content = Annotated[Union[Annotated[str, Tag("text")], Annotated[ContentPart, Tag("part")],
                          Annotated[list[_Item], Tag("parts")]], Discriminator(_shape)]


class Message(BaseModel):
    """A judge message: `content` is a template string, one content part or a list of them
    (strings or parts), as OpenAI's grader inputs take it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: Content
    type: Literal["message"] | None = None

    @field_validator("content")
    @classmethod
    def _check_content(cls, value):
        if isinstance(value, str):
            if len(value) > templates.MAX_TEMPLATE_CHARS:
                raise ValueError(f"at most {templates.MAX_TEMPLATE_CHARS} characters")
            return _template(value)
        if isinstance(value, list):
            if not 1 <= len(value) <= 64:
                raise ValueError("a list of 1 to 64 content parts")
            for part in value:
                if isinstance(part, str):
                    _template(part)
        return value

    def texts(self) -> dict[str, str]:
        """Field path (under `content`) -> template, for each text in the content."""
        if isinstance(self.content, str):
            return {"content": self.content}
        if isinstance(self.content, TextPart):
            return {"content.text": self.content.text}
        return {f"content.{j}" + ("" if isinstance(p, str) else ".text"):
                p if isinstance(p, str) else p.text for j, p in enumerate(self.content)}


class SamplingParams(BaseModel):
    """The judge's sampling, with OpenAI's keys; `max_tokens` is what OpenAI's own examples
    send (its platform took it), `max_completions_tokens` what its reference names."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    max_completions_tokens: int | None = Field(default=None, ge=1, le=32768)
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh",
                              "max"] | None = None


class _ModelGrader(_Grader):
    """An LLM judge; `model` names a judge the operator configured (never a URL)."""

    model: str = Field(min_length=1, max_length=128)
    input: list[Message] = Field(min_length=1, max_length=32)

    def templates(self) -> dict[str, str]:
        return {f"input.{i}.{path}": text for i, m in enumerate(self.input)
                for path, text in m.texts().items()}


class ScoreModelGrader(_ModelGrader):
    """The judge's numeric `result`, within `range`."""

    type: Literal["score_model"]
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    # OpenAI's examples give one; the reward is the score all the same (a pass in evals).
    pass_threshold: float | None = None

    @field_validator("range")
    @classmethod
    def _range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not value[0] < value[1]:
            raise ValueError("range must be [low, high] with low < high")
        return value


class LabelModelGrader(_ModelGrader):
    """1 if the judge's label is one of `passing_labels`, else 0."""

    type: Literal["label_model"]
    labels: list[str] = Field(min_length=2, max_length=64)
    passing_labels: list[str] = Field(min_length=1, max_length=64)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)

    @model_validator(mode="after")
    def _passing(self) -> "LabelModelGrader":
        unknown = sorted(set(self.passing_labels) - set(self.labels))
        if unknown:
            raise ValueError(f"passing_labels {unknown} are not among labels")
        return self


class MultiGrader(_Grader):
    """Several graders and a formula over their scores (`calculate_output`)."""

    type: Literal["multi"]
    graders: dict[str, "Grader"]
    calculate_output: str

    @field_validator("graders")
    @classmethod
    def _graders(cls, value: dict) -> dict:
        if not value:
            raise ValueError("graders must name at least one grader")
        if len(value) > MAX_MULTI_GRADERS:
            raise ValueError(f"at most {MAX_MULTI_GRADERS} graders")
        for key in value:
            if not key.isidentifier():
                raise ValueError(f"grader key {key!r} must be a name usable in "
                                 f"calculate_output (letters, digits, _)")
        return value

    @model_validator(mode="after")
    def _formula(self) -> "MultiGrader":
        try:
            formula.check_names(self.calculate_output, self.graders)
        except formula.FormulaError as exc:
            raise ValueError(f"calculate_output: {exc}") from None
        return self

    def templates(self) -> dict[str, str]:
        return {f"graders.{k}.{f}": s for k, g in self.graders.items()
                for f, s in g.templates().items()}

    def item_fields(self) -> set[str]:
        out: set[str] = set()
        for grader in self.graders.values():
            out |= grader.item_fields()
        return out


Grader = Annotated[
    Union[StringCheckGrader, TextSimilarityGrader, PythonGrader, CodeGrader, VerifierGrader,
          ScoreModelGrader, LabelModelGrader, MultiGrader],
    Field(discriminator="type"),
]
MultiGrader.model_rebuild()
GRADER_ADAPTER: TypeAdapter = TypeAdapter(Grader)
GRADER_TYPES = ("string_check", "text_similarity", "python", "code", "verifier", "score_model",
                "label_model", "multi")


def parse_grader(data: Any) -> _Grader:
    """A validated grader from its JSON (dict); pydantic's ValidationError names the field."""
    if isinstance(data, _Grader):
        return data
    return GRADER_ADAPTER.validate_python(data)


def needs_sandbox(grader: _Grader) -> bool:
    """True if grading runs tenant or model code (python, code, or a multi holding one)."""
    if isinstance(grader, MultiGrader):
        return any(needs_sandbox(g) for g in grader.graders.values())
    return isinstance(grader, (PythonGrader, CodeGrader))
