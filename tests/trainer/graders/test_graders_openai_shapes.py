"""OpenAI's shapes in one room each: the `sample` a grader sees (make_sample), the judge's
answer and usage as judges.ask reads them (the HTTP call replaced by canned chat-completion
bodies; the real server is in test_graders_judges.py), and the error fields of a result."""
from __future__ import annotations

import httpx
import pytest

from trainer.graders import judges, make_sample
from trainer.graders.batch import ERROR_FLAGS, GradeResult


@pytest.mark.parametrize("text,parsed", [
    ("0.9", 0.9), ('"x"', "x"), ("true", True), ("null", None), ('{"a": [1]}', {"a": [1]}),
    ("[1, 2]", [1, 2]), ("not json", None), ("", None)])
def test_output_json_is_the_output_whenever_it_is_json(text, parsed):
    sample = make_sample(text)
    assert sample["output_json"] == parsed and sample["output_text"] == text
    assert sample["output_tools"] == [] and sample["choices"] == []


def test_output_tools_and_text_come_from_a_chat_completions_choices():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    sample = make_sample({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "calling", "tool_calls": [call]}}]})
    assert sample["output_tools"] == [call] and sample["output_text"] == "calling"
    given = make_sample({"output_text": "x", "output_tools": [call], "choices": []})
    assert given["output_tools"] == [call]
    none = make_sample({"output_text": "x", "output_tools": None})
    assert none["output_tools"] == []


JUDGE = judges.Judge(name="j", base_url="http://judge.invalid/v1", model="m", max_tokens=64)


def reply(monkeypatch, status: int = 200, message: dict | None = None, finish="stop",
          usage: dict | None = None):
    sent = {}

    def post(url, headers, json, timeout):
        sent.update(json)
        body = {"choices": [{"index": 0, "finish_reason": finish,
                             "message": {"role": "assistant", **(message or {})}}],
                "usage": usage or {"prompt_tokens": 11, "completion_tokens": 5,
                                   "total_tokens": 16}}
        return httpx.Response(status, json=body if status == 200 else {"error": "boom"})

    monkeypatch.setattr(httpx, "post", post)
    return sent


def test_an_openai_style_answer_parses_with_its_usage(monkeypatch):
    sent = reply(monkeypatch, message={
        "content": '{"result": 0.75, "steps": [{"description": "d", "conclusion": "c"}]}'})
    answer = judges.ask(JUDGE, [{"role": "user", "content": "x"}],
                        {"max_completions_tokens": 32768, "reasoning_effort": "low"}, None,
                        (0, 1))
    assert (answer.result, answer.flag) == (0.75, None)
    assert answer.usage == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16,
                            "cached_tokens": 0}
    assert sent["max_tokens"] == 64 and sent["reasoning_effort"] == "low"  # capped


def test_judge_failures_get_openais_flags(monkeypatch):
    reply(monkeypatch, message={"content": None, "refusal": "I can't grade that"})
    assert judges.ask(JUDGE, [], {}, None).flag == "model_grader_refusal_error"
    reply(monkeypatch, message={"content": '{"result": 0.'}, finish="length")
    cut = judges.ask(JUDGE, [], {}, None)
    assert cut.flag == "model_grader_parse_error" and "max_tokens" in cut.details
    assert cut.usage["total_tokens"] == 16  # the tokens were spent all the same
    reply(monkeypatch, status=500)
    down = judges.ask(JUDGE, [], {}, None)
    assert down.flag == "model_grader_server_error" and "500" in down.details


def test_details_go_beside_the_flag_they_tell_of():
    assert set(GradeResult().openai_errors()) == set(ERROR_FLAGS) | {
        "python_grader_runtime_error_details", "model_grader_server_error_details",
        "python_grader_server_error_type"}
    judge = GradeResult().fail("model_grader_server_error", "judge j answered 500")
    out = judge.openai_errors()
    assert out["model_grader_server_error_details"] == "judge j answered 500"
    assert out["python_grader_runtime_error_details"] is None
    sandbox = GradeResult(server_error_type="sandbox_unavailable").fail(
        "python_grader_server_error", "sandbox could not start")
    assert sandbox.openai_errors()["python_grader_server_error_type"] == "sandbox_unavailable"
    multi = GradeResult()
    multi.absorb(judge)
    multi.add_usage("m", {"total_tokens": 3})
    multi.add_usage("m", {"total_tokens": 4})
    assert multi.errors["model_grader_server_error"] and multi.token_usage() == 7
