"""Grading a batch of samples with any grader: the one reward path the trainer calls.

`GraderRuntime` owns the sandbox pools (one per mode, started on first use and reused by
every batch) and `grade(grader, samples, items)` returns one `GradeResult` per sample: the
reward, each `multi` sub-reward, OpenAI's error flags and the seconds spent. A sample whose
grading fails scores 0 with its flag set; the others keep their scores. `run_grader` is
OpenAI's `/graders/run` for one sample, in OpenAI's response shape.
Deterministic graders (string_check, text_similarity, multi's formula, the code grader's
verdicts) run here; tenant Python and generated programs run only in the sandbox.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from trainer.graders import code, formula, judges, similarity, templates
from trainer.graders.schemas import (
    CodeGrader, LabelModelGrader, MultiGrader, PythonGrader, ScoreModelGrader,
    StringCheckGrader, TextSimilarityGrader, VerifierGrader, parse_grader)
from trainer.graders.sandbox.layer import Limits
from trainer.graders.sandbox.pool import SandboxPool
from trainer.graders.verifier_cache import VerifierScorers

# OpenAI's `metadata.errors` flags (openai-python's GraderRunResponse.MetadataErrors); the
# `*_details` / `*_type` strings beside them come from `GradeResult.openai_errors`.
ERROR_FLAGS = ("formula_parse_error", "invalid_variable_error", "model_grader_parse_error",
               "model_grader_refusal_error", "model_grader_server_error", "other_error",
               "python_grader_runtime_error", "python_grader_server_error",
               "sample_parse_error", "truncated_observation_error", "unresponsive_reward_error")


@dataclass
class GradeResult:
    reward: float = 0.0
    sub_rewards: dict[str, float] = field(default_factory=dict)
    errors: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(ERROR_FLAGS, False))
    details: str = ""
    seconds: float = 0.0
    # Judge tokens by model (the id the grader named): OpenAI's prompt_tokens,
    # completion_tokens, total_tokens, cached_tokens.
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    sampled_model_name: str | None = None
    server_error_type: str | None = None

    @property
    def failed(self) -> bool:
        return any(self.errors.values())

    def fail(self, flag: str, details: str) -> "GradeResult":
        self.reward, self.errors[flag] = 0.0, True
        self.details = self.details or details[:2000]
        return self

    def add_usage(self, model: str, usage: dict[str, int]) -> None:
        if not usage:
            return
        mine = self.usage.setdefault(model, {})
        for key, value in usage.items():
            mine[key] = mine.get(key, 0) + value

    def absorb(self, sub: "GradeResult") -> None:
        """A multi's sub-result: its flags, first details, usage and names join this one."""
        for flag, value in sub.errors.items():
            self.errors[flag] = self.errors.get(flag, False) or value
        self.details = self.details or sub.details
        for model, usage in sub.usage.items():
            self.add_usage(model, usage)
        self.sampled_model_name = self.sampled_model_name or sub.sampled_model_name
        self.server_error_type = self.server_error_type or sub.server_error_type

    def openai_errors(self) -> dict[str, Any]:
        """OpenAI's `metadata.errors`: every flag, and the details beside the flag they tell of."""
        out: dict[str, Any] = {flag: bool(self.errors.get(flag)) for flag in ERROR_FLAGS}
        details = self.details or None
        out["python_grader_runtime_error_details"] = (
            details if out["python_grader_runtime_error"] else None)
        out["model_grader_server_error_details"] = (
            details if out["model_grader_server_error"] else None)
        out["python_grader_server_error_type"] = (
            (self.server_error_type or "sandbox_error") if out["python_grader_server_error"]
            else None)
        return out

    def token_usage(self) -> int | None:
        if not self.usage:
            return None
        return sum(u.get("total_tokens", 0) for u in self.usage.values())


def make_sample(output: str | dict) -> dict:
    """OpenAI's `sample` from a completion text (or a dict already in that shape).

    `output_json` is the output parsed whenever it is valid JSON (a scalar such as `0.9` or
    `true` too, as OpenAI's run endpoint does); from a chat completion's `choices`, the first
    message fills `output_text` and its `tool_calls` fill `output_tools` when not given.
    """
    if isinstance(output, dict):
        sample = dict(output)
        message = _first_message(sample.get("choices"))
        if "output_text" not in sample and isinstance(message.get("content"), str):
            sample["output_text"] = message["content"]
        if not sample.get("output_tools") and isinstance(message.get("tool_calls"), list):
            sample["output_tools"] = message["tool_calls"]
        text = sample.setdefault("output_text", "")
    else:
        text, sample = output, {"output_text": output}
    if "output_json" not in sample:
        try:
            sample["output_json"] = json.loads(text)
        except (ValueError, TypeError, RecursionError):
            sample["output_json"] = None
    if sample.get("output_tools") is None:
        sample["output_tools"] = []
    sample.setdefault("choices", [])
    return sample


