"""One job on 2 ranks (gloo, CPU) equals one process on the same batch.

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

from trainer import collectives as distributed
from trainer.algo.advantages import ADVANTAGES
from trainer.rollouts import Generation, Rollouts
from trainer.spec import JobSpec
from trainer.optim.update import UpdateConfig

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


def _with_env_tokens(batch: Rollouts) -> Rollouts:
    """The batch as multi-turn samples: response tokens 2..4 written by an environment (mask 0)."""
    batch.loss_mask = [[0 if 2 <= t < 5 else 1 for t in range(len(r))] for r in batch.response_ids]
    return batch


def _run(policy, spec: JobSpec) -> SimpleNamespace:
    """The fields of trainer.run.Run that `trainer.step.train_on_batch` reads."""
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    return SimpleNamespace(spec=spec, advantage_fn=ADVANTAGES[spec.algo.advantage],
                           micro_batch_tokens=160, compute_dtype=torch.float32,
                           update_cfg=UpdateConfig.from_spec(spec), ref=ref, nonfinite_in_row=0,
                           policy=policy, optimizer=None)


def _update(run, batch) -> dict:
    from trainer.step import train_on_batch

    if run.optimizer is None:
        run.optimizer = torch.optim.AdamW(run.policy.parameters(), lr=1e-3, weight_decay=0.01)
    return train_on_batch(run, batch, index=3)


def _local_batch(r: int, ws: int, masked: bool = False) -> Rollouts:
    full = _with_env_tokens(_batch(GROUPS)) if masked else _batch(GROUPS)
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
        local = _local_batch(r, ws, masked=mode == "masked")
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
    # As trainer.distributed.rank_main: skip interpreter teardown, where a thread left by gloo or DCP can
    # abort the process (SIGABRT, "terminate called without an active exception"; 1 run in ~10).
    os._exit(0)


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


@pytest.mark.integration  # two gloo ranks, each its own process: 30-80 s on 2 cores
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


@pytest.mark.integration  # two gloo ranks, as above
def test_two_ranks_honour_the_loss_mask_as_one_process_does(tmp_path):
    """Multi-turn samples (environment tokens masked) on 2 ranks: the same statistics and
    weights as one process on the whole masked batch, and not those of the unmasked batch (the
    token totals all-reduced over the ranks count the model's tokens only)."""
    out = tmp_path / "rank0.pt"
    spawn(_rank_main, 2, str(out), "masked")
    got = torch.load(out, weights_only=False)

    torch.set_num_threads(1)
    run = _run(_model(), JobSpec.model_validate(SPEC))
    want = _update(run, _with_env_tokens(_batch(GROUPS)))
    unmasked = _update(_run(_model(), JobSpec.model_validate(SPEC)), _batch(GROUPS))
    for k in ("loss", "kl", "entropy", "grad_norm", "is_ratio_mean"):
        assert got["stats"][k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    assert got["stats"]["n_tokens"] == want["n_tokens"] < unmasked["n_tokens"]  # model tokens, summed over ranks
    assert got["stats"]["loss"] != pytest.approx(unmasked["loss"], rel=1e-2)
    _assert_same_weights(got["weights"], run.policy)


def _assert_same_weights(got: dict, model) -> None:
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.integration  # two gloo ranks, each its own process: 30-80 s on 2 cores
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
    from tests.trainer.rollouts.test_collect import _run as collect_run

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
    os._exit(0)  # see _rank_main


@pytest.mark.integration  # two gloo ranks, each its own process: 30-80 s on 2 cores
def test_two_ranks_collect_the_one_process_batch(tmp_path):
    """Dynamic sampling on 2 ranks: each generates half the prompts; the kept counts, the keep
    rate and the stream are global, so the ranks' batches joined are the one-process batch."""
    from tests.trainer.rollouts.test_collect import _run as collect_run

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


# --------------------------------------------------------------- N = 512, dynamic sampling, refills


class _WideEngine:
    """n samples per prompt of 1..20 tokens; the first token (1 or 2) says right or wrong."""

    def generate(self, prompts, sampling):
        ids = [[1 + j % 2] + [(j * 13 + k + p[0]) % 60 + 3 for k in range((j * 7 + p[0]) % 20)]
               for p in prompts for j in range(sampling.n)]
        return Generation(prompt_index=[i for i in range(len(prompts)) for _ in range(sampling.n)],
                          token_ids=ids, finished=[True] * len(ids),
                          # near the untrained model's -log(64) per token: inside the IS truncation band
                          logprobs=[[-4.1 - 0.02 * (k % 7) for k in range(len(t))] for t in ids])


def _wide_run(policy):
    from trainer.prompt_stream import PromptStream
    from trainer.algo.schedule import plan

    spec = JobSpec.model_validate({
        **SPEC, "task": {"dataset": {"id": "ds_x"}},
        "rollout": {"schedule": [{"n": 512, "prompts_per_step": 6, "steps": 2}]},
        "algo": {**SPEC["algo"], "max_refill_rounds": 4, "max_oversample": 1.0}})
    train = list(range(1000))
    # Example e is informative (half right) when e % 3 == 0, else all wrong: ~1/3 kept, refills,
    # and both ranks keep groups in the first two rounds, so the one-process order (round, then
    # rank) differs from each rank's own (rank, then round).
    scorer = SimpleNamespace(score=lambda texts, exs, tr: SimpleNamespace(
        correct=[e % 3 == 0 and t == "1" for t, e in zip(texts, exs)],
        rewards=[float(e % 3 == 0 and t == "1") for t, e in zip(texts, exs)]))
    tok = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [str(i[0]) for i in ids])
    run = _run(policy, spec)
    run.__dict__.update(stream=PromptStream(range(len(train)), 0, 0), engine=_WideEngine(), tokenizer=tok,
                        task=SimpleNamespace(train=train), scorer=scorer,
                        train_ids=[[e % 50 + 3, 7] for e in train], keep_rate_running=1.0, keep_rounds_seen=0,
                        difficulty=None,
                        micro_batch_tokens=4096)
    return run, plan(spec)[0]


def _wide_step(run, p) -> dict:
    from trainer.step import collect, train_on_batch

    acc = collect(run, p, 0)
    # SGD: the weights move by the (clipped) gradient itself; Adam's first step is ~lr * sign(g),
    # which turns rounding noise in a near-zero gradient into a whole step.
    run.optimizer = torch.optim.SGD(run.policy.parameters(), lr=0.1)
    stats = train_on_batch(run, acc.batch, 0, acc.positions)
    # On ranks: does this rank's part sit elsewhere than "rank 0's samples, then rank 1's"?
    sizes = distributed.all_gather_int(len(acc.batch))
    own = torch.arange(sum(sizes[:distributed.rank()]), sum(sizes[:distributed.rank() + 1]))
    moved = acc.positions is not None and not torch.equal(acc.positions, own)
    return {"stats": stats, "rounds": acc.rounds, "kept": acc.kept_groups, "moved": moved}


def _wide_rank(r: int, ws: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws))
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    try:
        run, p = _wide_run(_model())
        distributed.shard_policy(run.policy, torch.float32)
        got = _wide_step(run, p)
        weights = distributed.full_state_dict(run.policy)
        if r == 0:
            torch.save({**got, "weights": {k: v.detach().clone() for k, v in weights.items()}}, out)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)  # see _rank_main


