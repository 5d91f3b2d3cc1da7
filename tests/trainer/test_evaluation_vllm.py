"""An evaluation on the vLLM engine: the base and a checkpoint, one engine after the other in one
process, through `trainer.evaluation.evaluate_models` (what `worker.evaluation_job` runs).

vLLM engines opened and closed in sequence in one process are where leaks live: this checks
that the second engine starts only after the first is closed, that each closed engine is freed
(its `LLM` object collected), that no engine process is left behind, and that greedy results
agree with the HF engine's on the same prompts.
"""
from __future__ import annotations

import gc
import shutil
import threading
import weakref

import pytest

from tests.support.tinyprebuild import prebuild
from tests.trainer.test_train_loop import tiny_spec

pytestmark = pytest.mark.slow

PROMPTS, N = 8, 4


def _checkpoint(base, out):
    """A second model folder: the base's weights nudged (a stand-in for a trained step)."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(base, out)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02 * (p.std() if p.numel() > 1 else 0))
    model.save_pretrained(out)
    return out


def _engine_processes(pid):
    """Processes under `pid` that are vLLM's (an engine core or any vllm command line)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            line = " ".join(child.cmdline()) + " " + child.name()
        except psutil.Error:
            continue
        if "vllm" in line.lower() or "enginecore" in line.lower():
            found.append(line)
    return found


def test_base_and_checkpoint_on_vllm_one_engine_at_a_time_none_left_and_agrees_with_hf(tmp_path, monkeypatch):
    import os

    import psutil

    from trainer.engines import vllm_engine
    from trainer.evaluation import Model, evaluate_models
    from trainer.evaluation_spec import EvaluationSpec, Picked, filled, sampling_job_spec
    from trainer.run import cache_dir, tiny_model_key

    job = tiny_spec()
    prebuild(job)
    base_dir = cache_dir() / "models" / f"tiny-{tiny_model_key(job)}"
    assert (base_dir / "config.json").exists()
    ckpt = _checkpoint(base_dir, tmp_path / "step-1")

    # Greedy (temperature 0: the API asks for > 0, the evaluation itself takes it), so both
    # engines must give each prompt's n samples the same, and each other the same answers.
    # The job spec it samples with keeps a valid temperature; the sampling reads the evaluation's.
    asked = filled(EvaluationSpec(checkpoints=[1], prompts=PROMPTS, n=N, k=[N], max_new_tokens=24, engine="vllm"),
                   job, "job_vllm", [Picked(step=1, asked=["1"])])
    spec = asked.model_copy(update={"temperature": 0.0})
    models = [Model("base", None, None), Model("step 1", 1, ckpt)]

    events, freed = [], []
    real_init, real_close = vllm_engine.VLLMEngine.__init__, vllm_engine.VLLMEngine.close

    def init(self, *a, **kw):
        events.append(("open", len([e for e in events if e[0] == "open"]) - len([e for e in events if e[0] == "close"])))
        real_init(self, *a, **kw)
        freed.append(weakref.ref(self.llm))

    def close(self):
        real_close(self)
        events.append(("close", None))

    monkeypatch.setattr(vllm_engine.VLLMEngine, "__init__", init)
    monkeypatch.setattr(vllm_engine.VLLMEngine, "close", close)

    me = os.getpid()
    before = set(_engine_processes(me))
    rss0 = psutil.Process(me).memory_info().rss
    threads0 = threading.active_count()
    progress = []
    result = evaluate_models(spec, sampling_job_spec(asked, job), models, lambda: False,
                             on_progress=progress.append)
    gc.collect()

    # One engine per model, each opened with none other open (the count of open engines at
    # each start is 0), each closed before the next.
    assert events == [("open", 0), ("close", None), ("open", 0), ("close", None)], events
    # Each closed engine is gone: nothing still holds its LLM (model weights, KV cache).
    assert len(freed) == 2 and all(ref() is None for ref in freed), "a closed vLLM engine is still referenced"
    assert set(_engine_processes(me)) - before == set(), _engine_processes(me)
    rss_growth = psutil.Process(me).memory_info().rss - rss0
    threads = [t.name for t in threading.enumerate()]

    rows = result["models"]
    assert [r["label"] for r in rows] == ["base", "step 1"] and [r["step"] for r in rows] == [None, 1]
    assert result["prompts"] == PROMPTS and len(result["prompt_texts"]) == PROMPTS
    for row in rows:
        assert len(row["correct"]) == PROMPTS and all(c in (0, N) for c in row["correct"]), row["correct"]
        assert row["samples"] == PROMPTS * N and row["tokens"] > 0
        assert 0 <= row["pass_at_k"]["1"]["mean"] <= 1
    assert rows[1]["delta"] is not None and rows[1]["changes"] is not None
    assert {p["model"] for p in progress} == {"base", "step 1"}
    assert progress[-1]["samples_done"] == progress[-1]["samples_total"] == 2 * PROMPTS * N
    # The warm-started base answers some of these one-digit sums.
    assert sum(rows[0]["correct"]) > 0

    # The same evaluation on the HF engine: greedy decoding gives the same answers per prompt
    # (float32 both; vLLM's and transformers' kernels may differ in the last bits, so one prompt
    # per model may flip on a near tie).
    hf_asked = asked.model_copy(update={"engine": "hf"})
    hf = evaluate_models(hf_asked.model_copy(update={"temperature": 0.0}), sampling_job_spec(hf_asked, job),
                         models, lambda: False)
    for mine, theirs in zip(rows, hf["models"]):
        differ = sum(a != b for a, b in zip(mine["correct"], theirs["correct"]))
        assert differ <= 1, (mine["label"], mine["correct"], theirs["correct"])
        assert abs(mine["response_len_mean"] - theirs["response_len_mean"]) <= 2, (mine, theirs)
    print(f"vllm eval {result['seconds']:.1f}s, hf eval {hf['seconds']:.1f}s, "
          f"rss growth over the vllm evaluation {rss_growth / 2**20:.0f} MiB; threads {threads0} -> {threads}; "
          f"vllm correct {[r['correct'] for r in rows]}, hf {[r['correct'] for r in hf['models']]}")
