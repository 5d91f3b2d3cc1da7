"""A real probe on builtin:tiny: chunks, progress, the result's figures, and a stop mid-probe."""
import pytest

from tests.support.tinyprebuild import prebuild
from trainer.algo.passk import pass_at_k_mean
from trainer.probe import probe
from trainer.probe_spec import ProbeSpec, base_job_spec
from trainer.stop import StopRequested

# The fixture warm-starts builtin:tiny (150 SFT steps) and the probes sample from it.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TASK = {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
                          "train_size": 500, "eval_size": 16}}


@pytest.fixture(scope="module")
def spec() -> ProbeSpec:
    spec = ProbeSpec.model_validate({"task": TASK, "n": 32, "prompts": 4, "max_new_tokens": 24,
                                     "chunk_samples": 48, "engine": "hf", "seed": 1})
    prebuild(base_job_spec(spec), sft_steps=150)
    return spec


def test_probe_result_and_progress(spec):
    seen = []
    result = probe(spec, base_job_spec(spec), lambda: False, on_progress=seen.append)
    # n = 32 <= chunk 48: one prompt per call, 4 calls, each reported.
    assert [p["samples_done"] for p in seen] == [32, 64, 96, 128]
    assert all(p["samples_total"] == 128 for p in seen)
    counts = [row["correct"] for row in result["per_prompt"]]
    assert len(counts) == 4 and all(row["n"] == 32 for row in result["per_prompt"])
    assert list(result["pass_at_k"]) == ["1", "2", "4", "8", "16", "32"]
    for k, row in result["pass_at_k"].items():
        assert row["mean"] == pytest.approx(pass_at_k_mean(counts, 32, int(k)))
        assert 0 <= row["lo"] <= row["hi"] <= 1
    assert result["samples"] == 128 and result["tokens"] >= 128
    assert 0 < result["response_len_mean"] <= 24 and 0 <= result["truncated_frac"] <= 1
    assert result["seconds"] > 0 and result["samples_per_s"] > 0
    # all-wrong in 16 samples (expected) yet solved within the 32 drawn; none at 64 >= n
    missed_by_16 = [1 - pass_at_k_mean([c], 32, 16) for c in counts if c > 0]
    assert result["solvable_all_wrong"]["16"] == pytest.approx(sum(missed_by_16) / len(counts))
    assert result["solvable_all_wrong"]["64"] is None
    rec = result["recommendation"]
    assert rec["verdict"] in {"narrow", "narrow_then_broaden", "broaden", "out_of_reach", "fix_truncation"}
    assert rec["reason"] and rec["spec"]["task"]["reasoning_gym"]["name"] == "chain_sum"
    # Seeded: the same probe draws the same samples.
    again = probe(spec, base_job_spec(spec), lambda: False)
    assert [r["correct"] for r in again["per_prompt"]] == counts


def test_stop_reaches_the_probe_between_chunks(spec):
    seen = []
    with pytest.raises(StopRequested):
        probe(spec, base_job_spec(spec), lambda: len(seen) >= 1, on_progress=seen.append)
    assert len(seen) == 1  # stopped after the first chunk, not at the end


def test_mid_training_probe_reads_the_running_engine(spec):
    """`rollout.broaden.trigger: probe`'s probe: the run's own engine and scorer, the rollout's
    sampling, summarised for the decision at the stage's n."""
    from trainer.evaluate import opened
    from trainer.probe import probe_policy
    from trainer.stop import never

    base = base_job_spec(spec)
    with opened(base, prompts=4, max_num_seqs=64) as ctx:
        fig = probe_policy(ctx, base, n=64, prompts=3, at_n=16, check=never, seed=5)
    assert fig["n"] == 64 and fig["prompts"] == 3 and fig["at_n"] == 16
    assert 0 <= fig["pass@1"] <= fig["pass@16"] <= fig["pass@64"] <= 1
    assert fig["solvable_all_wrong"] == pytest.approx(fig["pass@64"] - fig["pass@16"])
    assert fig["seconds"] > 0 and 0 <= fig["truncated_frac"] <= 1
