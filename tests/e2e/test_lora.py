"""A LoRA job through the whole service: `brorl up` with the real trainer on builtin:tiny.
It succeeds with every metric step once; its checkpoint downloads as PEFT's adapter (the
default) and as a merged HF folder; the adapter loads with peft onto the base and gives the
log-probs the trainer's model had, and so does the merged folder in plain transformers."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cli.client import BrorlClient
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from tests.support.upstack import Stack, running_stack
from trainer.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SPEC = {"name": "lora-service", "seed": SHARED_SEED, "task": shared_task(),  # one prebuilt model
        "model": {"lora": {"rank": 8, "alpha": 16}},
        "rollout": {"max_new_tokens": 24, "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 2}]},
        "optim": {"lr": 1e-3}, "algo": {"mini_batches": 2, "micro_batch_tokens": 256},
        "eval": {"every": 2, "samples_per_prompt": 4, "k": [1, 4]},
        "checkpoint": {"every": 2, "keep_last": 2}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    prebuild(JobSpec.model_validate(SPEC))  # the worker finds builtin:tiny in BRORL_CACHE_DIR
    with running_stack(tmp_path_factory.mktemp("lora"), {
            "BRORL_HEARTBEAT_SECONDS": "1", "BRORL_TRAINER_ENTRYPOINT": None}) as stack:
        yield stack


def _probe_logprobs(model, ids: list[list[int]]) -> list[torch.Tensor]:
    from trainer.optim.update import sequence_logprobs

    prompts, responses = [i[:6] for i in ids], [i[6:] for i in ids]
    return sequence_logprobs(model, prompts, responses, 1.0, 4096)


def test_lora_job_runs_and_its_adapter_loads_with_the_trainers_logprobs(stack: Stack, tmp_path: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.models.lora import load_lora_policy
    from trainer.run import cache_dir, tiny_model_key

    client = BrorlClient(stack.url, stack.key, timeout=30)
    job = client.submit(SPEC)
    try:
        done = client.wait(job["id"], poll=1, timeout=1000)
    except TimeoutError:
        pytest.fail(f"job did not finish\n{stack.output()[-6000:]}")
    assert done["status"] == "succeeded", (done, stack.output()[-6000:])
    assert [r["step"] for r in client.metrics(job["id"])["data"]] == [0, 1, 2]  # each step once
    listed = client.list_checkpoints(job["id"])["data"]
    assert [c["step"] for c in listed] == [2] and listed[0]["kind"] == "lora"

    adapter = client.download(job["id"], 2, tmp_path / "adapter")
    merged = client.download(job["id"], 2, tmp_path / "merged", merged=True)
    assert (adapter / "adapter_model.safetensors").is_file() and not (adapter / "merged").exists()
    assert (merged / "model.safetensors").is_file()

    spec = JobSpec.model_validate(SPEC)
    base_dir = cache_dir() / "models" / f"tiny-{tiny_model_key(spec)}"
    # The trainer's own model at step 2, as its loader rebuilds it from the server's folder.
    server_ckpt = next(stack.data_dir.rglob("step-00000002"))
    trainer_model, _, _ = load_lora_policy(spec, base_dir, server_ckpt, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 90, (20,), generator=gen).tolist() for _ in range(4)]
    expected = _probe_logprobs(trainer_model, ids)

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter)
    got = _probe_logprobs(peft_model, ids)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))
    plain = _probe_logprobs(AutoModelForCausalLM.from_pretrained(base_dir), ids)
    assert max(float((a - b).abs().max()) for a, b in zip(plain, expected)) > 1e-4  # it learned
    got = _probe_logprobs(AutoModelForCausalLM.from_pretrained(merged), ids)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got, expected))
