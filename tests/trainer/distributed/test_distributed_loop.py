"""The whole loop on 2 ranks under torchrun (gloo, builtin:tiny): `train` with gpus_per_node 2
relays rank 0's figures once, stops at a step boundary, and its checkpoints resume in 1
process and back (full fine-tuning and LoRA); a fenced job's ranks die at once; `brorl train
--nproc 2` stops on Ctrl-C."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store.errors import Fenced
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from trainer.sink import ListSink
from trainer.spec import JobSpec

pytestmark = pytest.mark.slow

SPEC = {
    "name": "ranks", "seed": SHARED_SEED, "task": shared_task(),  # one prebuilt model for many tests
    "rollout": {"engine": "hf", "max_new_tokens": 24, "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 6}]},
    "optim": {"lr": 1e-4},
    "algo": {"mini_batches": 2, "micro_batch_tokens": 256, "kl_coef": 1e-3, "ref_reset_every": 3},
    "eval": {"every": 2, "samples_per_prompt": 4, "k": [1, 4]},
    "checkpoint": {"every": 2, "keep_last": 3},
}


# The LoRA variant: the same job with an adapter (its lr about 10x full fine-tuning's).
LORA = {"model": {"lora": {"rank": 8, "alpha": 16}}, "optim": {"lr": 1e-3}}


def spec(gpus: int, lora: bool = False) -> JobSpec:
    return JobSpec.model_validate({**SPEC, **(LORA if lora else {}), "resources": {"gpus_per_node": gpus}})


@pytest.fixture(scope="module", autouse=True)
def tiny_model():
    prebuild(spec(1))


def run(gpus, out, stop_after=None, resume=None, fence_after=None, lora=False):
    from trainer import train

    sink = ListSink()

    def should_stop():
        last = max((r["step"] for r in sink.steps), default=-1)
        if fence_after is not None and last >= fence_after:
            raise Fenced("job", 1)
        return stop_after is not None and last >= stop_after

    return sink, train(spec(gpus, lora), sink, should_stop, resume=resume, out_dir=out)


def _steps(sink):
    return [r["step"] for r in sink.steps]


def test_two_ranks_resume_in_one_process_and_back(tmp_path):
    from transformers import AutoModelForCausalLM

    # The launcher relays rank 0's steps and writes the stop file; the ranks agree on it at
    # their next step boundary, so a step already under way when the stop lands finishes too.
    sink, res = run(2, tmp_path / "a", stop_after=2)
    s = res.steps_completed
    assert res.stopped and 2 <= s <= 4, s
    assert _steps(sink) == list(range(s + 1))  # each step once
    assert [c[0] for c in sink.checkpoints] == sorted({2, s}) and res.last_checkpoint == sink.checkpoints[-1][1]
    ckpt = res.last_checkpoint
    assert (ckpt / "trainer_state" / "dcp").is_dir() and not (ckpt / "trainer_state" / "optimizer.pt").exists()
    AutoModelForCausalLM.from_pretrained(ckpt)  # the consolidated download folder loads
    assert sink.steps[1]["samples"] >= 4 * 8  # all ranks' samples (each rank generates half)
    assert any(t == "eval" for t, _ in sink.events)

    sink, res = run(1, tmp_path / "b", stop_after=s + 1, resume=ckpt)  # 2 ranks -> 1 process
    assert _steps(sink) == [s + 1] and res.last_checkpoint.name.endswith(str(s + 1))
    assert (res.last_checkpoint / "trainer_state" / "optimizer.pt").is_file()

    sink, res = run(2, tmp_path / "c", resume=res.last_checkpoint)  # 1 process -> 2 ranks
    assert _steps(sink) == list(range(s + 2, 7)) and not res.stopped and res.steps_completed == 6
    assert res.last_eval is not None and [c[0] for c in sink.checkpoints] == [x for x in range(s + 2, 7) if x % 2 == 0]


def test_lora_job_on_two_ranks_resumes_in_one_process_and_back(tmp_path):
    """LoRA on 2 ranks: the base replicated, the adapter's gradients all-reduced; rank 0 writes
    the one-process checkpoint (PEFT's adapter, merged/, optimizer.pt), which resumes on
    1 rank and again on 2."""
    from safetensors.torch import load_file

    sink, res = run(2, tmp_path / "a", stop_after=2, lora=True)
    s = res.steps_completed
    assert res.stopped and 2 <= s <= 4, s
    assert _steps(sink) == list(range(s + 1))  # each step once
    assert sink.steps[1]["samples"] >= 4 * 8  # all ranks' samples (each rank generates half)
    assert any(r["loss"] is not None and r["kl"] > 0 for r in sink.steps[1:])  # the base is the reference
    ckpt = res.last_checkpoint
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "merged", "trainer_state"} <= names
    assert "model.safetensors" not in names
    assert (ckpt / "trainer_state" / "optimizer.pt").is_file() and not (ckpt / "trainer_state" / "dcp").exists()
    adapter = load_file(str(ckpt / "adapter_model.safetensors"))
    assert any(bool(v.abs().sum() > 0) for k, v in adapter.items() if "lora_B" in k)  # the adapter learned

    sink, res = run(1, tmp_path / "b", stop_after=s + 1, resume=ckpt, lora=True)  # 2 ranks -> 1 process
    assert _steps(sink) == [s + 1] and res.last_checkpoint.name.endswith(str(s + 1))

    sink, res = run(2, tmp_path / "c", resume=res.last_checkpoint, lora=True)  # 1 process -> 2 ranks
    assert _steps(sink) == list(range(s + 2, 7)) and not res.stopped and res.steps_completed == 6
    assert res.last_eval is not None and (res.last_checkpoint / "adapter_model.safetensors").is_file()


def _ranks_alive(control: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"trainer.distributed.rank_main {control}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_fenced_job_kills_its_ranks_at_once_and_saves_nothing(tmp_path):
    t = time.monotonic()
    with pytest.raises(Fenced):
        run(2, tmp_path, fence_after=1)
    assert time.monotonic() - t < 300
    assert _ranks_alive(tmp_path / "ranks") == []
    assert not list((tmp_path / "checkpoints").glob("step-*")) if (tmp_path / "checkpoints").exists() else True


def test_brorl_train_nproc_stops_on_ctrl_c_with_a_checkpoint(tmp_path):
    import yaml

    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({**SPEC, "checkpoint": {"every": 0, "keep_last": 1}}))
    out = tmp_path / "out"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "brorl"), "train", str(tmp_path / "spec.yaml"), "--out", str(out),
                             "--nproc", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:  # step 0 and step 1
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text
    assert "stopped early" in text and "checkpoint:" in text, text
    assert _ranks_alive(out / "ranks") == []
    steps = [line for line in metrics.read_text().splitlines()]
    assert 2 <= len(steps) < 7  # stopped before the schedule's end
