"""Checkpoint listing and download: a cached tar.gz of the HF folder, ETag / 304, scoping."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from pathlib import Path

import pytest

from store import jobs as store_jobs
from store.artifacts import checkpoint_dir
from store.db import session_scope

from trainer.checkpoints import format as ckpt_format

from tests.api.helpers import assert_error, make_spec

@pytest.fixture(scope="session")
def trainer_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint folder written by `trainer.checkpoints.io.save` (a small Qwen2 + tokenizer)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.checkpoints import io as checkpoint
    from trainer.models.tiny import build_tokenizer

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=120, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, tie_word_embeddings=True))
    state = checkpoint.TrainerState(step=2, stage=0, data_cursor=4, ref_step=0, spec_sha256="x")
    out = tmp_path_factory.mktemp("trainer-out")
    return checkpoint.save(out, state, model, build_tokenizer(),
                           torch.optim.AdamW(model.parameters()), None).path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _record(database_url, job_id: str, attempt: int, folder: Path, step: int) -> None:
    """What the worker's sink does: build the archive once, then record the row."""
    ckpt_format.build_archive(folder)
    nbytes, digest = ckpt_format.digest(folder)
    with session_scope(database_url) as s:
        store_jobs.record_checkpoint(s, job_id, attempt, step, str(folder), nbytes, digest)


@pytest.fixture
def job_with_checkpoint(client, auth, settings, database_url, trainer_checkpoint):
    """(job id, checkpoint folder): a running job whose step-2 checkpoint is registered."""
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60)
    folder = checkpoint_dir(settings, job_id, claim.attempt, 2)
    shutil.copytree(trainer_checkpoint, folder)
    _record(database_url, job_id, claim.attempt, folder, 2)
    return job_id, folder


def _extract(data: bytes, into: Path) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
    return {p.relative_to(into).as_posix(): p.read_bytes()
            for p in sorted(into.rglob("*")) if p.is_file()}


def test_list_checkpoints(client, auth, job_with_checkpoint):
    job_id, folder = job_with_checkpoint
    listing = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=auth).json()
    assert listing["object"] == "list" and len(listing["data"]) == 1
    ckpt = listing["data"][0]
    assert (ckpt["step"], ckpt["bytes"]) == (2, sum(len(v) for v in _files(folder).values()))
    assert ckpt["sha256"] == ckpt_format.digest(folder)[1] and "uri" not in ckpt
    assert ckpt["download_url"] == f"/v1/jobs/{job_id}/checkpoints/2/download"


def test_download_is_a_tar_gz_of_the_folder(client, auth, job_with_checkpoint, tmp_path):
    job_id, folder = job_with_checkpoint
    url = f"/v1/jobs/{job_id}/checkpoints/2/download"
    resp = client.get(url, headers=auth)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/gzip"
    sha = hashlib.sha256(resp.content).hexdigest()
    assert resp.headers["X-Checksum-Sha256"] == sha
    assert resp.headers["ETag"] == f'"{sha}"'
    assert int(resp.headers["Content-Length"]) == len(resp.content)
    assert "attachment" in resp.headers["content-disposition"]
    assert _extract(resp.content, tmp_path / "out") == _files(folder)
    ckpt_format.verify(tmp_path / "out")  # what a user extracts is a complete checkpoint
    # Built once when recorded, beside the folder: a second download is byte-identical.
    assert folder.with_name(folder.name + ".tar.gz").is_file()
    assert client.get(url, headers=auth).content == resp.content

    not_modified = client.get(url, headers={**auth, "If-None-Match": f'"{sha}"'})
    assert not_modified.status_code == 304 and not_modified.content == b""
    assert not_modified.headers["ETag"] == f'"{sha}"'
    stale = client.get(url, headers={**auth, "If-None-Match": '"0000"'})
    assert stale.status_code == 200 and stale.content == resp.content


def test_archives_are_deterministic(client, auth, job_with_checkpoint):
    # A checkpoint recorded without its archive (older versions) gets the same bytes and ETag.
    job_id, folder = job_with_checkpoint
    url = f"/v1/jobs/{job_id}/checkpoints/2/download"
    first = client.get(url, headers=auth).content
    for suffix in (".tar.gz", ".tar.gz.sha256"):
        folder.with_name(folder.name + suffix).unlink()
    assert client.get(url, headers=auth).content == first


def test_vanished_folder_is_410(client, auth, job_with_checkpoint):
    job_id, folder = job_with_checkpoint
    shutil.rmtree(folder)
    err = assert_error(client.get(f"/v1/jobs/{job_id}/checkpoints/2/download", headers=auth),
                       410, "gone")
    assert "no longer on disk" in err["message"]


def test_unknown_step_and_other_tenant_are_404(client, auth, other_auth, job_with_checkpoint):
    job_id, _ = job_with_checkpoint
    url = f"/v1/jobs/{job_id}/checkpoints/2/download"
    assert_error(client.get(url, headers=other_auth), 404, "not_found")
    assert_error(client.get(url.replace("/2/", "/3/"), headers=auth), 404, "not_found")
    assert_error(client.get(url.replace(job_id, "job_unknown"), headers=auth), 404)
    assert_error(client.get(url.replace("/2/", "/two/"), headers=auth), 422, field="path.step")
    assert client.get(f"/v1/jobs/{job_id}/checkpoints", headers=other_auth).status_code == 404


