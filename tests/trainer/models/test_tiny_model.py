"""builtin:tiny: deterministic build, a folder transformers and vLLM load, a useful warm start."""
from __future__ import annotations

import hashlib

import pytest
import torch

from trainer.models import tiny as tiny_model
from trainer.models.tiny import VOCAB, build_tiny_model, encode, ensure_tiny_model
from tests.support.services import require_module

PAIRS = [(f"What is {a} + {b}?\n", f"<answer>{a + b}</answer>") for a in range(5) for b in range(5)]


def never(prompts, completions):
    return [False] * len(prompts)


def digest(folder) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def small_build(folder, seed):
    return build_tiny_model(folder, seed=seed, sft_pairs=PAIRS, score_fn=never,
                            holdout_prompts=[p for p, _ in PAIRS[:4]], max_sft_steps=3)


def test_build_is_deterministic_from_seed(tmp_path):
    a = small_build(tmp_path / "a", seed=7)
    b = small_build(tmp_path / "b", seed=7)
    c = small_build(tmp_path / "c", seed=8)
    assert digest(a) == digest(b) != digest(c)


def test_tokenizer_is_character_level(tmp_path):
    from transformers import AutoTokenizer

    folder = small_build(tmp_path / "m", seed=0)
    tok = AutoTokenizer.from_pretrained(folder)
    text = "State: 15 - 43 - 75 =\n<answer>-103</answer>"
    ids = tok(text)["input_ids"]
    assert ids == encode(text) and len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.eos_token_id == VOCAB["<eos>"] and tok.pad_token_id == VOCAB["<pad>"]
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text


def test_folder_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = small_build(tmp_path / "m", seed=1)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert GenerationConfig.from_pretrained(folder).eos_token_id == VOCAB["<eos>"]
    ids = torch.tensor([encode("What is 1 + 2?\n")])
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_ensure_caches_by_key(tmp_path, monkeypatch):
    first = ensure_tiny_model(tmp_path, "k1", seed=0, sft_pairs=PAIRS, score_fn=never,
                              holdout_prompts=[PAIRS[0][0]], max_sft_steps=2)
    monkeypatch.setattr(tiny_model, "build_tiny_model", lambda *a, **k: pytest.fail("rebuilt"))
    assert ensure_tiny_model(tmp_path, "k1") == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-k1"]  # no temp folder left


@pytest.mark.slow
def test_folder_loads_in_vllm(tmp_path):
    require_module("vllm")
    from transformers import AutoModelForCausalLM

    from trainer.engines.vllm_engine import VLLMEngine

    folder = small_build(tmp_path / "m", seed=2)
    model = AutoModelForCausalLM.from_pretrained(folder)
    engine = VLLMEngine(folder, dtype="float32", seed=0, max_model_len=256, max_num_seqs=8)
    try:
        assert engine.verify(model) < 1e-3
        text = "7 - 9 =\n<answer>-2</answer>"
        assert engine.llm.get_tokenizer()(text)["input_ids"] == encode(text)
    finally:
        engine.close()


# --------------------------------------------------------------------------- warm start
# The warm start on a real task is checked where users meet it: tests/trainer/test_learning.py
# builds the demo spec's model (band 5-60 %) and trains it. Here: the stopping rule itself.


def scripted(rates: list[float]):
    """A score_fn whose successive calls report the pass rates `rates` (10 prompts each)."""
    calls = iter(rates)

    def score(prompts, completions):
        k = round(next(calls) * len(prompts))
        return [i < k for i in range(len(prompts))]
    return score


def warm(model, score_fn, **kw):
    prompts = [p for p, _ in PAIRS[:10]]
    return tiny_model.warm_start(model, seed=0, sft_pairs=PAIRS, score_fn=score_fn,
                                 holdout_prompts=prompts, eval_every=1, batch_size=4, **kw)


def test_warm_start_stops_once_the_aim_is_reached():
    model, _ = tiny_model.build_untrained(0)
    report = warm(model, scripted([0.0, 0.1, 0.3, 0.5]), aim=0.25, max_steps=50)
    assert report["steps"] == 3 and report["pass_rate"] == pytest.approx(0.3)
    assert [h[2] for h in report["history"]] == pytest.approx([0.0, 0.1, 0.3])


def test_warm_start_overshoot_restores_the_last_in_band_weights():
    model, _ = tiny_model.build_untrained(0)
    snapshots = []
    calls = scripted([0.0, 0.2, 0.9])

    def score(prompts, completions):  # remember the weights each evaluation saw
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return calls(prompts, completions)

    report = warm(model, score, aim=0.8, max_steps=50)
    assert report["steps"] == 3 and report["pass_rate"] == pytest.approx(0.2)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in snapshots[1].items())
    assert not all(torch.equal(state[k], v) for k, v in snapshots[2].items())


