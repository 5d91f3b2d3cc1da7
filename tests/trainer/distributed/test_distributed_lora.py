"""A LoRA policy on 2 ranks (gloo, CPU) equals one process on the same batch, and its
checkpoint resumes on another rank count.

The base is replicated, not sharded: each rank holds the whole frozen base and the same
adapter (rank 0's), runs its own share of the batch (its own number of micro-batches, with
the shared-prefix forward), and the adapter's gradients are SUM all-reduced once per
mini-batch (trainer/collectives.py). The KL reference is the base with the adapter off.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from tests.trainer.distributed.test_distributed import GROUPS, SPEC, _batch, _local_batch, _model, spawn
from trainer.algo.advantages import ADVANTAGES
from trainer import collectives as distributed
from trainer.models.lora import AdapterReference, adapter_state, apply_lora, load_adapter, trainable_parameters
from trainer.optim.update import UpdateConfig
from trainer.spec import JobSpec, LoraSpec

STATS = ("loss", "kl", "entropy", "grad_norm", "pg_clipfrac_high", "is_ratio_mean")


def _lora(init_seed: int = 1):
    """The test's Qwen2 with a rank-4 adapter whose A is drawn from `init_seed`; B is then set
    to small seeded values, so that the adapter changes the logits from the first mini-batch
    (A and B both get gradients) while the reference stays the base (the adapter off)."""
    policy = _model()
    torch.manual_seed(init_seed)
    policy = apply_lora(policy, LoraSpec(rank=4, alpha=8))
    ref = AdapterReference(policy)  # B == 0 here: the reference is the base
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return policy.train(), ref


def _run(policy, ref) -> SimpleNamespace:
    """The fields of trainer.run.Run that `trainer.step.train_on_batch` reads."""
    spec = JobSpec.model_validate(SPEC)
    return SimpleNamespace(spec=spec, advantage_fn=ADVANTAGES[spec.algo.advantage], micro_batch_tokens=160,
                           compute_dtype=torch.float32, update_cfg=UpdateConfig.from_spec(spec), ref=ref,
                           nonfinite_in_row=0, policy=policy,
                           optimizer=torch.optim.AdamW(trainable_parameters(policy), lr=1e-3, weight_decay=0.01))


def _update(run, batch) -> dict:
    from trainer.step import train_on_batch

    return train_on_batch(run, batch, index=3)


def _adapter(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in adapter_state(policy).items()}


def _save(run, out_dir, step: int):
    """A LoRA checkpoint through the trainer's own writer (rank 0 writes it on ranks)."""
    from trainer.checkpoints import io as checkpoint
    from trainer.models.tiny import build_tokenizer

    state = checkpoint.TrainerState(step=step, stage=0, data_cursor=0, ref_step=0, spec_sha256="x")
    return checkpoint.save(out_dir, state, run.policy, build_tokenizer(), run.optimizer, run.ref).path


def _resume(folder):
    """A fresh policy resumed from `folder` as trainer.run.build_run resumes a LoRA job: the
    adapter from PEFT's files, AdamW state and reference from trainer_state/."""
    from trainer.checkpoints import io as checkpoint

    policy, ref = _lora(init_seed=99)  # another start: everything must come from the folder
    load_adapter(policy, folder)
    run = _run(policy, ref)
    checkpoint.load_state(folder, run.optimizer, ref, policy)
    return run


