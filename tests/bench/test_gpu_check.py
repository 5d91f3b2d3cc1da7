"""bench/gpu_check.py's CPU form: the GPU check's code path runs and its figures are sane."""
import importlib.util
from pathlib import Path

import pytest


@pytest.mark.parametrize("state", ["fp32", "cpu_offload"])
def test_gpu_check_cpu_form(tmp_path, state):
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--size", "tiny", "--steps", "2", "--prompts", "2", "--n", "4",
                    "--prompt-len", "8", "--new-tokens", "8", "--json", str(tmp_path / "r.json"),
                    "--optimizer-state", state])
    assert out["loss_finite"] and out["params_moved_frac"] > 0.5  # lr 1e-6 on fp32 masters
    assert out["samples_per_s"] > 0 and out["train_tokens_per_s"] > 0
    assert (tmp_path / "r.json").is_file()