def _first_message(choices: Any) -> dict:
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    return {}


class GraderRuntime:
    """One owner's sandbox pools (a job's, or one API call's: never two tenants'), shared by
    its batches; close() kills them. Use as a context manager.

    `stop_check` (the trainer's: raises StopRequested on a cancel or a wall limit) is polled
    while a batch waits on a sandbox, so a stop kills the servers within a fraction of a
    second. Verifier graders use `verifiers` (bounded; trainer.graders.verifier_cache): the
    runtime's own, closed with it, or one shared by many runtimes (the API's)."""

    def __init__(self, pool_size: int = 2, limits: Limits | None = None,
                 timeout_s: float | None = None, tag: str = "brorl-grader",
                 stop_check: Callable[[], None] | None = None,
                 verifiers: VerifierScorers | None = None):
        self.limits = limits or Limits.from_env()
        self.timeout_s = min(timeout_s or self.limits.timeout_s, self.limits.timeout_s)
        self.pool_size, self.tag, self.stop_check = pool_size, tag, stop_check
        self._pools: dict[str, SandboxPool] = {}
        self._own_verifiers = verifiers is None
        self.verifiers = verifiers or VerifierScorers(timeout_s=min(self.timeout_s, 30.0))

    def pool(self, mode: str) -> SandboxPool:
        if mode not in self._pools:
            self._pools[mode] = SandboxPool(mode, self.pool_size, self.limits, self.tag)
        return self._pools[mode]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self._own_verifiers:
            self.verifiers.close()

    def __enter__(self) -> "GraderRuntime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ grading

    def grade(self, grader: Any, samples: Sequence[str | dict],
              items: Sequence[dict]) -> list[GradeResult]:
        """One result per (sample, item) pair."""
        if len(samples) != len(items):
            raise ValueError(f"{len(samples)} samples but {len(items)} items")
        grader = parse_grader(grader)
        start = time.perf_counter()
        results = self._grade(grader, [make_sample(s) for s in samples], list(items))
        per = (time.perf_counter() - start) / max(1, len(results))
        for result in results:
            result.seconds = per
        return results

    def _grade(self, grader, samples: list[dict], items: list[dict]) -> list[GradeResult]:
        if isinstance(grader, MultiGrader):
            return self._multi(grader, samples, items)
        if isinstance(grader, PythonGrader):
            return self._python(grader, samples, items)
        if isinstance(grader, CodeGrader):
            return self._code(grader, samples, items)
        if isinstance(grader, VerifierGrader):
            return self._verifier(grader, samples, items)
        if isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
            return _judged(grader, samples, items)
        return [_deterministic(grader, s, i) for s, i in zip(samples, items)]

    def _multi(self, grader: MultiGrader, samples, items) -> list[GradeResult]:
        subs = {key: self._grade(g, samples, items) for key, g in grader.graders.items()}
        out = []
        for n in range(len(samples)):
            result = GradeResult(sub_rewards={k: r[n].reward for k, r in subs.items()})
            for sub in (r[n] for r in subs.values()):
                result.absorb(sub)
            if result.failed:
                result.reward = 0.0
            else:
                try:
                    result.reward = formula.evaluate(grader.calculate_output, result.sub_rewards)
                except formula.VariableError as exc:
                    result.fail("invalid_variable_error", str(exc))
                except formula.FormulaError as exc:
                    result.fail("formula_parse_error", str(exc))
            out.append(result)
        return out

    def _python(self, grader: PythonGrader, samples, items) -> list[GradeResult]:
        timeout = self.timeout_s

        def request(payloads: list) -> dict:
            return {"source": grader.source, "items": payloads, "timeout_s": timeout}

        # The server kills a sample's process 2 s past its timer; 10 s covers that and a
        # fresh process's start.
        replies = self.pool("python").map(list(zip(samples, items)), request,
                                          item_timeout_s=timeout + 10.0, chunk=512,
                                          stop_check=self.stop_check)
        return [_python_result(reply) for reply in replies]

    def _code(self, grader: CodeGrader, samples, items) -> list[GradeResult]:
        results = [GradeResult() for _ in samples]
        jobs, tests = [], []
        for n, (sample, item) in enumerate(zip(samples, items)):
            try:
                parsed = code.parse_tests(item.get(grader.tests), grader.tests)
            except code.TestSpecError as exc:
                results[n].fail("other_error", str(exc))
                continue
            program = code.extract_program(templates.render(grader.input, item, sample))
            jobs.append((n, {"source": program[:code.MAX_PROGRAM_CHARS],
                             "tests": [t.sandbox for t in parsed]}))
            tests.append(parsed)
        # A program's tests share the operator's per-sample bound (self.timeout_s), however
        # many there are; the server enforces it, this wait only backs it up.
        longest = grader.timeout_s * max((len(t) for t in tests), default=1)
        replies = self.pool("code").map(
            [job for _, job in jobs],
            lambda ps: {"items": ps, "timeout_s": grader.timeout_s, "cap_s": self.timeout_s},
            item_timeout_s=min(longest, self.timeout_s) + 10.0, chunk=8,
            stop_check=self.stop_check)
        for (n, _), parsed, reply in zip(jobs, tests, replies):
            _code_result(results[n], parsed, reply)
        return results


    def _verifier(self, grader: VerifierGrader, samples, items) -> list[GradeResult]:
        """The trainer's own verifiers, in their timed, crash-isolated process pool."""
        from trainer.tasks.base import VerifierSpec
        from trainer.tasks.scoring_worker import ERROR, TIMEOUT

        if grader.name == "reasoning_gym":
            spec = VerifierSpec.of("reasoning_gym", name=grader.task, config=grader.config)
        else:
            spec = VerifierSpec.of("dataset", verifier=grader.name,
                                   numeric_tolerance=grader.numeric_tolerance)
        rows = [(s["output_text"], str(i.get("answer", "")), i) for s, i in zip(samples, items)]
        try:
            done = self.verifiers.score_each(spec, rows)
        except Exception as exc:  # noqa: BLE001 - e.g. a config the task refuses
            why = f"verifier could not be built: {type(exc).__name__}: {exc}"
            return [GradeResult().fail("other_error", why[:2000]) for _ in samples]
        out = []
        for score, status in done:
            result = GradeResult(reward=float(score))
            if status == TIMEOUT:
                result.fail("unresponsive_reward_error", "verifier timed out")
            elif status == ERROR:
                result.fail("other_error", "verifier failed on this sample")
            out.append(result)
        return out


