"""The rollout seam (`trainer.rollouts.generate_and_score`): one engine call, the engine's own
token ids kept, samples lined up with their prompts' examples, the grader's detail, the stop
check between generating and scoring; and, on builtin:tiny with the HF engine, the same
samples a direct engine call draws."""
import time
from types import SimpleNamespace

import pytest
import torch

from trainer.rollouts import Episodes, Generation, SamplingConfig, encode_prompts, generate_and_score
from trainer.stop import StopRequested

SAMPLING = SamplingConfig(n=3, max_new_tokens=4, seed=11)


class FakeEngine:
    """Sample j of prompt p: tokens [p's first id, j]; the last sample of each prompt is cut."""

    def __init__(self, seconds=0.0):
        self.calls, self.seconds = [], seconds

    def generate(self, prompts, sampling):
        self.calls.append((prompts, sampling))
        time.sleep(self.seconds)
        n = sampling.n
        return Generation(prompt_index=[p for p in range(len(prompts)) for _ in range(n)],
                          token_ids=[[prompt[0], j] for prompt in prompts for j in range(n)],
                          logprobs=[[-0.5, -0.25 * j] for _ in prompts for j in range(n)],
                          finished=[j < n - 1 for _ in prompts for j in range(n)])


class Tokenizer:
    def batch_decode(self, ids, skip_special_tokens):
        assert skip_special_tokens
        return [" ".join(map(str, t)) for t in ids]


class FakeScorer:
    """Correct when the sample's second token equals the example's answer; a grader's detail
    (`last_results`, `sub_reward_keys`) when `grader` is set."""

    def __init__(self, grader=False, seconds=0.0):
        self.seen = []
        self.sub_reward_keys = ["fmt", "math"]
        self.grader, self.seconds = grader, seconds

    def score(self, texts, examples, truncated):
        self.seen.append((texts, examples, truncated))
        time.sleep(self.seconds)
        correct = [not cut and int(t.split()[1]) == ex.answer for t, ex, cut in zip(texts, examples, truncated)]
        if self.grader:
            self.last_results = [None if cut else SimpleNamespace(sub_rewards={"fmt": 1.0, "math": float(ok)})
                                 for ok, cut in zip(correct, truncated)]
        return SimpleNamespace(correct=correct, rewards=[2.0 * c for c in correct],
                               scores=[0.5 + c / 2 for c in correct], timeouts=1)


def _examples(*answers):
    return [SimpleNamespace(answer=a) for a in answers]


def test_samples_line_up_with_their_prompts_and_keep_the_engines_ids():
    engine, scorer = FakeEngine(seconds=0.05), FakeScorer(seconds=0.3)
    prompts = [[7, 1], [9, 1]]
    ep = generate_and_score(engine, Tokenizer(), scorer, prompts, _examples(1, 0), SAMPLING)
    assert len(engine.calls) == 1 and engine.calls[0] == (prompts, SAMPLING)  # one call for all prompts
    assert ep.prompt_index == [0, 0, 0, 1, 1, 1]
    assert ep.prompt_ids == [prompts[0]] * 3 + [prompts[1]] * 3
    assert ep.completion_ids == [[7, 0], [7, 1], [7, 2], [9, 0], [9, 1], [9, 2]]
    assert ep.texts == ["7 0", "7 1", "7 2", "9 0", "9 1", "9 2"]
    assert ep.truncated == [False, False, True] * 2
    texts, examples, truncated = scorer.seen[0]
    assert [e.answer for e in examples] == [1, 1, 1, 0, 0, 0] and truncated == ep.truncated
    assert ep.correct == [False, True, False, True, False, False]
    assert ep.rewards == [0.0, 2.0, 0.0, 2.0, 0.0, 0.0] and ep.scores == [0.5, 1.0, 0.5, 1.0, 0.5, 0.5]
    assert ep.timeouts == 1 and ep.grades == [] and ep.sub_rewards == {}
    assert ep.loss_mask is None  # single turn: every completion token is the model's
    assert ep.lengths() == [2] * 6 and ep.correct_counts(2) == [1, 1]
    assert 0.05 <= ep.gen_s < 0.3 <= ep.score_s  # the engine's time and the scorer's, apart


