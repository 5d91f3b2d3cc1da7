"""Checkpoint listing and download: a cached tar.gz of the HF folder, ETag / 304, scoping."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from pathlib import Path

import pytest

from store import jobs as store_jobs
from store.artifacts import checkpoint_dir, folder_digest
from store.db import session_scope

from tests.api.helpers import assert_error, make_spec

FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model.safetensors": bytes(range(256)) * 400,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}


def _fake_hf_folder(folder: Path) -> Path:
    for rel, data in FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


@pytest.fixture
def job_with_checkpoint(client, auth, settings, database_url):
    """(job id, checkpoint folder): a running job whose step-2 checkpoint is registered."""
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    folder = _fake_hf_folder(checkpoint_dir(settings, job_id, 2))
    nbytes, sha = folder_digest(folder)
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60)
    with session_scope(database_url) as s:
        store_jobs.record_checkpoint(s, job_id, claim.attempt, 2, str(folder), nbytes, sha)
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
    assert ckpt["step"] == 2 and ckpt["bytes"] == sum(len(v) for v in FILES.values())
    assert ckpt["sha256"] == folder_digest(folder)[1] and "uri" not in ckpt
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
    assert _extract(resp.content, tmp_path / "out") == FILES
    # Cached beside the folder, built once: a second download is byte-identical.
    assert folder.with_name(folder.name + ".tar.gz").is_file()
    assert client.get(url, headers=auth).content == resp.content

    not_modified = client.get(url, headers={**auth, "If-None-Match": f'"{sha}"'})
    assert not_modified.status_code == 304 and not_modified.content == b""
    assert not_modified.headers["ETag"] == f'"{sha}"'
    stale = client.get(url, headers={**auth, "If-None-Match": '"0000"'})
    assert stale.status_code == 200 and stale.content == resp.content


def test_archives_are_deterministic(client, auth, job_with_checkpoint):
    # Two replicas racing to build the cache must produce the same bytes (and ETag).
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
