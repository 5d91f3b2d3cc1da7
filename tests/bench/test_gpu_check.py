"""bench/gpu_check.py's CPU form: the GPU check's code path runs and its figures add up."""
import importlib.util
import json
from pathlib import Path

import pytest

PROMPTS, N, PROMPT_LEN, NEW_TOKENS, STEPS = 2, 4, 8, 8, 2


@pytest.mark.parametrize("state", ["fp32", "cpu_offload"])
def test_gpu_check_cpu_form(tmp_path, state):
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--size", "tiny", "--steps", str(STEPS), "--prompts", str(PROMPTS),
                    "--n", str(N), "--prompt-len", str(PROMPT_LEN),
                    "--new-tokens", str(NEW_TOKENS), "--json", str(tmp_path / "r.json"),
                    "--optimizer-state", state])
    assert out["loss_finite"] and out["params_moved_frac"] > 0.5  # lr 1e-6 on fp32 masters
    assert (out["steps"], out["samples_per_step"], out["optimizer_state"]) == (STEPS, PROMPTS * N, state)
    # Every sample is PROMPT_LEN + NEW_TOKENS long (EOS ignored): the update's token rate
    # counts them all over the update's time alone, the sample rate over generation and update.
    assert out["train_tokens_per_s"] > (PROMPT_LEN + NEW_TOKENS) * out["samples_per_s"]
    assert out["gen_tokens_per_s"] > NEW_TOKENS * out["samples_per_s"]
    # The update's FLOPs are 8 N T (forward + backward, and the old log-prob forward).
    assert out["update_tflops"] == pytest.approx(8 * out["params"] * out["train_tokens_per_s"] / 1e12)
    assert json.loads((tmp_path / "r.json").read_text()) == out
