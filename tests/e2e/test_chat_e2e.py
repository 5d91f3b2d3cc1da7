"""The official `openai` SDK talks to checkpoints through `brorl up` (the real API, its worker and
its inference server with the HF engine): chat and legacy completions, streamed and not, by job
id, `<job>:<step>` and `ft:<job>:step-<N>`; a LoRA checkpoint through its merged/ folder; another
tenant's model is a 404, an unsupported parameter a 400 naming it.

The jobs run the fake trainer (seconds), then their checkpoint folder is given real weights: an
untrained builtin:tiny (a character-level Qwen2), so what the SDK gets back can be checked
against transformers' own greedy decoding of the same folder.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from cli.client import BrorlClient
from tests.support.jobs import FAKE_ENTRYPOINT, make_spec
from tests.support.upstack import Stack, running_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PROMPT = "12+3="


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("chat"), {
            "BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT, "OMP_NUM_THREADS": "1",
            "BRORL_INFERENCE_CACHE_MODELS": "1"}) as stack:
        yield stack


def _trained(stack: Stack, seed: int, lora: bool = False) -> tuple[str, Path]:
    """A succeeded job whose step-3 checkpoint holds a real model (for LoRA: in merged/ only,
    the folder itself keeps the fake trainer's unloadable files plus an adapter config)."""
    from trainer.models.tiny import build_untrained, save_folder

    client = BrorlClient(stack.url, stack.key, timeout=30)
    job = client.submit(make_spec(f"chat{seed}"))["id"]
    assert client.wait(job, poll=0.3, timeout=90)["status"] == "succeeded", stack.output()[-3000:]
    folder = stack.data_dir / "artifacts" / "jobs" / job / "attempt-1" / "checkpoints" / "step-00000003"
    assert folder.is_dir()
    model, tokenizer = build_untrained(seed)
    if lora:
        (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
        save_folder(model, tokenizer, folder / "merged")
    else:
        save_folder(model, tokenizer, folder)
    return job, folder


def _greedy(folder: Path, prompt: str, max_tokens: int) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def job(stack: Stack) -> tuple[str, Path]:
    return _trained(stack, seed=3)


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0)


def test_chat_by_job_id_answers_what_the_checkpoint_decodes(client, job) -> None:
    job_id, folder = job
    answer = client.chat.completions.create(
        model=job_id, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0)
    assert answer.object == "chat.completion" and answer.model == f"ft:{job_id}:step-3"
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == _greedy(folder, PROMPT, 12)  # a lone user turn is its text
    assert answer.usage.prompt_tokens == len(PROMPT)  # character-level tokenizer
    assert answer.usage.completion_tokens <= 12
    assert choice.finish_reason == ("length" if answer.usage.completion_tokens == 12 else "stop")


def test_chat_streams_token_by_token_ending_in_done(client, job, stack) -> None:
    job_id, folder = job
    stream = client.chat.completions.create(
        model=f"{job_id}:3", messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    expected = _greedy(folder, PROMPT, 12)
    assert "".join(texts) == expected
    assert len(texts) == len(expected)  # one piece per (character) token, not one at the end
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(PROMPT)
    # The raw stream is OpenAI's server-sent events ending with [DONE].
    raw = httpx.post(f"{stack.url}/v1/chat/completions", timeout=60,
                     headers={"Authorization": f"Bearer {stack.key}"},
                     json={"model": job_id, "messages": [{"role": "user", "content": PROMPT}],
                           "max_tokens": 4, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_completions_by_checkpoint_name_with_stop_seed_and_n(client, job) -> None:
    job_id, folder = job
    name = f"ft:{job_id}:step-3"
    expected = _greedy(folder, PROMPT, 12)
    answer = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0)
    assert answer.object == "text_completion" and answer.choices[0].text == expected
    stop = expected[3:5]
    cut = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].text == expected[:expected.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected
    sampled = [client.completions.create(model=name, prompt=PROMPT, max_tokens=16, seed=5, n=2)
               for _ in range(2)]
    assert [c.text for c in sampled[0].choices] == [c.text for c in sampled[1].choices]
    assert len(sampled[0].choices) == 2


def test_a_lora_checkpoint_is_served_through_its_merged_model(client, stack) -> None:
    job_id, folder = _trained(stack, seed=4, lora=True)
    answer = client.completions.create(model=job_id, prompt=PROMPT, max_tokens=10, temperature=0)
    assert answer.choices[0].text == _greedy(folder / "merged", PROMPT, 10)


def test_another_tenants_model_and_unknown_checkpoints_are_404(client, job, stack) -> None:
    job_id, _ = job
    made = stack.brorl("keys", "create", "--tenant", "other", "--data-dir", str(stack.data_dir))
    assert made.returncode == 0, made.stderr
    other = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=made.stdout.strip().splitlines()[-1],
                          max_retries=0)
    for model in (job_id, f"{job_id}:3", f"ft:{job_id}:step-3"):
        with pytest.raises(openai.NotFoundError) as err:
            other.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert err.value.code == "model_not_found" and err.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=f"{job_id}:2", prompt="hi")


def test_unsupported_and_out_of_range_parameters_are_400_naming_them(client, job) -> None:
    job_id, _ = job
    messages = [{"role": "user", "content": "hi"}]
    for kwargs, param in (({"logprobs": True}, "logprobs"), ({"max_tokens": 10**6}, "max_tokens"),
                          ({"temperature": 3}, "temperature"), ({"n": 99}, "n"),
                          ({"presence_penalty": 1.0}, "presence_penalty")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=job_id, messages=messages, **kwargs)
        assert err.value.param == param, err.value
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=job_id, messages=[{"role": "tool", "content": "x"}])
    assert err.value.param == "messages[0].role"


def test_brorl_chat_prints_the_answer_as_it_streams(stack, job) -> None:
    job_id, folder = job
    started = time.monotonic()
    result = stack.brorl("chat", f"{job_id}:3", PROMPT, "--max-tokens", "12", "--temperature", "0",
                         key=stack.key)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == _greedy(folder, PROMPT, 12)
    assert time.monotonic() - started < 60
