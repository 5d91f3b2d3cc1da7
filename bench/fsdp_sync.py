"""The update on 2 ranks (FSDP2, gloo, CPU) with gradients reduced after every micro-batch
(before) and once per mini-batch (now: `trainer.collectives.gradient_sync`).

Each rank holds a 12 M-parameter Qwen2 (8 layers, hidden 384), sharded with the trainer's own
`shard_policy`, and its share of a batch (4 groups x 16 samples, responses of 8..48 tokens),
and runs `trainer.step.train_on_batch` (1 mini-batch, `--micro-batch-tokens` per
micro-batch: about `--micro` micro-batches per rank). The "every" arm forces FSDP2 to sync in every backward,
which is what the update did before. Arms alternate `--repeats` times in the same processes,
so both see the same machine load; the median update seconds (rank 0's clock, both ranks
finish together) and the number of gradient reductions per update go to
docs/data/fsdp_sync.json. One torch thread per rank.

    .venv/bin/python bench/fsdp_sync.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from common import join_ranks, leave_ranks, spawn_ranks  # noqa: E402

VOCAB = 1024


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                      num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float().train()


def _batch(rank: int, ws: int):
    from trainer import collectives as distributed
    from trainer.rollouts import Rollouts

    g = torch.Generator().manual_seed(0)
    prompts, responses, group, rewards = [], [], [], []
    for gi in range(4):
        p = torch.randint(1, VOCAB, (24,), generator=g).tolist()
        for j in range(16):
            prompts.append(p)
            responses.append(torch.randint(1, VOCAB, (int(torch.randint(8, 49, (), generator=g)),), generator=g).tolist())
            group.append(gi)
            rewards.append(float(j % 2))
    full = Rollouts(prompt_ids=prompts, response_ids=responses, engine_logprobs=[[-7.0] * len(r) for r in responses],
                    group=torch.tensor(group), rewards=torch.tensor(rewards),
                    truncated=torch.zeros(len(responses), dtype=torch.bool), correct=torch.tensor(rewards).bool())
    mine = distributed.share(list(range(4)), rank, ws)
    local = full.select(torch.isin(full.group, torch.tensor(mine)).nonzero(as_tuple=True)[0])
    local.group = local.group - min(mine)
    return local


def _rank(r: int, ws: int, port: int, args: dict) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    from trainer import collectives as distributed
    from trainer.algo.advantages import ADVANTAGES
    from trainer.spec import JobSpec
    from trainer.step import train_on_batch
    from trainer.optim.update import UpdateConfig

    join_ranks(r, ws, port)
    reductions = [0]
    real_reduce = pg.foreach_reduce

    def counting(*a, **k):
        reductions[0] += 1
        return real_reduce(*a, **k)

    pg.foreach_reduce = counting
    spec = JobSpec.model_validate({"name": "b", "task": {"reasoning_gym": {"name": "chain_sum"}},
                                   "algo": {"mini_batches": 1, "kl_coef": 0}})
    policy = distributed.shard_policy(_model(), torch.float32)
    run = SimpleNamespace(spec=spec, advantage_fn=ADVANTAGES[spec.algo.advantage], ref=None, nonfinite_in_row=0,
                          micro_batch_tokens=args["micro_batch_tokens"], compute_dtype=torch.float32,
                          update_cfg=UpdateConfig.from_spec(spec), policy=policy,
                          optimizer=torch.optim.SGD(policy.parameters(), lr=0.0))
    batch = _batch(r, ws)
    real_sync = distributed.gradient_sync
    arms = {"every_micro_batch": lambda model, last: real_sync(model, True), "once_per_mini_batch": real_sync}
    out = {k: {"update_s": [], "reductions": 0} for k in arms}
    for rep in range(args["repeats"] + 1):  # the first round warms up and is dropped
        for name, fn in arms.items():
            distributed.gradient_sync = fn
            reductions[0] = 0
            distributed.barrier()
            t = time.perf_counter()
            train_on_batch(run, batch, index=0)
            distributed.barrier()
            if rep:
                out[name]["update_s"].append(time.perf_counter() - t)
            out[name]["reductions"] = reductions[0]
    if r == 0:
        res = {"model": "Qwen2 8x384 (12 M params), float32, FSDP2 over 2 gloo ranks", "threads_per_rank": 1,
               "samples": 64, "micro_batch_tokens": args["micro_batch_tokens"], "repeats": args["repeats"],
               "arms": {k: {"update_s_median": statistics.median(v["update_s"]), **v} for k, v in out.items()}}
        Path(args["out"]).write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res["arms"], indent=1))
    leave_ranks()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--micro-batch-tokens", type=int, default=768)
    ap.add_argument("--out", default=str(REPO / "docs" / "data" / "fsdp_sync.json"))
    a = ap.parse_args()
    args = {"repeats": a.repeats, "micro_batch_tokens": a.micro_batch_tokens, "out": a.out}
    spawn_ranks(_rank, args)


if __name__ == "__main__":
    main()