def test_warm_start_step_cap_is_deterministic():
    a, _ = tiny_model.build_untrained(0)
    b, _ = tiny_model.build_untrained(0)
    ra, rb = warm(a, never, max_steps=5), warm(b, never, max_steps=5)
    assert ra["steps"] == rb["steps"] == 5
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_warm_start_reaches_the_stop_check():
    # A cancel during builtin:tiny's warm start (minutes of CPU) must not wait for its end.
    from trainer.stop import StopRequested, stop_check

    model, _ = tiny_model.build_untrained(0)
    polls: list[int] = []

    def should_stop() -> bool:
        polls.append(1)
        return len(polls) > 2

    with pytest.raises(StopRequested):
        warm(model, scripted([0.0] * 50), aim=0.99, max_steps=50, stop_check=stop_check(should_stop))
    assert len(polls) == 3  # stopped at the third SFT step, not after 50


def test_warm_start_reports_progress_at_each_evaluation_and_at_the_end():
    model, _ = tiny_model.build_untrained(0)
    calls: list[tuple[int, int, str]] = []
    report = warm(model, scripted([0.0, 0.1, 0.3]), aim=0.25, max_steps=50,
                  on_progress=lambda done, total, msg: calls.append((done, total, msg)))
    assert report["steps"] == 3
    assert calls[0][:2] == (0, 50) and calls[-1][:2] == (50, 50)  # stopped early: still complete
    evaluated = [c for c in calls if "pass@1" in c[2] and "done" not in c[2]]
    assert [c[0] for c in evaluated] == [1, 2, 3] and "0.30" in evaluated[-1][2]
    assert all(total == 50 for _, total, _ in calls)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_progress_between_evaluations_is_throttled(monkeypatch):
    # Between evaluations the SFT steps report only every PROGRESS_EVERY_S: here never.
    monkeypatch.setattr(tiny_model, "PROGRESS_EVERY_S", 3600.0)
    model, _ = tiny_model.build_untrained(0)
    calls: list[int] = []
    tiny_model.warm_start(model, seed=0, sft_pairs=PAIRS, score_fn=scripted([0.0]),
                          holdout_prompts=[p for p, _ in PAIRS[:10]], eval_every=4, batch_size=4,
                          max_steps=4, on_progress=lambda done, total, msg: calls.append(done))
    assert calls == [0, 4, 4]  # start, the one evaluation, the end


def test_warm_start_runs_on_one_thread_and_restores_the_count():
    # Two threads spin-waited on shared cores (10x slower steps); one also fixes the weights
    # whatever the machine's thread count.
    seen: list[int] = []

    def score(prompts, completions):
        seen.append(torch.get_num_threads())
        return [False] * len(prompts)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model, _ = tiny_model.build_untrained(0)
        warm(model, score, max_steps=2)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- no eval leak


def _warm_start_inputs(spec_task: dict, monkeypatch, tmp_path) -> tuple[dict, object]:
    """The keyword arguments `build_run` hands the tiny warm start for a spec with `spec_task`."""
    from trainer import run
    from trainer.spec import JobSpec
    from trainer.tasks import build_task
    from trainer.stop import never as no_stop

    spec = JobSpec.model_validate({"name": "holdout", "task": spec_task})
    task = build_task(spec.task, spec.seed, None)
    seen: dict = {}
    monkeypatch.setattr(tiny_model, "ensure_tiny_model", lambda cache, key, **kw: seen.update(kw) or tmp_path)
    monkeypatch.setenv("BRORL_CACHE_DIR", str(tmp_path))
    run._tiny_model_dir(spec, task, scorer=None, stop_check=no_stop)
    return seen, task


