"""Tool calls read from a model turn (trainer/rollouts/tool_calls.py): the formats, every way a
call can be wrong (each named in `parse_error`), and hostile text that must never raise."""
import json

import pytest

from trainer.rollouts.tool_calls import MAX_CALL_CHARS, MAX_CALLS, call_format, parse_turn


def _call(name="add", **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_one_hermes_call():
    text = "Let me add them.\n" + _call(a=1, b=2)
    turn = parse_turn(text, turn=3)
    assert turn.text == text and turn.parse_error is None
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("call_3_0", "add", {"a": 1, "b": 2})]
    assert turn.message()["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1, "b": 2}}


def test_no_call_is_a_plain_answer():
    turn = parse_turn("The answer is <answer>4</answer>.", truncated=True)
    assert turn.tool_calls == [] and turn.parse_error is None and turn.truncated


def test_several_calls_and_arguments_as_a_json_string():
    text = _call(a=1) + "\n" + '<tool_call>{"name": "mul", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>' \
        + '<tool_call>{"name": "noop"}</tool_call>' + '<tool_call>{"name": "p", "parameters": {"q": 1}}</tool_call>'
    turn = parse_turn(text)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        ("add", {"a": 1}), ("mul", {"x": [1, 2]}), ("noop", {}), ("p", {"q": 1})]
    assert [c.id for c in turn.tool_calls] == ["call_0_0", "call_0_1", "call_0_2", "call_0_3"]
    assert turn.parse_error is None


def test_openai_function_shape():
    turn = parse_turn('<tool_call>{"type": "function", "function": {"name": "f", "arguments": "{}"}}</tool_call>')
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("f", {})]


@pytest.mark.parametrize("body,says", [
    ('{"name": "add", "arguments": {"a": 1,}}', "not valid JSON"),
    ('{"arguments": {"a": 1}}', 'no "name"'),
    ('{"name": 7}', '"name" must be a non-empty string, got a number'),
    ('{"name": ""}', '"name" must be a non-empty string'),
    ('{"name": "rm -rf /"}', "is not a tool name"),
    ('[1, 2]', "expected a JSON object with name and arguments, got a list"),
    ('"add"', "got a string"),
    ('null', "got null"),
    ('{"name": "add", "arguments": [1]}', '"arguments" of add must be a JSON object, got a list'),
    ('{"name": "add", "arguments": "{oops"}', '"arguments" of add is a string that is not valid JSON'),
    ('{"name": "add", "arguments": "3"}', "must be a JSON object, got a number"),
    ('', "empty <tool_call> block"),
])
def test_malformed_calls_are_named(body, says):
    turn = parse_turn(f"I will call it. <tool_call>{body}</tool_call>")
    assert turn.tool_calls == []
    assert turn.parse_error is not None and says in turn.parse_error, turn.parse_error


def test_good_calls_are_kept_beside_a_bad_one():
    turn = parse_turn(_call(a=1) + "<tool_call>{not json}</tool_call>" + _call("sub", a=2))
    assert [c.name for c in turn.tool_calls] == ["add", "sub"]
    assert turn.parse_error.startswith("tool call 2: not valid JSON")
    assert [c.id for c in turn.tool_calls] == ["call_0_0", "call_0_2"]


def test_an_unclosed_block_cut_by_the_budget():
    turn = parse_turn('<tool_call>{"name": "add", "argu', truncated=True)
    assert turn.tool_calls == [] and "not closed with </tool_call>" in turn.parse_error
    # Whole JSON with only the closing tag missing is still read.
    assert parse_turn('<tool_call>{"name": "add"}').tool_calls[0].name == "add"


def test_too_many_calls():
    turn = parse_turn("".join(_call(a=i) for i in range(MAX_CALLS + 5)))
    assert len(turn.tool_calls) == MAX_CALLS
    assert f"more than {MAX_CALLS} tool calls" in turn.parse_error


@pytest.mark.parametrize("text", [
    "<tool_call>" + "[" * 200_000 + "</tool_call>",                          # a nesting bomb
    '<tool_call>{"name": "f", "arguments": ' + '{"a": ' * 5000 + "1" + "}" * 5001 + "</tool_call>",
    "<tool_call>" + "x" * 5_000_000 + "</tool_call>",                       # huge
    '<tool_call>{"name": "f", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
    "<tool_call>" * 100_000,
    "\x00\ud800<tool_call>\x00{\"name\": \"\\ud800\"}</tool_call>",
    "<tool_call>1e999999</tool_call>",
    '<tool_call>{"name": "f", "arguments": {"n": NaN}}</tool_call>',
])
def test_hostile_text_never_raises(text):
    turn = parse_turn(text)
    assert turn.text == text
    assert turn.parse_error is None or len(turn.parse_error) < 2_000
    assert all(isinstance(c.arguments, dict) for c in turn.tool_calls)


def test_huge_call_is_refused_by_size_before_parsing():
    big = '{"name": "f", "arguments": {"s": "' + "a" * (MAX_CALL_CHARS + 10) + '"}}'
    turn = parse_turn(f"<tool_call>{big}</tool_call>")
    assert turn.tool_calls == [] and "characters of JSON" in turn.parse_error


def test_brackets_inside_a_string_argument_are_not_nesting():
    code = "x = " + "[" * 100 + "]" * 100
    turn = parse_turn(_call("python", code=code))
    assert turn.tool_calls[0].arguments == {"code": code}


def test_mistral_format():
    class Tok:
        chat_template = "{% if message.tool_calls %}[TOOL_CALLS]{% endif %}"

    assert call_format(Tok()) == "mistral" and call_format(object()) == "hermes"
    turn = parse_turn('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": 5}]', fmt="mistral")
    assert [c.name for c in turn.tool_calls] == ["add"] and "tool call 2" in turn.parse_error
    assert "not valid JSON" in parse_turn("[TOOL_CALLS][{", fmt="mistral").parse_error
    assert parse_turn("no calls", fmt="mistral").tool_calls == []