def _judged(grader, samples: list[dict], items: list[dict]) -> list[GradeResult]:
    """score_model / label_model: one chat call per sample to the configured judge."""
    try:
        judge = judges.get_judge(grader.model)
    except judges.JudgeError as exc:
        return [GradeResult().fail("other_error", str(exc)) for _ in samples]
    labels = grader.labels if isinstance(grader, LabelModelGrader) else None
    bounds = None if labels is not None else tuple(grader.range)
    sampling = grader.sampling_params.model_dump(exclude_none=True)

    def call(sample: dict, item: dict):
        messages = [{"role": m.role, "content": "\n".join(
            templates.render(text, item, sample) for text in m.texts().values())}
            for m in grader.input]
        return lambda: judges.ask(judge, messages, sampling, labels, bounds)

    out = []
    for reply in judges.ask_all([call(s, i) for s, i in zip(samples, items)]):
        result = GradeResult(sampled_model_name=grader.model)
        result.add_usage(grader.model, reply.usage)
        answer = reply.result
        if reply.flag is not None:
            out.append(result.fail(reply.flag, reply.details or reply.flag))
            continue
        if labels is not None:
            if answer not in labels:
                result.fail("model_grader_parse_error",
                            f"judge label {answer!r} is not one of labels")
            else:
                result.reward = float(answer in grader.passing_labels)
        else:
            score = judges.score_of(answer, *grader.range)
            if score is None:
                result.fail("model_grader_parse_error",
                            f"judge result {answer!r} is not a number")
            else:
                result.reward = score
        out.append(result)
    return out