def test_warm_start_never_stops_on_eval_questions(monkeypatch, tmp_path):
    # The demo's closed space (200 questions, eval sampled from it too): the hold-out that stops
    # and selects the warm start must still hold no eval question.
    from trainer.tasks.prompts import render_prompt

    demo = {"reasoning_gym": {"name": "chain_sum", "train_size": 2000, "eval_size": 64,
                              "eval_disjoint": False,
                              "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}}
    seen, task = _warm_start_inputs(demo, monkeypatch, tmp_path)
    eval_prompts = {render_prompt(ex.question, None) for ex in task.eval}
    train_prompts = {render_prompt(ex.question, None) for ex in task.train}
    holdout = seen["holdout_prompts"]
    assert len(holdout) == len(set(holdout)) == 64
    assert not set(holdout) & eval_prompts and set(holdout) <= train_prompts


def test_warm_start_of_a_disjoint_task_sees_no_eval_question_at_all(monkeypatch, tmp_path):
    from trainer.tasks.prompts import render_prompt

    disjoint = {"reasoning_gym": {"name": "chain_sum", "train_size": 300, "eval_size": 50,
                                  "config": {"min_terms": 2, "max_terms": 2, "max_digits": 2}}}
    seen, task = _warm_start_inputs(disjoint, monkeypatch, tmp_path)
    eval_prompts = {render_prompt(ex.question, None) for ex in task.eval}
    used = set(seen["holdout_prompts"]) | {p for p, _ in seen["sft_pairs"]}
    assert len(used) > 64 and not used & eval_prompts


def test_warm_start_holdout_refuses_a_task_with_only_eval_questions():
    from trainer.run import warm_start_holdout
    from trainer.tasks.base import Example, Task, VerifierSpec

    same = [Example("1 + 1", "2")]
    task = Task(name="t", train=same, eval=same, verifier_spec=VerifierSpec.of("exact"))
    with pytest.raises(ValueError, match="every training question is also an eval question"):
        warm_start_holdout(task)


def test_cache_key_follows_the_task_and_seed_not_the_job_s_reward():
    """The warm start stops on the verifier's `correct`, whatever rewards the job: jobs that
    differ only in their reward share one cached model; another task or seed gets its own."""
    from trainer.run import tiny_model_key
    from trainer.spec import JobSpec

    def key(seed: int = 0, **task) -> str:
        return tiny_model_key(JobSpec.model_validate({"name": "k", "seed": seed, "task": {
            "reasoning_gym": {"name": "chain_sum", "train_size": 100, "eval_size": 8}, **task}}))

    grader = {"type": "string_check", "name": "tag", "input": "{{ sample.output_text }}",
              "reference": "</answer>", "operation": "like"}
    assert key() == key(reward="score") == key(grader=grader, reward="score", grader_error_steps=2)
    assert len({key(), key(seed=1), key(prompt_template="Q: {question}")}) == 3


# ------------------------------------------------------------------ shipped warm starts

def test_a_shipped_seed_is_copied_not_built(tmp_path, monkeypatch):
    seeds = tmp_path / "seeds"
    small_build(seeds / "tiny-k2", seed=3)
    monkeypatch.setattr(tiny_model, "SEEDS_DIR", seeds)
    monkeypatch.setattr(tiny_model, "build_tiny_model", lambda *a, **k: pytest.fail("built"))
    got = ensure_tiny_model(tmp_path / "cache", "k2")
    assert got == tmp_path / "cache" / "tiny-k2" and digest(got) == digest(seeds / "tiny-k2")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["tiny-k2"]
    assert tiny_model.shipped_seed("other") is None


def test_the_demo_spec_has_its_warm_start_shipped():
    """`make demo` on a fresh machine trains at once: examples/demo.yaml's builtin:tiny is
    shipped (trainer/models/seeds/), under the key the worker looks up."""
    from tests.trainer.test_learning import DEMO
    from trainer.run import tiny_model_key
    from trainer.spec import load_spec

    key = tiny_model_key(load_spec(DEMO))
    assert tiny_model.shipped_seed(key) is not None, (
        f"no shipped warm start for the demo's key {key}: `python -m trainer.tiny_seeds`")
    assert [p.name for p in tiny_model.SEEDS_DIR.iterdir()] == [f"tiny-{key}"]  # no stale copy


@pytest.mark.slow
def test_the_shipped_demo_seed_is_in_the_warm_starts_band():
    """What the worker would have built: sampled pass@1 on the warm start's own hold-out
    inside the band the warm start aims for (so RL has something to learn, and something
    to build on), as its build report says."""
    import json

    from transformers import AutoModelForCausalLM

    from tests.trainer.test_learning import DEMO
    from trainer.run import job_task, tiny_model_key, warm_start_holdout
    from trainer.spec import load_spec
    from trainer.tasks.prompts import render_example
    from trainer.tasks.scoring import Scorer

    spec = load_spec(DEMO)
    folder = tiny_model.shipped_seed(tiny_model_key(spec))
    report = json.loads((folder / "warm_start.json").read_text())
    assert 0.05 <= report["pass_rate"] <= 0.60, report
    task = job_task(spec)
    holdout = warm_start_holdout(task)
    prompts = [render_example(ex, spec.task.prompt_template) for ex in holdout]
    by_prompt = dict(zip(prompts, holdout))
    with Scorer(task) as scorer:
        def score(ps, completions):
            exs = [by_prompt[p] for p in ps]
            return scorer.score(completions, exs, [False] * len(exs)).correct
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        rates = [tiny_model.sampled_pass_rate(model, prompts, score, seed=s, max_new_tokens=24)
                 for s in range(4)]
    assert 0.05 <= sum(rates) / len(rates) <= 0.60, rates