@pytest.mark.integration  # two gloo ranks, each its own process: 30-80 s on 2 cores
def test_n512_step_with_refills_on_two_ranks_equals_one_process(tmp_path):
    """The whole step's learning part at N = 512: dynamic sampling refills over several rounds
    (each rank keeps its own groups), responses of 1..20 tokens: the update, its statistics and
    the weights match (measured: loss to 8e-10, weights to 5e-9; without the one-process order
    of the mini-batches the loss differed by 1.2e-4 and the weights by 2.2e-4)."""
    spawn(_wide_rank, 2, str(tmp_path / "w.pt"))
    got = torch.load(tmp_path / "w.pt", weights_only=False)
    torch.set_num_threads(1)
    run, p = _wide_run(_model())
    want = _wide_step(run, p)
    assert want["rounds"] >= 1 and want["kept"] == got["kept"] >= 4  # refilled over rounds
    assert got["moved"]  # the reordering this test is about did happen
    for k in ("loss", "kl", "entropy", "grad_norm", "is_ratio_mean"):
        assert got["stats"][k] == pytest.approx(want["stats"][k], rel=1e-4, abs=1e-6), k
    _assert_same_weights(got["weights"], run.policy)


def test_mini_batches_follow_the_one_process_order_after_refills(monkeypatch):
    """Rank 0 keeps 3 then 2 samples over two rounds, rank 1 keeps 4 then 1: one process holds
    them as r0 round 0, r1 round 0, r0 round 1, r1 round 1. Each rank's part of each mini-batch
    is exactly the one-process mini-batch's samples it holds, in the same order."""
    from trainer import step

    rounds = {0: [3, 2], 1: [4, 1]}
    want = step.split_mini_batches(10, 3, torch.Generator().manual_seed(5))
    seen = [[] for _ in want]
    for r in (0, 1):
        gathered = iter([[3, 4], [2, 1], [5, 5]])  # what all_gather_int returns, call by call
        monkeypatch.setattr(distributed, "active", lambda: True)
        monkeypatch.setattr(distributed, "rank", lambda r=r: r)
        monkeypatch.setattr(distributed, "all_gather_int", lambda n: next(gathered))
        pos = step.one_process_positions(rounds[r])
        assert pos.tolist() == ([0, 1, 2, 7, 8] if r == 0 else [3, 4, 5, 6, 9])
        parts = step.local_mini_batches(5, 3, torch.Generator().manual_seed(5), pos)
        for i, local in enumerate(parts):
            mine = pos[local].tolist()
            assert mine == [p for p in want[i].tolist() if p in set(pos.tolist())]
            seen[i] += mine
    assert [sorted(s) for s in seen] == [sorted(c.tolist()) for c in want]


