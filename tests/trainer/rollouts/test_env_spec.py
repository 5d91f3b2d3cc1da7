"""`task.env` in the job spec (trainer/spec_task.py), the environments' registry
(trainer/rollouts/environments/__init__.py) and a multi-turn sample as it is stored
(trainer/samples.py): each refusal names its field, the stored spec re-validates, and a hostile
tools source is refused at submission without being run."""
import json
import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError

from trainer.rollouts import Rollouts
from trainer.rollouts.environments import MODULES, build_environment, check_environment, environment_task
from trainer.samples import step_samples
from trainer.spec import JobSpec, spec_errors

RG = {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, "max_digits": 2}}
ADD = '''def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b
'''


def make(env, **task):
    return JobSpec.model_validate({"name": "t", "task": {**task, "env": env}})


def errors(env, **task):
    with pytest.raises(ValidationError) as exc:
        make(env, **task)
    return {e["field"]: e["message"] for e in spec_errors(exc.value)}


def test_tools_env_defaults_and_roundtrip():
    s = make({"type": "tools", "tools": ADD}, reasoning_gym=RG)
    env = s.task.env
    assert (env.max_turns, env.max_total_tokens, env.tool_timeout_s, env.code_interpreter, env.reward) == (4, None, 10.0, False, None)
    assert env.reward_mode == "grader"
    again = JobSpec.model_validate(json.loads(s.model_dump_json()))
    assert again == s
    assert make(None, reasoning_gym=RG).task.env is None


def test_verifiers_and_openenv_bring_their_own_examples():
    s = make({"type": "verifiers", "name": "vf-calc", "args": {"num_examples": 10}})
    assert s.task.reasoning_gym is None and s.task.dataset is None and s.task.env.reward_mode == "env"
    assert make({"type": "openenv", "name": "wordle"}).task.env.reward_mode == "env"
    assert make({"type": "verifiers", "name": "vf-calc", "reward": "grader"}).task.env.reward == "grader"


