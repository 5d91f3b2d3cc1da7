"""Peak memory of one weight sync on 2 ranks (FSDP2, gloo, CPU): the whole-model gather it
used to do against today's tensor-by-tensor stream.

Each rank shards a 110 M-parameter Qwen2 (float32, 12 layers, hidden 768, vocab 32000) with
the trainer's `shard_policy` and holds a bf16 whole copy standing in for its engine's weights.
A sync fills that copy from the sharded policy:
- `whole_gather` (before): `full_state_dict` (every tensor gathered, float32) then a whole
  bf16 copy of that dict, then the copy into the engine;
- `streamed` (now): `distributed.iter_full_state(model, bf16)`, each tensor cast, gathered
  alone and copied into the engine.
The peak resident set over the sync minus the resident set before it (Linux VmHWM, reset
through /proc/self/clear_refs before each arm) is the sync's extra memory; the arms alternate
`--repeats` times. The engine copies are compared to the policy afterwards. Figures:
docs/data/sync_memory.json.

    .venv/bin/python bench/sync_memory.py [--repeats 2]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from common import join_ranks, leave_ranks, spawn_ranks  # noqa: E402


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).float()


@torch.no_grad()
def _whole_gather(policy, engine: dict) -> None:
    from trainer import collectives as distributed

    state = {k: v.detach().to(torch.bfloat16) for k, v in distributed.full_state_dict(policy).items()}
    for k, v in state.items():
        engine[k].copy_(v)


@torch.no_grad()
def _streamed(policy, engine: dict) -> None:
    from trainer import collectives as distributed

    for k, v in distributed.iter_full_state(policy, torch.bfloat16):
        engine[k].copy_(v)


def _rank(r: int, ws: int, port: int, args: dict) -> None:
    from trainer import collectives as distributed

    join_ranks(r, ws, port)
    model = _model()
    params = sum(p.numel() for p in model.parameters())
    engine = {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}
    distributed.shard_policy(model, torch.float32)
    gc.collect()
    arms = {"whole_gather": _whole_gather, "streamed": _streamed}
    out = {k: [] for k in arms}
    for _ in range(args["repeats"]):
        for name, fn in arms.items():
            for v in engine.values():
                v.zero_()
            gc.collect()
            distributed.barrier()
            before = _status_kb("VmRSS")
            _reset_peak()
            fn(model, engine)
            peak = _status_kb("VmHWM")
            gc.collect()
            full = distributed.full_state_dict(model)
            assert all(torch.equal(engine[k], v.to(torch.bfloat16)) for k, v in full.items()), name
            del full
            out[name].append((peak - before) / 1024)
    every = [None] * ws
    torch.distributed.all_gather_object(every, out)
    if r == 0:
        res = {"model": f"Qwen2 12x768, {params / 1e6:.0f} M params, float32, FSDP2 over 2 gloo ranks",
               "params": params, "fp32_model_mb": params * 4 / 2**20, "bf16_model_mb": params * 2 / 2**20,
               "repeats": args["repeats"],
               "extra_peak_rss_mb_per_rank": {k: [max(e[k][i] for e in every) for i in range(args["repeats"])]
                                              for k in arms}}
        Path(args["out"]).write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res, indent=1))
    leave_ranks()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "docs" / "data" / "sync_memory.json"))
    a = ap.parse_args()
    spawn_ranks(_rank, {"repeats": a.repeats, "out": a.out})


if __name__ == "__main__":
    main()
