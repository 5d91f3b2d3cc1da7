"""A training step of a multi-turn job (`trainer.step` with `task.env`): collect runs episodes
instead of single completions, the batch keeps its loss mask and transcripts through dynamic
sampling, the episode metrics are reported, and the update trains builtin:tiny's random model
on it (the plain format: the tiny tokenizer has no chat template). The environment is a small
one written here (a unit test of the step room); the real ones have their own tests."""
from types import SimpleNamespace

import torch

from tests.support.scripted_engine import ScriptedEngine
from tests.trainer.rollouts.test_multiturn import Env
from trainer.algo.advantages import ADVANTAGES
from trainer.algo.schedule import plan
from trainer.models.tiny import build_untrained
from trainer.optim.update import UpdateConfig
from trainer.prompt_stream import PromptStream
from trainer.rollouts.environments.base import EnvReply
from trainer.spec import JobSpec
from trainer.step import collect, env_metrics, train_on_batch

ADD = 'def add(a: int, b: int) -> int:\n    """Add.\n\n    Args:\n        a: x\n        b: y\n    """\n    return a + b\n'


def _run(script, reply, max_total=300):
    spec = JobSpec.model_validate({
        "name": "t", "task": {"dataset": {"id": "ds_x"},
                              "env": {"type": "tools", "tools": ADD, "max_turns": 3, "max_total_tokens": max_total}},
        "rollout": {"max_new_tokens": 100, "schedule": [{"n": 4, "prompts_per_step": 3, "steps": 5}]},
        "algo": {"max_refill_rounds": 1, "mini_batches": 1, "kl_coef": 0.0,
                 "is_truncation": None}})  # the scripted engine's log-probs are not the model's
    model, tok = build_untrained(seed=0)
    train = [SimpleNamespace(question=f"{i}+{i}", answer=str(2 * i), payload={}) for i in range(50)]

    class Scorer:
        def score(self, texts, examples, truncated):
            ok = [not t and x.strip() == ex.answer for x, ex, t in zip(texts, examples, truncated)]
            return SimpleNamespace(correct=ok, rewards=[float(c) for c in ok])

    run = SimpleNamespace(spec=spec, stream=PromptStream(range(len(train)), 0, 0), engine=ScriptedEngine(tok, script),
                          tokenizer=tok, task=SimpleNamespace(train=train), scorer=Scorer(), train_ids=None,
                          keep_rate_running=1.0, keep_rounds_seen=0, difficulty=None, env=Env(reply=reply),
                          stop_check=lambda: None, max_seq_len=4096, policy=model.train(),
                          optimizer=torch.optim.SGD(model.parameters(), lr=0.1), ref=None,
                          advantage_fn=ADVANTAGES[spec.algo.advantage], micro_batch_tokens=4096,
                          compute_dtype=torch.float32, update_cfg=UpdateConfig.from_spec(spec), nonfinite_in_row=0)
    return run, plan(spec)[0]


def test_a_multiturn_step_collects_episodes_and_trains_on_the_model_tokens():
    # Sample j of every prompt: j even calls the tool, then answers right; j odd answers wrong at once.
    def script(ctx, j):
        if "<tool_response>" not in ctx:
            return '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>' if j % 2 == 0 else "7"
        return str(2 * int(ctx.split("\n")[0].split("+")[0]))

    def reply(k, s, ep):
        called = ep.env.turns_seen[-1][2].tool_calls
        return EnvReply(messages=[{"role": "tool", "content": "2"}], tool_calls=1) if called else EnvReply(done=True)

    run, p = _run(script, reply)
    collected = collect(run, p, 0)
    batch = collected.batch
    assert collected.kept_groups == 3 and len(batch) == 12
    assert batch.loss_mask is not None and batch.episodes is not None and len(batch.episodes) == 12
    for k, (ids, mask, ep) in enumerate(zip(batch.response_ids, batch.loss_mask, batch.episodes)):
        assert len(ids) == len(mask) and mask[0] == 1
        assert (0 in mask, ep["turns"], ep["tool_calls"]) == ((True, 2, 1) if k % 2 == 0 else (False, 1, 0))
    assert batch.rewards.tolist() == [1.0, 0.0] * 6
    counts = collected.counts
    metrics = env_metrics(counts)
    assert metrics["env/turns_mean"] == 1.5 and metrics["env/tool_calls_mean"] == 0.5
    assert metrics["env/tool_errors_mean"] == 0 and metrics["env/budget_truncated_frac"] == 0 and metrics["env/errors"] == 0
    assert metrics["time/env_s"] >= 0
    before = [q.detach().clone() for q in run.policy.parameters()]
    stats = train_on_batch(run, batch, 0)
    assert stats["n_tokens"] == sum(sum(m) for m in batch.loss_mask) < sum(len(r) for r in batch.response_ids)
    assert any(not torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))
    # The stored samples read the transcripts of the first round.
    assert collected.first_round.episodes[0]["messages"][0]["role"] == "user"


