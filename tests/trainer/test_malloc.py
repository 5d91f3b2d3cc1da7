"""glibc's malloc per run (`BRORL_MALLOC`): freed tensors leave the RSS, and the trim runs at
the step's phase boundaries."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainer
from trainer import malloc
from trainer.malloc import configure_malloc, fix_mmap_threshold, release_freed
from trainer.settings import trainer_settings

ROOT = str(Path(trainer.__file__).parents[1])
# A 16 MiB tensor freed (glibc's moving threshold rises to 16 MiB), then 32 tensors of 2 MiB
# alive at once with small live blocks between them, then freed: from the heap they stay
# resident (the small blocks pin it) until a trim; each in its own mapping, they leave the RSS.
PROBE = """
import os, sys, torch
sys.path.insert(0, {root!r})
from trainer.malloc import configure_malloc, release_freed
configure_malloc({mode!r})
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
x = torch.ones(4 * 2**20)
del x
base = rss()
big, keep = [], []
for i in range(32):
    big.append(torch.ones(2**19))
    keep.append(torch.ones(1000))
del big
release_freed()
print(rss() - base)
"""
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def _grown(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=ROOT, mode=mode)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@linux
def test_trim_and_fixed_threshold_return_freed_blocks_and_default_keeps_them():
    assert _grown("trim") < 4.0 < 32.0 < _grown("default")
    assert _grown("mmap_threshold") < 4.0


@pytest.fixture
def restore_mode():
    yield
    malloc._mode = "default"


def test_the_setting_picks_the_mode(restore_mode):
    assert trainer_settings({}).malloc == "default"
    assert trainer_settings({"BRORL_MALLOC": "mmap_threshold"}).malloc == "mmap_threshold"
    with pytest.raises(ValueError, match="BRORL_MALLOC"):
        trainer_settings({"BRORL_MALLOC": "jemalloc"})
    with pytest.raises(ValueError, match="choose one of"):
        configure_malloc("jemalloc")


def test_only_the_trim_mode_trims(monkeypatch, restore_mode):
    trims = []

    class Libc:
        def malloc_trim(self, pad):
            trims.append(pad)
            return 1

    monkeypatch.setattr(malloc, "_libc", lambda: Libc())
    for mode in ("default", "mmap_threshold"):
        monkeypatch.setattr(malloc, "fix_mmap_threshold", lambda: True)
        configure_malloc(mode)
        assert release_freed() is False
    configure_malloc("trim")
    assert release_freed() is True
    assert trims == [0]


def test_explicit_environment_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert fix_mmap_threshold() is False


def test_a_step_trims_after_generation_and_after_the_update(tmp_path, monkeypatch):
    """One real step on a random tiny model: the trim runs once generation and scoring are
    done and once the update (with its optimizer step) is done, in that order."""
    import trainer.step as step_mod
    from tests.support.tinyprebuild import shared_task
    from trainer.models.tiny import build_tiny_model
    from trainer.run import build_run
    from trainer.spec import JobSpec

    model_dir = build_tiny_model(tmp_path / "model", seed=0, sft_pairs=[], score_fn=None, holdout_prompts=[])
    spec = JobSpec.model_validate({
        "name": "malloc-step", "task": shared_task(), "model": {"path": str(model_dir)},
        "rollout": {"engine": "hf", "max_new_tokens": 6, "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 1}]},
        "algo": {"dynamic_sampling": False, "kl_coef": 0.0}, "eval": {"every": 0}, "checkpoint": {"every": 0}})
    events = []

    def recorded(name, fn):
        def inner(*a, **k):
            out = fn(*a, **k)
            events.append(name)
            return out
        return inner

    monkeypatch.setattr(step_mod, "collect", recorded("generated", step_mod.collect))
    monkeypatch.setattr(step_mod, "train_on_batch", recorded("updated", step_mod.train_on_batch))
    monkeypatch.setattr(step_mod, "release_freed", recorded("trim", step_mod.release_freed))
    monkeypatch.setenv("BRORL_MALLOC", "trim")
    run = build_run(spec, tmp_path / "out", None, None)
    try:
        step_mod.run_step(run, run.plans[0], 0)
        mode = malloc._mode
    finally:
        run.close()
        malloc._mode = "default"
    # One process: the HF engine generates with the policy itself, so no sync copy and no third trim.
    assert events == ["generated", "trim", "updated", "trim"]
    assert mode == "trim"  # build_run applied the setting