def test_to_rollouts_is_the_training_batch():
    ep = generate_and_score(FakeEngine(), Tokenizer(), FakeScorer(grader=True), [[7], [9]], _examples(1, 0),
                            SAMPLING)
    assert len(ep.grades) == 6 and ep.grades[2] is None
    assert ep.sub_rewards == {"fmt": [1.0, 1.0, 0.0, 1.0, 1.0, 0.0], "math": [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]}
    r = ep.to_rollouts()
    assert r.group.tolist() == [0, 0, 0, 1, 1, 1] and r.group.dtype == torch.long
    assert r.response_ids is ep.completion_ids and r.engine_logprobs is ep.logprobs
    assert r.prompt_ids[0] is r.prompt_ids[2]  # one list per group, as the shared-prompt update expects
    assert r.rewards.tolist() == ep.rewards and r.rewards.dtype == torch.float32
    assert r.correct.tolist() == ep.correct and r.truncated.tolist() == ep.truncated
    assert list(r.extras) == ["reward/fmt", "reward/math"]
    assert r.extras["reward/math"].tolist() == ep.sub_rewards["math"]


def test_a_masked_batch_keeps_its_mask_for_the_update():
    ep = generate_and_score(FakeEngine(), Tokenizer(), FakeScorer(), [[7]], _examples(1), SAMPLING)
    ep.loss_mask = [[1, 0]] * len(ep)
    assert ep.to_rollouts().loss_mask == ep.loss_mask


def test_a_stop_between_generating_and_scoring_skips_the_scoring():
    scorer = FakeScorer()

    def stop():
        raise StopRequested

    with pytest.raises(StopRequested):
        generate_and_score(FakeEngine(), Tokenizer(), scorer, [[7]], _examples(1), SAMPLING, check=stop)
    assert scorer.seen == []


def test_prompts_and_examples_must_pair_up():
    with pytest.raises(ValueError, match="2 prompts but 1 examples"):
        generate_and_score(FakeEngine(), Tokenizer(), FakeScorer(), [[7], [9]], _examples(1), SAMPLING)


def test_encode_prompts_adds_special_tokens_only_without_a_chat_template():
    calls = []

    class Tok:
        chat_template = None

        def __call__(self, text, add_special_tokens):
            calls.append(add_special_tokens)
            return {"input_ids": [len(text)]}

    ex = SimpleNamespace(question="1+2", payload=None)
    plain = Tok()
    assert encode_prompts(plain, [ex], "Q: {question}") == [[len("Q: 1+2")]] and calls == [True]
    plain.chat_template = "{{ messages }}"
    encode_prompts(plain, [ex], "Q: {question}")
    assert calls == [True, False]


@pytest.mark.integration  # warm-starts builtin:tiny (shared with the loop tests): minutes on 2 cores
@pytest.mark.timeout(900)
def test_tiny_hf_engine_through_the_seam_draws_the_engines_samples():
    """The seam on a real engine, tokenizer and verifier: the ids are the ones a direct engine
    call draws at the same seed, the texts their decoding, the verdicts the scorer's own."""
    from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
    from trainer.evaluate import opened
    from trainer.spec import JobSpec

    spec = JobSpec.model_validate({"name": "seam", "seed": SHARED_SEED, "task": shared_task(),
                                   "rollout": {"engine": "hf", "max_new_tokens": 24,
                                               "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 1}]}})
    prebuild(spec)
    sampling = SamplingConfig(n=8, max_new_tokens=24, seed=5)
    with opened(spec, prompts=4, max_num_seqs=32) as ctx:
        ep = generate_and_score(ctx.engine, ctx.tokenizer, ctx.scorer, ctx.prompt_ids, ctx.examples, sampling)
        direct = ctx.engine.generate(ctx.prompt_ids, sampling)
        again = generate_and_score(ctx.engine, ctx.tokenizer, ctx.scorer, ctx.prompt_ids, ctx.examples, sampling)
        scored = ctx.scorer.score(ep.texts, [ctx.examples[p] for p in ep.prompt_index], ep.truncated)
    assert isinstance(ep, Episodes) and len(ep) == 32
    assert ep.completion_ids == direct.token_ids and ep.logprobs == direct.logprobs
    assert ep.truncated == [not f for f in direct.finished]
    assert ep.texts == ctx.tokenizer.batch_decode(direct.token_ids, skip_special_tokens=True)
    assert ep.correct == scored.correct and ep.rewards == scored.rewards
    assert again.completion_ids == ep.completion_ids and again.correct == ep.correct  # seeded
    assert 0 < sum(ep.correct) < 32, "the warm-started model should answer some, not all"
