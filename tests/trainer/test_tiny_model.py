"""builtin:tiny: deterministic build, a folder transformers and vLLM load, a useful warm start."""
from __future__ import annotations

import hashlib
import re

import pytest
import torch

from trainer import tiny_model
from trainer.tiny_model import VOCAB, build_tiny_model, encode, ensure_tiny_model

PAIRS = [(f"What is {a} + {b}?\n", f"<answer>{a + b}</answer>") for a in range(5) for b in range(5)]


def never(prompts, completions):
    return [False] * len(prompts)


def digest(folder) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def small_build(folder, seed):
    return build_tiny_model(folder, seed=seed, sft_pairs=PAIRS, score_fn=never,
                            eval_prompts=[p for p, _ in PAIRS[:4]], max_sft_steps=3)


def test_build_is_deterministic_from_seed(tmp_path):
    a = small_build(tmp_path / "a", seed=7)
    b = small_build(tmp_path / "b", seed=7)
    c = small_build(tmp_path / "c", seed=8)
    assert digest(a) == digest(b) != digest(c)


def test_tokenizer_is_character_level(tmp_path):
    from transformers import AutoTokenizer

    folder = small_build(tmp_path / "m", seed=0)
    tok = AutoTokenizer.from_pretrained(folder)
    text = "State: 15 - 43 - 75 =\n<answer>-103</answer>"
    ids = tok(text)["input_ids"]
    assert ids == encode(text) and len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.eos_token_id == VOCAB["<eos>"] and tok.pad_token_id == VOCAB["<pad>"]
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text


def test_folder_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = small_build(tmp_path / "m", seed=1)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert GenerationConfig.from_pretrained(folder).eos_token_id == VOCAB["<eos>"]
    ids = torch.tensor([encode("What is 1 + 2?\n")])
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_ensure_caches_by_key(tmp_path, monkeypatch):
    first = ensure_tiny_model(tmp_path, "k1", seed=0, sft_pairs=PAIRS, score_fn=never,
                              eval_prompts=[PAIRS[0][0]], max_sft_steps=2)
    monkeypatch.setattr(tiny_model, "build_tiny_model", lambda *a, **k: pytest.fail("rebuilt"))
    assert ensure_tiny_model(tmp_path, "k1") == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-k1"]  # no temp folder left


@pytest.mark.slow
def test_folder_loads_in_vllm(tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    from trainer.engines.vllm_engine import VLLMEngine

    folder = small_build(tmp_path / "m", seed=2)
    model = AutoModelForCausalLM.from_pretrained(folder)
    engine = VLLMEngine(folder, dtype="float32", seed=0, max_model_len=256, max_num_seqs=8)
    try:
        assert engine.verify(model) < 1e-3
        text = "7 - 9 =\n<answer>-2</answer>"
        assert engine.llm.get_tokenizer()(text)["input_ids"] == encode(text)
    finally:
        engine.close()


# --------------------------------------------------------------------------- warm start

INSTRUCTION = "Give only the final answer inside <answer></answer> tags."


def chain_sum(seed: int, size: int):
    rg = pytest.importorskip("reasoning_gym")
    ds = rg.create_dataset("chain_sum", min_terms=2, max_terms=3, max_digits=2, size=size, seed=seed)
    return [(f"{x['question']}\n{INSTRUCTION}\n", x["answer"]) for x in ds]


@pytest.mark.slow
def test_warm_start_lands_in_band_for_chain_sum(tmp_path):
    train, held_out = chain_sum(0, 4000), chain_sum(1, 64)
    answers = dict(held_out)

    def score(prompts, completions):
        found = [re.search(r"<answer>(.*?)</answer>", c) for c in completions]
        return [bool(m) and m.group(1).strip() == answers[p] for p, m in zip(prompts, found)]

    folder = build_tiny_model(
        tmp_path / "m", seed=0, sft_pairs=[(p, f"<answer>{a}</answer>") for p, a in train],
        score_fn=score, eval_prompts=list(answers))
    import json

    report = json.loads((folder / "warm_start.json").read_text())
    assert 0.05 <= report["pass_rate"] <= 0.60, report
    assert report["seconds"] < 120