def _deterministic(grader, sample: dict, item: dict) -> GradeResult:
    result = GradeResult()
    if _needs_json(grader) and not isinstance(sample.get("output_json"), (dict, list)):
        return result.fail("sample_parse_error", "the grader reads a field of "
                                                 "sample.output_json, but the output is not a "
                                                 "JSON object or array")
    text = templates.render(grader.input, item, sample)
    reference = templates.render(grader.reference, item, sample)
    try:
        if isinstance(grader, StringCheckGrader):
            result.reward = similarity.string_check(grader, text, reference)
        elif isinstance(grader, TextSimilarityGrader):
            result.reward = similarity.text_similarity(grader, text, reference)
    except similarity.UnsupportedMetric as exc:
        result.fail("other_error", str(exc))
    except Exception as exc:  # noqa: BLE001 - a library failing on odd text is that sample's
        result.fail("other_error", f"{type(exc).__name__}: {exc}")
    return result


def _needs_json(grader) -> bool:
    return any(p[:2] == ("sample", "output_json") and len(p) > 2
               for source in grader.templates().values()
               for p in templates.template_paths(source))


def _python_result(reply: dict) -> GradeResult:
    result = GradeResult()
    if "fault" in reply:
        fault = reply["fault"]
        if fault.startswith("sandbox could not start"):
            result.server_error_type = "sandbox_unavailable"
            return result.fail("python_grader_server_error", fault)
        if fault == "unresponsive":
            return result.fail("unresponsive_reward_error", "grader stopped responding "
                                                            "and was killed")
        return result.fail("python_grader_runtime_error", f"grader process crashed: {fault}")
    if reply.get("error") == "timeout":
        return result.fail("unresponsive_reward_error", f"grade() timed out "
                                                        f"({reply.get('details')})")
    if reply.get("error"):
        return result.fail("python_grader_runtime_error", str(reply.get("details")))
    result.reward = float(reply["reward"])
    return result


def _code_result(result: GradeResult, tests: list, reply: dict) -> None:
    if "fault" in reply:
        if reply["fault"].startswith("sandbox could not start"):
            result.fail("python_grader_server_error", reply["fault"])
        else:
            result.details = f"program run failed: {reply['fault']}"
        return
    raw = reply.get("results")
    if not isinstance(raw, list) or len(raw) != len(tests):
        result.details = f"program failed: {reply.get('error') or 'no results'}"
        return
    verdicts = [code.passed(t, r) for t, r in zip(tests, raw)]
    result.reward = sum(verdicts) / len(verdicts)
    first = next((r for r in raw if isinstance(r, dict) and r.get("error")), None)
    result.details = f"first failure: {str(first['error'])[:500]}" if first else ""


def grade_batch(grader: Any, samples: Sequence[str | dict], items: Sequence[dict],
                runtime: GraderRuntime | None = None) -> list[GradeResult]:
    """Results for a batch; with no runtime, a temporary one (pools started and closed)."""
    if runtime is not None:
        return runtime.grade(grader, samples, items)
    with GraderRuntime() as temporary:
        return temporary.grade(grader, samples, items)


def run_grader(grader: Any, model_sample: str | dict, item: dict | None = None,
               runtime: GraderRuntime | None = None) -> dict:
    """OpenAI's /graders/run response for one sample (openai-python's GraderRunResponse)."""
    grader = parse_grader(grader)
    start = time.perf_counter()
    result = grade_batch(grader, [model_sample], [item or {}], runtime)[0]
    return {
        "reward": result.reward,
        "sub_rewards": result.sub_rewards,
        "model_grader_token_usage_per_model": result.usage,
        "metadata": {
            "name": grader.name, "type": grader.type,
            "execution_time": time.perf_counter() - start,
            "scores": result.sub_rewards, "token_usage": result.token_usage(),
            "sampled_model_name": result.sampled_model_name,
            "errors": result.openai_errors(),
        },
    }


def _walk(grader):
    yield grader
    if isinstance(grader, MultiGrader):
        for sub in grader.graders.values():
            yield from _walk(sub)


def validate_grader(data: Any):
    """The validated grader; ValueError (pydantic's ValidationError is one) naming the field.

    Beyond the models' checks it refuses what this deployment cannot run (meteor, cosine).
    """
    grader = parse_grader(data)
    for node in _walk(grader):
        if isinstance(node, (ScoreModelGrader, LabelModelGrader)):
            try:
                judges.get_judge(node.model)
            except judges.JudgeError as exc:
                raise judges.JudgeError(f"{node.name}: model: {exc}") from None
        if isinstance(node, TextSimilarityGrader):
            try:
                similarity.check_metric(node.evaluation_metric)
            except similarity.UnsupportedMetric as exc:
                raise similarity.UnsupportedMetric(
                    f"{node.name}: evaluation_metric: {exc}") from None
    return grader
