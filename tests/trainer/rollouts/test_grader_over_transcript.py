"""`task.grader` over a multi-turn episode: a real grader (a tenant's python grader, run in the
grader sandbox) reads OpenAI's `sample` with the episode's tool calls in `output_tools`, the
transcript in `messages` and the final text in `output_text`."""
from __future__ import annotations

from tests.support.chat_tokenizers import chat_tokenizer
from tests.support.services import grader_sandbox_missing, needs_service
from tests.support.scripted_engine import ScriptedEngine
from tests.trainer.rollouts.test_multiturn import Env
from trainer.graders.scorer import GraderScorer
from trainer.rollouts import SamplingConfig
from trainer.rollouts.multiturn import run_episodes
from trainer.tasks.base import Example

GRADER = {"type": "python", "name": "used_the_tool", "source": """
def grade(sample, item):
    called = [c["function"]["name"] for c in sample["output_tools"]]
    args = [c["function"]["arguments"] for c in sample["output_tools"]]
    roles = [m["role"] for m in sample["messages"]]
    ok = called == ["add"] and args == [{"a": 2, "b": 3}] and roles[:3] == ["user", "assistant", "tool"]
    return 1.0 if ok and item["answer"] in sample["output_text"] else 0.0
"""}
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@needs_service("a grader sandbox", grader_sandbox_missing())
def test_a_python_grader_reads_the_episodes_tool_calls_and_transcript():
    tok = chat_tokenizer()
    # Sample 0 calls the tool, then answers; sample 1 answers the same without calling it.
    engine = ScriptedEngine(tok, lambda ctx, j: "<answer>5</answer>" if "r1" in ctx else (CALL if j == 0 else "5"))
    with GraderScorer(GRADER, reward="score", timeout_s=30.0) as scorer:
        ep = run_episodes(engine, tok, Env(), scorer, [Example("2 + 3 =", "5", {})],
                          SamplingConfig(n=2, max_new_tokens=200), max_turns=2, max_total_tokens=1000,
                          reward_mode="grader")
        results = scorer.last_results
    assert ep.rewards == [1.0, 0.0]
    assert [r.failed for r in results] == [False, False]
    assert ep.correct == [True, False]
