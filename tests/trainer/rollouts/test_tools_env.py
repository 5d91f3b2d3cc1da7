"""The built-in tools environment's own room: schemas from the tenant's source (read with
`ast`, never run), the submission check, argument checking, the opening messages, and the
malformed calls that are answered without a sandbox trip. The calls that do run are tested
against the real sandbox in tests/sandbox/test_tools_sandbox.py."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.scripted_engine import ScriptedEngine
from tests.support.services import require_service
from trainer.rollouts.environments import tool_schema
from trainer.rollouts.environments.base import AssistantTurn, ToolCall
from trainer.rollouts.environments.tool_schema import (
    ToolSourceError, schemas, validate_arguments)
from trainer.rollouts.environments.tools_env import check
from trainer.tasks.base import Example

SOURCE = '''
import math
from typing import Literal, Optional

UNITS = {"m": 1.0}

def convert(value: float, unit: Literal["m", "km"] = "m", *, exact: bool = False) -> str:
    """Convert a length to metres.

    Longer text that is not the description.

    Args:
        value: the length to convert
        unit: its unit, metres or kilometres;
            kilometres are multiplied by 1000
        exact: keep every digit

    Returns:
        the length in metres
    """
    return str(value)

def lookup(keys: list[str], table: dict[str, int], limit: Optional[int] = None) -> dict:
    """Look keys up.

    :param keys: which keys
    :param table: where
    """

def pair(p: "tuple[int, str]", anything) -> None:
    pass

def _helper(x):
    return x
'''


def _fn(tools, name):
    return next(t["function"] for t in tools if t["function"]["name"] == name)


def test_schemas_from_signature_hints_and_docstring():
    source = SOURCE.replace(", anything", ", anything: 'Any'")
    tools = schemas(source)
    assert [t["function"]["name"] for t in tools] == ["convert", "lookup", "pair"]
    convert = _fn(tools, "convert")
    assert convert["description"] == "Convert a length to metres."
    params = convert["parameters"]
    assert params["required"] == ["value"] and params["additionalProperties"] is False
    assert params["properties"]["value"] == {"type": "number", "description": "the length to convert"}
    assert params["properties"]["unit"] == {
        "enum": ["m", "km"], "default": "m",
        "description": "its unit, metres or kilometres; kilometres are multiplied by 1000"}
    assert params["properties"]["exact"]["type"] == "boolean"
    assert params["properties"]["exact"]["default"] is False
    lookup = _fn(tools, "lookup")["parameters"]
    assert lookup["properties"]["keys"] == {"type": "array", "items": {"type": "string"},
                                            "description": "which keys"}
    assert lookup["properties"]["table"]["additionalProperties"] == {"type": "integer"}
    assert lookup["properties"]["limit"]["type"] == ["integer", "null"]
    assert lookup["required"] == ["keys", "table"]
    pair = _fn(tools, "pair")["parameters"]["properties"]
    assert pair["p"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    assert pair["anything"] == {}


def test_code_interpreter_adds_the_python_tool():
    tools = schemas(None, code_interpreter=True)
    assert [t["function"]["name"] for t in tools] == ["python"]
    assert tools[0]["function"]["parameters"]["required"] == ["code"]


@pytest.mark.parametrize("source, needle", [
    ("def f(x: int:\n  pass", "does not compile (line 1)"),
    ("X = 1\ndef _private(y: int):\n    pass\n", "no tools"),
    ("def f(x):\n    pass\n", "parameter 'x' of tool f() has no type hint"),
    ("class Point: pass\ndef f(p: Point):\n    pass\n", "unsupported type 'Point'"),
    ("def f(*values: int):\n    pass\n", "takes *values"),
    ("def f(**kw: int):\n    pass\n", "takes **kw"),
    ("def f(x: dict[int, str]):\n    pass\n", "keys must be str"),
    ("def f(x: int = len('a')):\n    pass\n", "default must be a literal"),
    ("async def f(x: int):\n    pass\n", "async"),
    ("def f(x: int):\n    pass\ndef f(y: int):\n    pass\n", "defined twice"),
])
def test_check_names_the_problem(source, needle):
    with pytest.raises(ToolSourceError) as info:
        check({"tools": source})
    assert needle in str(info.value)


def test_check_never_runs_the_source(tmp_path):
    marker = tmp_path / "ran"
    source = (f"open({str(marker)!r}, 'w').write('x')\n"
              "def f(x: int) -> int:\n    return x\n")
    assert [t["function"]["name"] for t in check({"tools": source})] == ["f"]
    assert not marker.exists()


def test_check_python_clash_size_and_env_reward():
    with pytest.raises(ToolSourceError, match="clashes"):
        check({"tools": "def python(code: str):\n    pass\n", "code_interpreter": True})
    with pytest.raises(ToolSourceError, match="bytes; at most"):
        check({"tools": "#" * (tool_schema.MAX_SOURCE_BYTES + 1)})
    with pytest.raises(ToolSourceError, match="_reward"):
        check({"tools": "def f(x: int):\n    pass\n", "reward": "env"})
    check({"tools": "def f(x: int):\n    pass\ndef _reward(messages):\n    return 1\n",
           "reward": "sum"})
    with pytest.raises(ToolSourceError, match="tool_timeout_s"):
        check({"tools": "def f(x: int):\n    pass\n", "tool_timeout_s": 0})


@pytest.mark.parametrize("arguments, needle", [
    ([1, 2], "must be a JSON object"),
    ({"value": 1, "bogus": 2}, "no parameter 'bogus'"),
    ({}, "missing the required argument 'value'"),
    ({"value": "3"}, "value must be number, not string"),
    ({"value": True}, "value must be number, not boolean"),
    ({"value": 1, "unit": "mile"}, "unit must be one of"),
])
def test_bad_arguments_are_named(arguments, needle):
    schema = next(t for t in schemas(SOURCE.replace(", anything", ""))
                  if t["function"]["name"] == "convert")
    why = validate_arguments(schema, arguments)
    assert why is not None and needle in why, why


def test_good_arguments_pass():
    tools = schemas(SOURCE.replace(", anything", ""))
    convert, lookup = tools[0], tools[1]
    assert validate_arguments(convert, {"value": 3}) is None  # an int is a number
    assert validate_arguments(convert, {"value": 3.5, "unit": "km", "exact": True}) is None
    assert validate_arguments(lookup, {"keys": ["a"], "table": {"a": 1}, "limit": None}) is None
    assert "keys[1]" in validate_arguments(lookup, {"keys": ["a", 2], "table": {}})
    assert "table['a']" in validate_arguments(lookup, {"keys": [], "table": {"a": "x"}})


@pytest.fixture
def env():
    from trainer.graders.sandbox.layer import SandboxUnavailable
    from trainer.rollouts.environments.tools_env import build

    tag = "brorl-tools-unit-" + uuid.uuid4().hex
    try:
        environment = build({"tools": "def add(a: int, b: int) -> int:\n    return a + b\n"},
                            tag=tag)
    except SandboxUnavailable as exc:
        require_service("a tool sandbox", str(exc))  # skipped here, failed in CI
    yield environment
    environment.close()


def test_opening_messages(env):
    plain = asyncio.run(env.episode(Example("What is 2+3?", "5"), 0).start())
    assert plain == [{"role": "user",
                      "content": "What is 2+3?\nAnswer in <answer></answer>."}]
    env.template = "Use the tools. {question}"
    assert asyncio.run(env.episode(Example("Q", "5"), 0).start())[0]["content"] == "Use the tools. Q"
    rows = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    opened = asyncio.run(env.episode(Example("Hi", "x", {"messages": rows}), 0).start())
    assert opened == [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hi"}]


def test_malformed_calls_are_answered_without_a_sandbox(env):
    episode = env.episode(Example("q", "a"), 0)

    async def turns():
        bad_json = await episode.step(AssistantTurn("<tool_call>{oops", parse_error="not JSON"))
        unknown = await episode.step(AssistantTurn("", [ToolCall("c1", "mul", {"a": 1})]))
        wrong = await episode.step(AssistantTurn("", [ToolCall("c2", "add", {"a": "1", "b": 2}),
                                                      ToolCall("c3", "add", "1, 2")]))
        answered = await episode.step(AssistantTurn("<answer>3</answer>"))
        return bad_json, unknown, wrong, answered

    bad_json, unknown, wrong, answered = asyncio.run(turns())
    assert not bad_json.done and bad_json.tool_errors == 1
    assert bad_json.messages[0]["role"] == "tool"
    assert bad_json.messages[0]["content"].startswith("error: could not read the tool call")
    assert unknown.messages[0]["content"] == "error: no tool named 'mul'; the tools are add"
    assert unknown.messages[0]["tool_call_id"] == "c1" and unknown.messages[0]["name"] == "mul"
    assert [m["content"] for m in wrong.messages] == [
        "error: bad argument for add: a must be integer, not string",
        "error: the arguments of add must be a JSON object, not string"]
    assert (wrong.tool_calls, wrong.tool_errors) == (2, 2)
    assert answered.done and answered.messages == [] and answered.tool_calls == 0
    assert (episode.tool_calls, episode.tool_errors) == (4, 4)
    assert env.pool._all == [], "a malformed call started a sandbox"
    assert asyncio.run(episode.finish([])) is None


class _Scorer:
    def score(self, texts, examples, truncated):
        from types import SimpleNamespace

        correct = [f"<answer>{ex.answer}</answer>" in t for t, ex in zip(texts, examples)]
        return SimpleNamespace(rewards=[float(c) for c in correct], correct=correct,
                               scores=[float(c) for c in correct])


def test_run_episodes_with_the_real_sandbox():
    """The multi-turn driver over this environment (a scripted model, a Qwen3-like template,
    the real sandbox): the tool answers reach the model's context, each trajectory keeps its
    own interpreter state, a bad call is an error the episode survives, the answer is scored,
    and nothing of the environment is left running after close()."""
    import re

    from tests.support.chat_tokenizers import chat_tokenizer
    from trainer.graders.sandbox.layer import SandboxUnavailable
    from trainer.graders.sandbox.process import processes_with
    from trainer.rollouts import SamplingConfig
    from trainer.rollouts.environments.tools_env import build
    from trainer.rollouts.multiturn import run_episodes

    def call(name, **arguments):
        import json
        return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'

    def script(ctx, j):
        turn = ctx.count("<|im_start|>assistant") - 1
        a, b = map(int, re.findall(r"(\d+)\+(\d+)", ctx)[0])
        if turn == 0:  # the one turn sampled n = N at once: j tells the trajectories apart
            return call("add", a=a, b=b) + call("python", code=f"x = {j}")
        if turn == 1:
            return call("add", a="oops", b=1)
        if turn == 2:
            return call("python", code="print(x)")
        answers = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", ctx, re.S)
        return f"x was {answers[-1].strip()} <answer>{answers[0]}</answer>"

    tok = chat_tokenizer()
    tag = "brorl-tools-driver-" + uuid.uuid4().hex
    try:
        env = build({"tools": "def add(a: int, b: int) -> int:\n    '''Add.'''\n    return a + b\n",
                     "code_interpreter": True, "tool_timeout_s": 5}, tag=tag)
    except SandboxUnavailable as exc:
        require_service("a tool sandbox", str(exc))  # skipped here, failed in CI
    examples = [Example("What is 40+2?", "42"), Example("What is 7+5?", "12")]
    try:
        eps = run_episodes(ScriptedEngine(tok, script), tok, env, _Scorer(), examples,
                           SamplingConfig(n=2, max_new_tokens=200), max_turns=6,
                           max_total_tokens=4000, reward_mode="grader")
    finally:
        env.close()
    assert processes_with(tag) == []
    assert eps.env_errors == 0, eps.infos
    assert eps.rewards == [1.0] * 4
    assert eps.turns == [4] * 4 and eps.tool_calls == [4] * 4 and eps.tool_errors == [1] * 4
    assert [t.split(" <")[0] for t in eps.texts] == ["x was 0", "x was 1"] * 2
    msgs = eps.messages[1]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant", "tool",
                                         "assistant", "tool", "assistant"]
    assert msgs[2]["content"] == "42" and msgs[2]["name"] == "add"
    assert msgs[2]["tool_call_id"] == msgs[1]["tool_calls"][0]["id"]
    assert msgs[5]["content"] == "error: bad argument for add: a must be integer, not string"
    assert msgs[7]["content"] == "1\n"
