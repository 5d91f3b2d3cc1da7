"""One job on 2 ranks (gloo, CPU) equals one process on the same batch (issue 13).

The policy is sharded with FSDP2; each rank holds whole groups of uneven sizes and response
lengths, so the ranks run different numbers of micro-batches (zero-weight passes keep FSDP's
collectives in step) and the mini-batches' token counts and the whitening are global sums.
"""
from __future__ import annotations

import copy
import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer import distributed
from trainer.advantages import ADVANTAGES
from trainer.rollouts import Rollouts
from trainer.spec import JobSpec
from trainer.update import UpdateConfig

VOCAB, MAX_NEW = 64, 20
# (N, prompt length) per group: rank 0 gets the first 3 groups, rank 1 the last 2.
GROUPS = ((12, 9), (5, 4), (8, 14), (16, 6), (3, 11))
SPEC = {"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}},
        "algo": {"mini_batches": 2, "kl_coef": 1e-3, "advantage_whitening": "token"},
        "optim": {"grad_clip": 0.5}}


def _model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)
    return Qwen2ForCausalLM(cfg).float().train()


def _batch(groups, seed=0) -> Rollouts:
    """Groups of (N, prompt length), responses of 1..20 tokens, 0/1 rewards (never all equal)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, group, rewards = [], [], [], []
    for gi, (n, plen) in enumerate(groups):
        prompt = torch.randint(1, VOCAB, (plen,), generator=g).tolist()
        for j in range(n):
            length = int(torch.randint(1, MAX_NEW + 1, (), generator=g))
            prompts.append(prompt)
            responses.append(torch.randint(1, VOCAB, (length,), generator=g).tolist())
            group.append(gi)
            rewards.append(float(j % 2 == 0 or torch.rand((), generator=g) < 0.3))
    engine = [(-3.0 + 0.3 * torch.randn(len(r), generator=g)).tolist() for r in responses]
    return Rollouts(prompt_ids=prompts, response_ids=responses, engine_logprobs=engine,
                    group=torch.tensor(group), rewards=torch.tensor(rewards),
                    truncated=torch.tensor([len(r) == MAX_NEW for r in responses]),
                    correct=torch.tensor(rewards).bool())


def _run(policy, spec: JobSpec) -> SimpleNamespace:
    """The fields of trainer.run.Run that `trainer.step.update` reads."""
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    return SimpleNamespace(spec=spec, advantage_fn=ADVANTAGES[spec.algo.advantage],
                           micro_batch_tokens=160, compute_dtype=torch.float32,
                           update_cfg=UpdateConfig.from_spec(spec), ref=ref, nonfinite_in_row=0,
                           policy=policy, optimizer=None)


def _update(run, batch) -> dict:
    from trainer.step import update

    if run.optimizer is None:
        run.optimizer = torch.optim.AdamW(run.policy.parameters(), lr=1e-3, weight_decay=0.01)
    return update(run, batch, step=3)


def _local_batch(r: int, ws: int) -> Rollouts:
    full = _batch(GROUPS)
    mine = distributed.share(list(range(len(GROUPS))), r, ws)
    rows = torch.isin(full.group, torch.tensor(mine)).nonzero(as_tuple=True)[0]
    local = full.select(rows)
    local.group = local.group - min(mine)  # local group ids, as collect() numbers them
    return local


def _rank_main(r: int, ws: int, port: int, out: str, mode: str = "update", ckpt: str = "") -> None:
    """mode update: one update, rank 0 saves stats and weights to `out`. save: one update, a
    DCP checkpoint and the HF folder under `ckpt`, one more update, weights to `out`. load:
    resume from the DCP checkpoint `ckpt`, one update, weights to `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws),
                      LOCAL_RANK=str(r))
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    try:
        spec = JobSpec.model_validate(SPEC)
        local = _local_batch(r, ws)
        run = _run(_model(), spec)
        distributed.shard_policy(run.policy, torch.float32)
        if mode == "load":
            run.optimizer = torch.optim.AdamW(run.policy.parameters(), lr=1e-3, weight_decay=0.01)
            distributed.load_sharded(ckpt + "/dcp", run.policy, run.optimizer)
        stats = _update(run, local)
        if mode == "save":
            distributed.save_sharded(ckpt + "/dcp", run.policy, run.optimizer)
            distributed.save_consolidated(ckpt + "/hf", run.policy)
            stats = _update(run, local)
        weights = distributed.full_state_dict(run.policy)
        if r == 0:
            torch.save({"stats": stats, "weights": {k: v.detach().clone() for k, v in weights.items()}}, out)
        torch.distributed.barrier()  # leave together: a gloo peer torn down mid-exchange aborts
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, ws: int, *args) -> None:
    mp.start_processes(fn, args=(ws, free_port(), *args), nprocs=ws, start_method="spawn", join=True)


def test_share_keeps_order_and_sizes():
    items = list(range(7))
    parts = [distributed.share(items, r, 3) for r in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]] and sum(parts, []) == items


def test_two_ranks_update_equals_one_process(tmp_path):
    out = tmp_path / "rank0.pt"
    spawn(_rank_main, 2, str(out))
    got = torch.load(out, weights_only=False)

    torch.set_num_threads(1)
    run = _run(_model(), JobSpec.model_validate(SPEC))
    before = {k: v.clone() for k, v in run.policy.state_dict().items()}
    want = _update(run, _batch(GROUPS))
    assert want["mini_batch_updates"] == got["stats"]["mini_batch_updates"] == 2
    assert want["skipped_updates"] == got["stats"]["skipped_updates"] == 0
    for k in ("loss", "kl", "entropy", "grad_norm", "pg_clipfrac_high", "is_ratio_mean"):
        assert got["stats"][k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    # Adam's first steps are ~lr (1e-3) per weight whatever the gradient's size, so a gradient
    # near zero can differ by rounding in its last bits: atol 1e-5 is 1 % of one step.
    moved = 0
    for k, v in run.policy.state_dict().items():
        torch.testing.assert_close(got["weights"][k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
        moved += int(not torch.equal(v, before[k]))
    assert moved == len(before)  # the update did change every tensor: the match is not vacuous


def _assert_same_weights(got: dict, model) -> None:
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def test_two_rank_checkpoint_resumes_in_one_process_and_back(tmp_path):
    """DCP reshards: 2 ranks save -> 1 process resumes, and 1 process saves -> 2 ranks resume;
    the resumed update (which needs the restored Adam moments) matches the uninterrupted run."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    spec = JobSpec.model_validate(SPEC)
    a = tmp_path / "from2"
    spawn(_rank_main, 2, str(tmp_path / "w2.pt"), "save", str(a))
    two = torch.load(tmp_path / "w2.pt", weights_only=False)["weights"]
    hf = AutoModelForCausalLM.from_pretrained(a / "hf")  # the download folder loads in transformers
    run = _run(_model(), spec)
    run.optimizer = torch.optim.AdamW(run.policy.parameters(), lr=1e-3, weight_decay=0.01)
    distributed.load_sharded(a / "dcp", run.policy, run.optimizer)
    _assert_same_weights({k: v for k, v in hf.state_dict().items()}, run.policy)
    _update(run, _batch(GROUPS))
    _assert_same_weights(two, run.policy)

    b = tmp_path / "from1"
    run = _run(_model(), spec)
    _update(run, _batch(GROUPS))
    distributed.save_sharded(b / "dcp", run.policy, run.optimizer)
    _update(run, _batch(GROUPS))
    spawn(_rank_main, 2, str(tmp_path / "w1.pt"), "load", str(b))
    _assert_same_weights(torch.load(tmp_path / "w1.pt", weights_only=False)["weights"], run.policy)


def _collect_steps(run, p, steps=3) -> list[dict]:
    from trainer.step import collect

    out = []
    for s in range(steps):
        acc = collect(run, p, s)
        out.append({"prompts": [ids[0] for ids in acc.batch.prompt_ids], "kept": acc.kept_groups,
                    "rate": run.keep_rate_running, "cursor": run.stream.cursor})
    return out


def _collect_rank(r: int, ws: int, port: int, out: str) -> None:
    from tests.trainer.test_collect import _run as collect_run

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws))
    assert distributed.init_from_env()
    try:
        run, p = collect_run(keep=2, prompts=10)
        run.train_ids = [[i + 1] for i in range(len(run.train_ids))]  # tell the prompts apart
        mine = _collect_steps(run, p)
        every = [None] * ws
        torch.distributed.all_gather_object(every, mine)
        if r == 0:
            torch.save(every, out)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_collect_the_one_process_batch(tmp_path):
    """Dynamic sampling on 2 ranks: each generates half the prompts; the kept counts, the keep
    rate and the stream are global, so the ranks' batches joined are the one-process batch."""
    from tests.trainer.test_collect import _run as collect_run

    spawn(_collect_rank, 2, str(tmp_path / "c.pt"))
    ranks = torch.load(tmp_path / "c.pt", weights_only=False)
    run, p = collect_run(keep=2, prompts=10)
    run.train_ids = [[i + 1] for i in range(len(run.train_ids))]
    for step, want in enumerate(_collect_steps(run, p)):
        r0, r1 = ranks[0][step], ranks[1][step]
        assert r0["prompts"] and r1["prompts"]  # both ranks hold a share
        # The same samples; a rank keeps its rounds together, so the order is rank, then round.
        assert sorted(r0["prompts"] + r1["prompts"]) == sorted(want["prompts"])
        for k in ("kept", "rate", "cursor"):
            assert r0[k] == r1[k] == want[k], (step, k)