def _count_reductions_rank(r: int, ws: int, port: int, out: str) -> None:
    """One update (2 mini-batches of several micro-batches each) counting FSDP2's gradient
    reductions (one `foreach_reduce` per sharded unit and reduce-scatter)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws),
                      LOCAL_RANK=str(r))
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    calls = {"reduce": 0, "backward": 0}
    real_reduce = pg.foreach_reduce

    def counting_reduce(*args, **kwargs):
        calls["reduce"] += 1
        return real_reduce(*args, **kwargs)

    pg.foreach_reduce = counting_reduce
    try:
        run = _run(_model(), JobSpec.model_validate(SPEC))
        distributed.shard_policy(run.policy, torch.float32)
        units = sum(1 for m in run.policy.modules() if distributed.is_sharded(m))
        real_backward = torch.autograd.backward

        def counting_backward(*args, **kwargs):
            calls["backward"] += 1
            return real_backward(*args, **kwargs)

        torch.autograd.backward = counting_backward
        stats = _update(run, _local_batch(r, ws))
        every = [None] * ws
        torch.distributed.all_gather_object(every, {**calls, "units": units, "updates": stats["mini_batch_updates"]})
        if r == 0:
            torch.save(every, out)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)  # see _rank_main


@pytest.mark.integration  # two gloo ranks, each its own process
def test_gradients_reduce_once_per_mini_batch(tmp_path):
    """FSDP2 reduce-scatters each unit's gradient in the mini-batch's last backward only, not
    after every micro-batch (the update itself still equals one process: the test above)."""
    spawn(_count_reductions_rank, 2, str(tmp_path / "calls.pt"))
    for c in torch.load(tmp_path / "calls.pt", weights_only=False):
        assert c["updates"] == 2 and c["backward"] >= 2 * c["updates"], c  # micro-batches: 2+ each
        assert c["reduce"] == c["units"] * c["updates"], c