@pytest.mark.parametrize("env,task,field,says", [
    ({"type": "tools", "tools": ADD}, {}, "task", "exactly one of reasoning_gym or dataset"),
    ({"type": "verifiers"}, {}, "task.env.name", "BRORL_ENVIRONMENTS"),
    ({"type": "openenv"}, {}, "task.env.name", "BRORL_OPENENV_SERVERS"),
    ({"type": "tools"}, {"reasoning_gym": RG}, "task.env.tools", "code_interpreter"),
    ({"type": "tools", "tools": ADD, "name": "x"}, {"reasoning_gym": RG}, "task.env.name", "not used by type tools"),
    ({"type": "verifiers", "name": "v", "tools": ADD}, {}, "task.env.tools", "for type tools"),
    ({"type": "openenv", "name": "w", "code_interpreter": True}, {}, "task.env.code_interpreter", "for type tools"),
    ({"type": "tools", "tools": ADD, "max_turns": 0}, {"reasoning_gym": RG}, "task.env.max_turns", ""),
    ({"type": "tools", "tools": ADD, "max_turns": 65}, {"reasoning_gym": RG}, "task.env.max_turns", ""),
    ({"type": "tools", "tools": ADD, "max_total_tokens": 0}, {"reasoning_gym": RG}, "task.env.max_total_tokens", ""),
    ({"type": "tools", "tools": ADD, "tool_timeout_s": 0}, {"reasoning_gym": RG}, "task.env.tool_timeout_s", ""),
    ({"type": "tools", "tools": ADD, "reward": "best"}, {"reasoning_gym": RG}, "task.env.reward", ""),
    ({"type": "shell", "tools": ADD}, {"reasoning_gym": RG}, "task.env.type", ""),
    ({"type": "tools", "tools": ADD, "url": "http://169.254.169.254/"}, {"reasoning_gym": RG}, "task.env.url", ""),
    ({"type": "verifiers", "name": "v", "args": {"x": "y" * 20_000}}, {}, "task.env.args", "bytes as JSON"),
    ({"type": "tools", "tools": "import os\nos.system('rm -rf /')"}, {"reasoning_gym": RG}, "task.env.tools", ""),
    ({"type": "tools", "tools": "def f(:"}, {"reasoning_gym": RG}, "task.env.tools", ""),
    ({"type": "tools", "tools": "x" * 100_001}, {"reasoning_gym": RG}, "task.env.tools", ""),
    ({"type": "verifiers", "name": "v"}, {"reasoning_gym": RG, "dataset": {"id": "ds_1"}}, "task", "at most one"),
    ({"type": "verifiers", "name": "v", "reward": "env"}, {"grader": {"type": "string_check", "name": "g",
      "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "eq"}}, "task.grader", "not used"),
    ({"type": "openenv", "name": "w", "reward": "grader"}, {}, "task.env.reward", "needs task.grader"),
])
def test_refusals_name_the_field(env, task, field, says):
    got = errors(env, **task)
    assert field in got, got
    assert says in got[field]


def test_a_tools_source_is_parsed_not_run(tmp_path):
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').write('x')\n" + ADD
    try:
        make({"type": "tools", "tools": source}, reasoning_gym=RG)
    except ValidationError:
        pass  # refused or not: never run
    assert not marker.exists()


def test_the_spec_and_its_env_check_import_no_torch():
    code = ("import sys\nfrom trainer.spec import JobSpec\n"
            f"JobSpec.model_validate({{'name': 't', 'task': {{'reasoning_gym': {RG!r}, 'env': {{'type': 'tools', 'tools': {ADD!r}}}}}}})\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_dispatches_lazily_and_refuses_unknown_types():
    assert set(MODULES) == {"tools", "verifiers", "openenv"}
    bad = type("Spec", (), {"type": "shell"})()
    for fn in (lambda: build_environment(bad), lambda: environment_task(bad, None, 0), lambda: check_environment(bad)):
        with pytest.raises(ValueError, match="task.env.type"):
            fn()
    tools = make({"type": "tools", "tools": ADD}, reasoning_gym=RG).task.env
    with pytest.raises(ValueError, match="brings no examples"):
        environment_task(tools, None, 0)
    check_environment(tools)  # parses


def test_a_stored_multiturn_sample_carries_its_transcript():
    episode = {"messages": [{"role": "user", "content": "2+3?"},
                            {"role": "assistant", "content": "x" * 50,
                             "tool_calls": [{"id": "call_0_0", "type": "function",
                                             "function": {"name": "add", "arguments": {"a": 2, "b": "3" * 40}}}]},
                            {"role": "tool", "content": "5", "tool_call_id": "call_0_0", "name": "add"}],
               "turns": 2, "tool_calls": 1, "tool_errors": 0, "info": {"error": "step (turn 2): RuntimeError: down"}}
    r = Rollouts(prompt_ids=[[1]], response_ids=[[2, 3]], engine_logprobs=[[0.0, 0.0]], group=torch.tensor([0]),
                 rewards=torch.tensor([0.0]), truncated=torch.tensor([False]), correct=torch.tensor([False]),
                 loss_mask=[[1, 0]], episodes=[episode])

    class Tok:
        def decode(self, ids, skip_special_tokens):
            return " ".join(map(str, ids))

    row = step_samples(r, torch.zeros(1), Tok(), 1, max_chars=20)[0]
    assert row["turns"] == 2 and row["tool_calls"] == 1 and row["tool_errors"] == 0
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool"]
    assert row["messages"][1]["content"] == "x" * 20
    call = row["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] == "add" and len(call["function"]["arguments"]) == 20
    assert row["messages"][2]["tool_call_id"] == "call_0_0" and row["env_error"].startswith("step (turn 2)")
    single = Rollouts(prompt_ids=[[1]], response_ids=[[2]], engine_logprobs=[[0.0]], group=torch.tensor([0]),
                      rewards=torch.tensor([0.0]), truncated=torch.tensor([False]), correct=torch.tensor([False]))
    assert "messages" not in step_samples(single, torch.zeros(1), Tok(), 1, max_chars=20)[0]
