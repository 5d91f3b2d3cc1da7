"""A job on 2 ranks through the whole service: `brorl up` with BRORL_GPU_COUNTS=1,2,
the real trainer, torchrun and gloo on the CPU. The job succeeds with every metric step once
and a checkpoint that downloads and loads (a LoRA job too: its adapter and merged folder);
SIGKILL of one rank fails that attempt as a machine fault and the next attempt resumes from
the checkpoint to success."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.client import BrorlClient
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from tests.support.upstack import Stack, running_stack
from trainer.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def spec(steps: int) -> dict:
    return {"name": "two-ranks", "seed": SHARED_SEED, "task": shared_task(),
            "rollout": {"engine": "hf", "max_new_tokens": 24,
                        "schedule": [{"n": 8, "prompts_per_step": 4, "steps": steps}]},
            "optim": {"lr": 1e-4}, "algo": {"mini_batches": 2, "micro_batch_tokens": 256},
            "eval": {"every": 2, "samples_per_prompt": 4, "k": [1, 4]},
            "checkpoint": {"every": 2, "keep_last": 2}, "resources": {"gpus_per_node": 2}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    prebuild(JobSpec.model_validate(spec(4)))  # the ranks find builtin:tiny in BRORL_CACHE_DIR
    with running_stack(tmp_path_factory.mktemp("ranks"), {
            "BRORL_GPU_COUNTS": "1,2", "BRORL_HEARTBEAT_SECONDS": "1", "BRORL_REAPER_INTERVAL_SECONDS": "5",
            "BRORL_TRAINER_ENTRYPOINT": None}) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack: Stack) -> BrorlClient:
    return BrorlClient(stack.url, stack.key, timeout=30)


def _final(client: BrorlClient, job_id: str, stack: Stack) -> dict:
    try:
        return client.wait(job_id, poll=1, timeout=600)
    except TimeoutError:
        pytest.fail(f"job {job_id} did not finish\n{stack.output()[-6000:]}")


def _steps(client: BrorlClient, job_id: str) -> list[int]:
    return [r["step"] for r in client.metrics(job_id)["data"]]


def test_two_rank_job_succeeds_and_its_checkpoint_loads(client: BrorlClient, stack: Stack, tmp_path: Path):
    from transformers import AutoModelForCausalLM

    job = client.submit(spec(4))
    done = _final(client, job["id"], stack)
    assert done["status"] == "succeeded", (done, stack.output()[-6000:])
    assert _steps(client, job["id"]) == [0, 1, 2, 3, 4]  # rank 0's rows, each step once
    dest = client.download(job["id"], 4, tmp_path / "ckpt")
    AutoModelForCausalLM.from_pretrained(dest)


def test_two_rank_lora_job_succeeds_and_its_adapter_downloads(client: BrorlClient, stack: Stack, tmp_path: Path):
    """The same job with an adapter: the base replicated on the ranks, rank 0's checkpoint is
    PEFT's adapter (the default download) and a merged folder."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.run import cache_dir, tiny_model_key

    body = {**spec(2), "name": "two-ranks-lora", "model": {"lora": {"rank": 8, "alpha": 16}}, "optim": {"lr": 1e-3}}
    job = client.submit(body)
    done = _final(client, job["id"], stack)
    assert done["status"] == "succeeded", (done, stack.output()[-6000:])
    assert _steps(client, job["id"]) == [0, 1, 2]  # rank 0's rows, each step once
    listed = client.list_checkpoints(job["id"])["data"]
    assert [c["step"] for c in listed] == [2] and listed[0]["kind"] == "lora"
    adapter = client.download(job["id"], 2, tmp_path / "adapter")
    assert (adapter / "adapter_model.safetensors").is_file() and not (adapter / "model.safetensors").exists()
    base_dir = cache_dir() / "models" / f"tiny-{tiny_model_key(JobSpec.model_validate(body))}"
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter)
    AutoModelForCausalLM.from_pretrained(client.download(job["id"], 2, tmp_path / "merged", merged=True))


def _rank_pids(job_id: str) -> list[int]:
    """The job's rank processes (not torchrun, whose command line names the module too)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace") if entry.name.isdigit() else ""
        except OSError:
            continue
        if "trainer.distributed.rank_main" in cmd and job_id in cmd and "torch.distributed.run" not in cmd:
            found.append(int(entry.name))
    return found


def test_sigkill_of_a_rank_retries_and_resumes_from_the_checkpoint(client: BrorlClient, stack: Stack):
    job = client.submit(spec(6))
    deadline = time.monotonic() + 600
    while not any(e["type"] == "checkpoint_saved" for e in client.events(job["id"])["data"]):
        assert time.monotonic() < deadline, stack.output()[-6000:]
        time.sleep(1)
    pids = _rank_pids(job["id"])
    assert len(pids) == 2, pids
    os.kill(pids[-1], signal.SIGKILL)
    done = _final(client, job["id"], stack)
    events = [(e["type"], e.get("data")) for e in client.events(job["id"])["data"]]
    assert done["status"] == "succeeded", (done.get("error"), events, stack.output()[-3000:])
    assert done["attempt"] == 2
    retried = [e for e in client.events(job["id"])["data"] if e["type"] == "retried"]
    assert retried and "rank" in retried[0]["data"]["error"], retried
    steps = _steps(client, job["id"])
    assert steps == sorted(set(steps)) and steps[-1] == 6  # resumed: every step once, to the end
    started = [e for e in client.events(job["id"])["data"] if e["type"] == "started"]
    assert len(started) == 2