def _rank_main(r: int, ws: int, port: int, out: str, mode: str = "update", ckpt: str = "") -> None:
    """mode update: one update; rank 0 saves the start, stats, both ranks' adapters and AdamW
    moments to `out`. save: one update, a checkpoint under `ckpt`, one more update. load:
    resume from the checkpoint folder `ckpt`, one update."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws),
                      LOCAL_RANK=str(r))
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    try:
        local = _local_batch(r, ws)
        if mode == "load":
            run = _resume(ckpt)
        else:
            # Rank 1 draws another A: the adapter every rank trains is rank 0's, as build_run makes it.
            policy, ref = _lora(init_seed=1 + r)
            distributed.replicate_from_rank0(trainable_parameters(policy))
            run = _run(policy, ref)
        start = _adapter(run.policy)
        stats = _update(run, local)
        path = None
        if mode == "save":
            path = str(_save(run, ckpt, step=1))
            stats = _update(run, local)
        moments = [s["exp_avg"].clone() for s in run.optimizer.state.values()]
        every = [None] * ws
        torch.distributed.all_gather_object(every, {"adapter": _adapter(run.policy), "moments": moments})
        if r == 0:
            torch.save({"stats": stats, "start": start, "ranks": every, "path": path}, out)
        torch.distributed.barrier()  # leave together: a gloo peer torn down mid-exchange aborts
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)  # as trainer.distributed.rank_main: skip the interpreter teardown (see test_distributed)


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_same_adapter(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.integration  # two gloo ranks, each its own process: 30-80 s on 2 cores
def test_two_ranks_lora_update_equals_one_process(tmp_path):
    out = tmp_path / "rank0.pt"
    spawn(_rank_main, 2, str(out))
    got = torch.load(out, weights_only=False)
    r0, r1 = got["ranks"]
    # Replicated: both ranks hold the same adapter and AdamW state, bit for bit.
    assert all(torch.equal(r0["adapter"][k], r1["adapter"][k]) for k in r0["adapter"])
    assert all(torch.equal(a, b) for a, b in zip(r0["moments"], r1["moments"]))

    torch.set_num_threads(1)
    policy, ref = _lora()
    run = _run(policy, ref)
    before = _adapter(policy)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    assert all(torch.equal(got["start"][k], before[k]) for k in before)  # rank 0's start, replicated
    want = _update(run, _batch(GROUPS))
    assert want["mini_batch_updates"] == got["stats"]["mini_batch_updates"] == 2
    assert want["skipped_updates"] == got["stats"]["skipped_updates"] == 0
    assert want["kl"] > 0  # the reference (the base) differs from the policy
    for k in STATS:
        assert got["stats"][k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    after = _adapter(policy)
    _assert_same_adapter(r0["adapter"], after)
    # The update moved every adapter tensor (A and B): the match is not vacuous; the base stayed.
    assert all(not torch.equal(after[k], before[k]) for k in before)
    assert _max_diff(after, before) > 100 * _max_diff(r0["adapter"], after)
    assert all(torch.equal(p, base[n]) for n, p in policy.named_parameters() if not p.requires_grad)


@pytest.mark.integration  # three spawns of two gloo ranks: 1.5-4 min on 2 cores
def test_lora_checkpoint_of_two_ranks_resumes_in_one_process_and_back(tmp_path):
    """2 ranks save -> 1 process resumes, and 1 process saves -> 2 ranks resume; the resumed
    update (which needs the restored AdamW moments) matches the uninterrupted run."""
    torch.set_num_threads(1)
    spawn(_rank_main, 2, str(tmp_path / "w2.pt"), "save", str(tmp_path / "from2"))
    two = torch.load(tmp_path / "w2.pt", weights_only=False)
    folder = two["path"]
    names = {p.name for p in os.scandir(folder)}
    assert {"adapter_config.json", "adapter_model.safetensors", "merged", "trainer_state"} <= names
    assert "model.safetensors" not in names
    state = {p.name for p in os.scandir(os.path.join(folder, "trainer_state"))}
    assert "optimizer.pt" in state and "dcp" not in state  # replicated: the one-process format
    run = _resume(folder)
    _update(run, _batch(GROUPS))
    _assert_same_adapter(two["ranks"][0]["adapter"], _adapter(run.policy))

    policy, ref = _lora()
    run = _run(policy, ref)
    _update(run, _batch(GROUPS))
    saved = _save(run, tmp_path / "from1", step=1)
    _update(run, _batch(GROUPS))
    spawn(_rank_main, 2, str(tmp_path / "w1.pt"), "load", str(saved))
    one = torch.load(tmp_path / "w1.pt", weights_only=False)
    _assert_same_adapter(one["ranks"][0]["adapter"], _adapter(run.policy))
    _assert_same_adapter(one["ranks"][1]["adapter"], _adapter(run.policy))