def test_bounded_step_and_paginated_list(client, auth, settings, database_url,
                                         job_with_checkpoint, trainer_checkpoint):
    job_id, folder = job_with_checkpoint
    for huge in (2**31, 2**63, 10**30):
        assert_error(client.get(f"/v1/jobs/{job_id}/checkpoints/{huge}/download", headers=auth),
                     422, field="path.step")
    assert_error(client.get(f"/v1/jobs/{job_id}/checkpoints?after={2**63}", headers=auth), 422)
    for step in (4, 6):
        other = folder.with_name(ckpt_format.folder_name(step))
        shutil.copytree(trainer_checkpoint, other)
        _record(database_url, job_id, 1, other, step)
    url = f"/v1/jobs/{job_id}/checkpoints"
    page = client.get(url, params={"limit": 2}, headers=auth).json()
    assert [c["step"] for c in page["data"]] == [2, 4] and page["has_more"] is True
    page = client.get(url, params={"limit": 2, "after": 4}, headers=auth).json()
    assert [c["step"] for c in page["data"]] == [6] and page["has_more"] is False


def test_checkpoint_event_has_no_server_path(client, auth, job_with_checkpoint):
    job_id, folder = job_with_checkpoint
    events = client.get(f"/v1/jobs/{job_id}/events", headers=auth).json()["data"]
    (saved,) = [e for e in events if e["type"] == "checkpoint_saved"]
    assert saved["data"]["step"] == 2 and str(folder.parent) not in str(saved)


@pytest.fixture(scope="session")
def lora_checkpoint(tmp_path_factory) -> Path:
    """A LoRA checkpoint written by `trainer.checkpoints.io.save` (peft adapter + merged/)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.checkpoints import io as checkpoint
    from trainer.models.lora import apply_lora
    from trainer.models.tiny import build_tokenizer
    from trainer.spec import LoraSpec

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(vocab_size=120, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, tie_word_embeddings=True))
    model = apply_lora(base, LoraSpec(rank=2))
    state = checkpoint.TrainerState(step=2, stage=0, data_cursor=4, ref_step=0, spec_sha256="x")
    out = tmp_path_factory.mktemp("lora-out")
    return checkpoint.save(out, state, model, build_tokenizer(),
                           torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]), None).path


def test_lora_checkpoint_downloads_as_adapter_or_merged(client, auth, settings, database_url,
                                                        lora_checkpoint, tmp_path):
    from peft import PeftConfig
    from transformers import AutoModelForCausalLM

    job_id = client.post("/v1/jobs", json=make_spec(model={"lora": {"rank": 2}}), headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60)
    folder = checkpoint_dir(settings, job_id, claim.attempt, 2)
    shutil.copytree(lora_checkpoint, folder)
    _record(database_url, job_id, claim.attempt, folder, 2)
    ckpt = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=auth).json()["data"][0]
    assert ckpt["kind"] == "lora"
    assert ckpt["merged_download_url"] == ckpt["download_url"] + "?variant=merged"

    adapter = _extract(client.get(ckpt["download_url"], headers=auth).content, tmp_path / "a")
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state/optimizer.pt"} <= set(adapter)
    assert not any(name.startswith("merged/") for name in adapter) and "model.safetensors" not in adapter
    ckpt_format.verify(tmp_path / "a")  # its manifest covers exactly what it holds
    assert PeftConfig.from_pretrained(tmp_path / "a").r == 2
    explicit = client.get(ckpt["download_url"] + "?variant=adapter", headers=auth).content
    assert _extract(explicit, tmp_path / "a2") == adapter

    resp = client.get(ckpt["merged_download_url"], headers=auth)
    assert resp.status_code == 200 and "merged" in resp.headers["content-disposition"]
    assert resp.headers["X-Checksum-Sha256"] == hashlib.sha256(resp.content).hexdigest()
    merged = _extract(resp.content, tmp_path / "m")
    assert {"config.json", "model.safetensors", "manifest.json"} <= set(merged)
    ckpt_format.verify(tmp_path / "m")
    AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    ckpt_format.remove(folder)  # both archives go with the folder
    assert not list(folder.parent.glob(folder.name + "*"))


def test_full_checkpoint_has_no_adapter_variant(client, auth, job_with_checkpoint):
    job_id, _ = job_with_checkpoint
    ckpt = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=auth).json()["data"][0]
    assert ckpt["kind"] == "full" and ckpt["merged_download_url"] is None
    url = f"/v1/jobs/{job_id}/checkpoints/2/download"
    assert_error(client.get(url + "?variant=adapter", headers=auth), 422, field="variant")
    assert client.get(url + "?variant=merged", headers=auth).content == client.get(url, headers=auth).content
