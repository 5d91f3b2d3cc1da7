"""The whole loop on builtin:tiny with the HF engine: metrics, schedule, checkpoints, resume."""
import json
import math

import pytest

from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from trainer.checkpoints.io import CheckpointError, latest, verify
from trainer.models import tiny
from trainer.sink import ListSink
from trainer.spec import JobSpec

# Every test trains builtin:tiny (its warm start included, minutes on 2 cores on a fresh cache).
pytestmark = pytest.mark.integration

METRIC_NAMES = """step stage n prompts lr reward_mean reward_std pass_rate frac_all_correct
frac_all_wrong keep_rate refill_rounds response_len_mean response_len_max truncated_frac loss
pg_clipfrac_low pg_clipfrac_high kl entropy is_ratio_mean is_truncated_frac grad_norm
weight_sync_s gen_s score_s train_s step_s samples_per_s tokens_per_s peak_mem_mb kept_groups
groups_shortfall underfilled keep_rate_running skipped_updates mini_batch_updates""".split()


def tiny_spec(**over) -> JobSpec:
    data = {
        # One capped warm start (`prebuild`) serves this and the other shared-task tests.
        "name": "loop-test", "seed": SHARED_SEED, "task": shared_task(),
        "rollout": {"engine": "hf", "max_new_tokens": 24,
                    "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 2}, {"n": 32, "prompts_per_step": 1, "steps": 2}]},
        "optim": {"lr": 1e-4},
        "algo": {"mini_batches": 2, "micro_batch_tokens": 256, "ref_reset_every": 3},
        "eval": {"every": 2, "samples_per_prompt": 4, "k": [1, 4]},
        "checkpoint": {"every": 2, "keep_last": 2},
    }
    data.update(over)
    return JobSpec.model_validate(data)


def run(spec, out, stop_after=None, resume=None):
    from trainer import train

    sink = ListSink()

    def should_stop():  # polled once per step and inside long phases: stop once step N is logged
        return stop_after is not None and any(r["step"] >= stop_after for r in sink.steps)

    result = train(spec, sink, should_stop, resume=resume, out_dir=out)
    return sink, result


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    prebuild(tiny_spec())
    sink, result = run(tiny_spec(), out)
    return out, sink, result


def test_metrics_schedule_and_events(full_run):
    out, sink, result = full_run
    assert result.steps_completed == 4 and not result.stopped
    rows = {r["step"]: r for r in sink.steps}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    for s in (1, 2, 3, 4):
        missing = [k for k in METRIC_NAMES if k not in rows[s]]
        assert not missing, missing
    assert [rows[s]["n"] for s in (1, 2, 3, 4)] == [8, 8, 32, 32]
    # sqrt rule: stage 2 has 32 samples/step like stage 1 (8 x 4), so the same lr
    assert rows[3]["lr"] == pytest.approx(rows[1]["lr"])
    for s in (0, 2, 4):
        assert 0.0 <= rows[s]["eval/pass@1"] <= rows[s]["eval/pass@4"] <= 1.0
    types = [t for t, _ in sink.events]
    assert types.count("stage_started") == 2 and types.count("eval") == 3
    assert [c[0] for c in sink.checkpoints] == [2, 4]


def test_long_phases_report_progress_events_and_each_ends(full_run):
    _, sink, _ = full_run
    progress = [d for t, d in sink.events if t == "progress"]
    # The model was prebuilt: no warm start; then each phase before step 1, evaluations later.
    assert [d["phase"] for d in progress if not d["finished"]][:4] == ["task", "model_load", "engine_start", "eval"]
    for phase in ("task", "model_load", "engine_start"):
        ends = [d for d in progress if d["phase"] == phase and d["finished"]]
        assert len(ends) == 1 and 0 <= ends[0]["seconds"] < 300 and ends[0]["message"], phase
    loaded = next(d for d in progress if d["phase"] == "model_load" and d["finished"])
    assert loaded["seconds"] > 0  # reading a model from disk is not instant (ms resolution)
    evals = [d for d in progress if d["phase"] == "eval" and d["finished"]]
    assert [d["step"] for d in evals] == [0, 2, 4] and {d["done"] for d in evals} == {16 * 4}  # prompts x samples
    first_metrics = next(i for i, (t, _) in enumerate(sink.events) if t == "eval")
    assert [d["phase"] for t, d in sink.events[:first_metrics] if t == "progress"][-1] == "eval"


def test_each_step_stores_its_highest_and_lowest_reward_samples(full_run):
    _, sink, _ = full_run
    assert sorted(sink.samples_by_step) == [1, 2, 3, 4]
    for step, rows in sink.samples_by_step.items():
        assert len(rows) == 8, step  # samples.per_step's default
        rewards = [r["reward"] for r in rows]
        assert rewards[:4] == sorted(rewards[:4], reverse=True) and max(rewards) == rewards[0]
        assert all(r["prompt"] and isinstance(r["completion"], str) for r in rows)


def test_updates_happened_and_reference_reset_keeps_optimizer_state(full_run):
    import torch

    out, sink, _ = full_run
    rows = {r["step"]: r for r in sink.steps}
    updated = [s for s in (1, 2, 3, 4) if rows[s]["loss"] is not None]
    assert updated, "no step updated: every check over the loss would be vacuous"
    assert all(math.isfinite(rows[s]["loss"]) and rows[s]["skipped_updates"] == 0 for s in updated)
    ts = latest(out) / "trainer_state"
    assert json.loads((ts / "state.json").read_text())["ref_step"] == 3  # ref_reset_every: 3
    opt = torch.load(ts / "optimizer.pt", weights_only=False)
    adam_steps = {int(v["step"]) for v in opt["state"].values()}
    # AdamW's step count runs through the reference reset at step 3: its state is kept.
    assert adam_steps == {sum(rows[s]["mini_batch_updates"] for s in updated)}


def test_checkpoint_is_hf_folder_and_verified(full_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, sink, _ = full_run
    ckpt = latest(out)
    assert ckpt.name == "step-00000004"
    assert len(list((out / "checkpoints").glob("step-*"))) == 2   # keep_last
    verify(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert model.config.num_hidden_layers == 4 and tok.eos_token_id == tiny.VOCAB[tiny.EOS]
    # a corrupted file is detected
    (ckpt / "config.json").write_text(json.dumps({"broken": True}))
    with pytest.raises(CheckpointError):
        verify(ckpt)


def test_resume_equals_uninterrupted(full_run, tmp_path):
    _, full_sink, _ = full_run
    spec = tiny_spec()
    first, r1 = run(spec, tmp_path, stop_after=2)
    assert r1.stopped and r1.steps_completed == 2
    second, r2 = run(spec, tmp_path, resume=latest(tmp_path))
    assert r2.steps_completed == 4
    full = {r["step"]: r for r in full_sink.steps}
    resumed = {r["step"]: r for r in first.steps + second.steps}
    for s in (1, 2, 3, 4):
        for k in ("reward_mean", "pass_rate", "loss", "kl", "grad_norm", "lr", "response_len_mean"):
            a, b = full[s][k], resumed[s][k]
            if a is None or b is None:
                assert a is b, (s, k)
            else:
                assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), (s, k, a, b)


def test_cpu_offloaded_optimizer_resumes_and_matches_plain_adamw(full_run, tmp_path):
    # On a CPU (float32 compute) the offloaded AdamW is the same optimizer: a run stopped at
    # step 2 and resumed must reproduce the plain run's whole trajectory.
    _, full_sink, _ = full_run
    spec = tiny_spec(optim={"lr": 1e-4, "optimizer_state": "cpu_offload"})
    first, _ = run(spec, tmp_path, stop_after=2)
    second, r2 = run(spec, tmp_path, resume=latest(tmp_path))
    assert r2.steps_completed == 4
    full = {r["step"]: r for r in full_sink.steps}
    resumed = {r["step"]: r for r in first.steps + second.steps}
    assert any(resumed[s]["loss"] is not None for s in (3, 4))  # the resumed half updated
    for s in (1, 2, 3, 4):
        for k in ("reward_mean", "loss", "kl", "grad_norm"):
            a, b = full[s][k], resumed[s][k]
            assert (a is b is None) or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), (s, k, a, b)


def test_broaden_on_plateau_switches_stage_and_survives_resume(tmp_path):
    # min_delta 1.0 can never be met: every evaluation after the first is a plateau, so the
    # job broadens after step 1 (n 4 -> 8 = max_n) and stays there; resume must keep n = 8.
    spec = tiny_spec(rollout={"engine": "hf", "max_new_tokens": 24,
                              "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 3}],
                              "broaden": {"patience": 1, "min_delta": 1.0, "factor": 2, "max_n": 8}},
                     eval={"every": 1, "samples_per_prompt": 2, "k": [1, 2]},
                     checkpoint={"every": 1, "keep_last": 2}, optim={"lr": 1e-4, "lr_batch": "samples"})
    first, r1 = run(spec, tmp_path / "a", stop_after=2)
    assert r1.steps_completed == 2
    second, r2 = run(spec, tmp_path / "a", resume=latest(tmp_path / "a"))
    rows = {r["step"]: r for r in first.steps + second.steps}
    assert [(rows[s]["n"], rows[s]["stage"], rows[s]["prompts"]) for s in (1, 2, 3)] == [(4, 0, 2), (8, 1, 2), (8, 1, 2)]
    broadened = [d for t, d in first.events + second.events if t == "broadened"]
    assert len(broadened) == 1 and broadened[0]["step"] == 1 and broadened[0]["n"] == 8
    assert "did not rise by 1.0" in broadened[0]["reason"]
    assert rows[2]["lr"] == pytest.approx(rows[1]["lr"] * math.sqrt(2))
