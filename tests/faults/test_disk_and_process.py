"""The artifact dir full or read-only, and `brorl up` killed: clear failures, nothing left over.

A full disk is a real one: a tmpfs of a few pages mounted for the test (needs root or
CAP_SYS_ADMIN; skipped otherwise, with the reason, and failed in CI, which runs as root).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.helpers import REPO, wait_for
from tests.support.services import require_service

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                          capture_output=True)
    require_service("a tmpfs mount (root)", None if done.returncode == 0 else
                    f"mount -t tmpfs failed: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path) -> None:
    """Use up every free byte of the file system that holds `folder`."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def test_checkpoint_on_a_full_disk_fails_clearly_and_leaves_nothing(small_disk):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.checkpoints import io as checkpoint
    from trainer.models.tiny import build_tokenizer

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=120, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1))
    state = checkpoint.TrainerState(step=7, stage=0, data_cursor=0, ref_step=0, spec_sha256="x")
    out = small_disk / "attempt-1"
    out.mkdir()
    _fill(small_disk)
    with pytest.raises(checkpoint.CheckpointError, match="step 7: no space left on device"):
        checkpoint.save(out, state, model, build_tokenizer(), torch.optim.AdamW(model.parameters()), None)
    assert list(checkpoint.checkpoints_dir(out).iterdir()) == []  # no temp, no half folder


def test_checkpoint_into_a_read_only_dir_fails_clearly(small_disk):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.checkpoints import io as checkpoint
    from trainer.models.tiny import build_tokenizer

    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=120, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1))
    state = checkpoint.TrainerState(step=3, stage=0, data_cursor=0, ref_step=0, spec_sha256="x")
    with pytest.raises(checkpoint.CheckpointError, match="step 3: the artifact dir is not writable"):
        checkpoint.save(small_disk, state, model, build_tokenizer(),
                        torch.optim.AdamW(model.parameters()), None)


@pytest.mark.postgres
def test_archive_on_a_full_disk_records_nothing_and_removes_the_folder(stack, small_disk):
    from store import jobs
    from store.db import session_scope
    from store.tables import Checkpoint
    from tests.support.fake_trainer import write_checkpoint
    from worker.sink import DbSink

    job_id = stack.submit("fake")
    with session_scope() as s:
        attempt = jobs.claim(s, job_id, "w", 60).attempt
    folder, nbytes, digest = write_checkpoint(small_disk, 2)
    _fill(small_disk)
    with pytest.raises(OSError):
        DbSink(job_id, attempt, keep_last=2).checkpoint(2, folder, nbytes, digest)
    assert not folder.exists() and not list(folder.parent.glob(".step-*"))
    with session_scope() as s:
        assert s.query(Checkpoint).filter_by(job_id=job_id).count() == 0


def test_the_worker_dies_with_brorl_up():
    # `brorl up` spawns its children with cli.server._spawn; SIGKILL the parent, not the child.
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from cli.server import _spawn; "
         "p = _spawn(['sleep', '120']); print(p.pid, flush=True); time.sleep(120)"],
        cwd=REPO, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)

    def gone() -> bool:
        try:
            state = Path(f"/proc/{child}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        return state in ("Z", "X")
    try:
        wait_for(gone, 10, "the orphaned child to exit")
    finally:
        if not gone():
            os.kill(child, signal.SIGKILL)