def test_budget_truncation_is_counted():
    run, p = _run(lambda ctx, j: "x" * 30, lambda k, s, ep: EnvReply(messages=[{"role": "tool", "content": "more"}]),
                  max_total=50)
    collected = collect(run, p, 0)
    metrics = env_metrics(collected.counts)
    assert metrics["env/budget_truncated_frac"] == 1.0 and collected.counts.truncated == collected.counts.samples


def test_evaluation_runs_episodes_against_the_environment():
    from trainer.evaluate import EvalContext, evaluate

    def reply(k, s, ep):
        called = ep.env.turns_seen[-1][2].tool_calls
        return EnvReply(messages=[{"role": "tool", "content": "2"}], tool_calls=1) if called else EnvReply(done=True)

    def script(ctx, j):  # right only after the tool's answer
        return str(2 * int(ctx.split("\n")[0].split("+")[0])) if "<tool_response>" in ctx else \
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'

    run, _ = _run(script, reply)
    ctx = EvalContext(run.engine, run.tokenizer, run.scorer, run.task.train[:3], prompt_ids=None, env=run.env,
                      max_context=4096)
    spec = run.spec.model_copy(update={"eval": run.spec.eval.model_copy(update={"samples_per_prompt": 2, "k": [1, 2]})})
    out = evaluate(ctx, spec, seed=0)
    assert out["eval/pass@1"] == 1.0 and out["eval/response_len_mean"] > 0
    assert len(run.env.closed) == 6


def test_the_builtin_tools_environment_through_the_driver():
    """The real tools environment (its sandbox) under the driver: a good call, a call missing an
    argument, an unknown tool and a malformed call each answered in the transcript and counted;
    the episode ends when the model answers; the rendered trajectory reads as the plain format."""
    from trainer.rollouts import SamplingConfig, run_episodes
    from trainer.run import job_environment
    from tests.trainer.rollouts.test_multiturn import Scorer

    spec = JobSpec.model_validate({"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"},
                                                         "env": {"type": "tools", "tools": ADD, "max_turns": 5}}})
    _, tok = build_untrained(seed=0)
    calls = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
             '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>',
             '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "<tool_call>{bad", "<answer>5</answer>"]
    env = job_environment(spec)
    try:
        ep = run_episodes(ScriptedEngine(tok, lambda ctx, j: calls[ctx.count("<tool_response>")]), tok, env, Scorer(),
                          [SimpleNamespace(question="2+3?", answer="5", payload={})],
                          SamplingConfig(n=2, max_new_tokens=100), max_turns=5, max_total_tokens=2000,
                          reward_mode="grader")
    finally:
        env.close()
    assert ep.turns == [5, 5] and ep.tool_calls == [4, 4] and ep.tool_errors == [3, 3] and ep.rewards == [1.0, 1.0]
    tool_results = [m["content"] for m in ep.messages[0] if m["role"] == "tool"]
    assert tool_results[0] == "5" and "missing the required argument 'b'" in tool_results[1]
    assert "no tool named 'nope'" in tool_results[2] and "not valid JSON" in tool_results[3]
    text = tok.decode(ep.prompt_ids[0] + ep.completion_ids[0])
    assert text.startswith("tools: add(a, b)\n2+3?\n") and "<eos>\n<tool_response>5</tool_response>\n" in text
