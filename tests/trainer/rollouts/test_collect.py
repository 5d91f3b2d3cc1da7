"""`step.collect`: refill rounds oversample by the running keep rate, the batch is never
over-filled, and an under-filled or empty step is reported rather than hidden."""
from types import SimpleNamespace

import pytest

from trainer.prompt_stream import PromptStream
from trainer.loop import stall_reason
from trainer.rollouts import Generation
from trainer.algo.schedule import plan
from trainer.spec import JobSpec
from trainer.step import collect, prompts_to_ask


class FakeEngine:
    """n samples per prompt; token j of sample j, so the scorer can alternate right/wrong."""

    def __init__(self):
        self.asked = []

    def generate(self, prompts, sampling):
        self.asked.append(len(prompts))
        n = sampling.n
        return Generation(prompt_index=[p for p in range(len(prompts)) for _ in range(n)],
                          token_ids=[[j] for _ in prompts for j in range(n)],
                          logprobs=[[-1.0] for _ in prompts for _ in range(n)],
                          finished=[True] * (len(prompts) * n))


class FakeScorer:
    """Example e is informative (half its samples right) when e % 5 < keep; else all wrong."""

    def __init__(self, keep):
        self.keep = keep

    def score(self, texts, examples, truncated):
        correct = [e % 5 < self.keep and int(t) % 2 == 0 for t, e in zip(texts, examples)]
        return SimpleNamespace(correct=correct, rewards=[float(c) for c in correct])


def _run(keep, prompts=10, refills=3, max_oversample=4.0):
    spec = JobSpec.model_validate({
        "name": "t", "task": {"dataset": {"id": "ds_x"}},
        "rollout": {"schedule": [{"n": 4, "prompts_per_step": prompts, "steps": 5}]},
        "algo": {"max_refill_rounds": refills, "max_oversample": max_oversample}})
    train = list(range(10_000))
    tok = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [str(i[0]) for i in ids])
    run = SimpleNamespace(spec=spec, stream=PromptStream(range(len(train)), 0, 0),
                          engine=FakeEngine(), tokenizer=tok, task=SimpleNamespace(train=train),
                          scorer=FakeScorer(keep), train_ids=[[1, 2]] * len(train),
                          keep_rate_running=1.0, keep_rounds_seen=0, difficulty=None)
    return run, plan(spec)[0]


def test_refill_rounds_oversample_by_the_running_keep_rate():
    run, p = _run(keep=2)  # 40 % of groups informative, as the paper's 41 %
    first = collect(run, p, 0)
    assert first.rounds >= 1 and run.engine.asked[0] == 10
    run.engine.asked.clear()
    later = [collect(run, p, s) for s in range(1, 4)]
    for acc in later:
        assert acc.kept_groups == 10  # filled, never over-filled
        assert int(acc.batch.group.max()) + 1 == 10 and len(acc.batch) == 40
    # Once the keep rate is known the first round already asks ~10 / 0.4 prompts.
    assert run.engine.asked[0] >= 20
    assert 0.2 < run.keep_rate_running < 0.6


def test_deficit_only_under_fills_where_oversampling_fills():
    # The measurement: asking only for the deficit leaves the batch short.
    short, _ = _run(keep=2, prompts=20, refills=1, max_oversample=1.0)
    full, p = _run(keep=2, prompts=20, refills=1)
    shortfalls = []
    for run in (short, full):
        accs = [collect(run, p, s) for s in range(4)]
        shortfalls.append(sum(p.prompts_per_step - a.kept_groups for a in accs[1:]))
    assert shortfalls[0] > 10 and shortfalls[1] <= shortfalls[0] // 5, shortfalls


def test_zero_kept_groups_gives_no_batch_and_a_stall_reason():
    run, p = _run(keep=0, refills=2)
    acc = collect(run, p, 0)
    assert acc.batch is None and acc.kept_groups == 0 and acc.rounds == 2
    assert acc.counts.all_wrong == acc.counts.groups > 0
    reason = stall_reason(run.spec, {"kept_groups": 0, "truncated_frac": 0.0})
    assert "dynamic sampling kept nothing" in reason
    assert "max_new_tokens" in stall_reason(run.spec, {"kept_groups": 0, "truncated_frac": 1.0})
    assert stall_reason(run.spec, {"kept_groups": 3, "truncated_frac": 0.5}) is None


@pytest.mark.parametrize("deficit,rate,cap,want", [(10, 1.0, 4, 10), (10, 0.4, 4, 25), (10, 0.01, 4, 40),
                                                  (3, 0.5, 1, 3)])
def test_prompts_to_ask(deficit, rate, cap, want):
    assert prompts_to_ask(deficit, rate, cap) == want


def test_stall_warns_once_after_stall_steps_and_can_fail_the_job():
    from trainer.loop import StallError, _check_stall
    from trainer.sink import ListSink

    spec = JobSpec.model_validate({"name": "t", "task": {"dataset": {"id": "ds_x"}},
                                   "algo": {"stall_steps": 2}})
    run, sink = SimpleNamespace(spec=spec, stalled_steps=0), ListSink()
    stuck = {"kept_groups": 0, "truncated_frac": 1.0}
    for step in range(1, 5):
        _check_stall(run, sink, step, stuck)
    assert [t for t, _ in sink.events] == ["warning"]
    assert "raise rollout.max_new_tokens" in sink.events[0][1]["message"]
    _check_stall(run, sink, 5, {"kept_groups": 2, "truncated_frac": 0.0})
    assert run.stalled_steps == 0

    failing = SimpleNamespace(spec=spec.model_copy(update={"algo": spec.algo.model_copy(
        update={"fail_on_stall": True})}), stalled_steps=0)
    _check_stall(failing, sink, 1, stuck)
    with pytest.raises(StallError, match="fail_on_stall"):
        _check_stall(failing, sink, 2, stuck)


def test_builtin_tiny_needs_room_for_its_answer():
    from pydantic import ValidationError

    from trainer.spec import TINY_MIN_NEW_TOKENS, spec_errors

    base = {"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}}}
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({**base, "rollout": {"max_new_tokens": TINY_MIN_NEW_TOKENS - 1}})
    assert spec_errors(exc.value)[0]["field"] == "rollout.max_new_tokens"
    JobSpec.model_validate({**base, "rollout": {"max_new_tokens": TINY_MIN_NEW_TOKENS}})
    JobSpec.model_validate({**base, "model": {"path": "/models/x"}, "rollout": {"max_new_tokens": 4}})
