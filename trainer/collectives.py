"""One job on many ranks: torch.distributed plumbing for the update (docs/many-gpus.md).

Started by torchrun (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT in the environment):
gloo on a CPU, nccl on CUDA. Every helper here is the identity in a single process, so the
one-process path runs the same code.

What makes N ranks equal one process on the same batch (tests/trainer/distributed/test_distributed.py):
- each rank holds whole groups (group-mean advantages stay local and exact);
- whatever spans the batch is a SUM all-reduced over ranks: advantage whitening's moments,
  each mini-batch's valid-token count (the loss denominator), the statistics;
- the policy is sharded with FSDP2 `fully_shard`, whose reduce-scatter SUMS the gradients
  (divide factor 1): each rank's loss is already its token sum over the GLOBAL token count;
- FSDP all-gathers a layer's weights at every forward, so every rank must run the same
  number of forwards: a rank with fewer micro-batches runs zero-weight `dummy_pass`es;
- gradients are reduce-scattered once per mini-batch, in every rank's last backward
  (`gradient_sync`), not after each micro-batch.
A LoRA job (`model.lora`) is not sharded: every rank holds the whole frozen base and the same
adapter (`replicate_from_rank0` at the start), and the adapter's gradients are SUM all-reduced
once per mini-batch, after every rank's last backward (`all_reduce_replicated_grads`): the
same sum over ranks as FSDP's reduce-scatter above, so AdamW sees the one-process gradient and
its state stays identical on every rank. No collective runs per forward, so the ranks need no
dummy passes and keep the shared-prefix forward.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def init_from_env(device: torch.device | None = None) -> bool:
    """Join the process group torchrun describes (WORLD_SIZE > 1); False when there is none."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return active()
    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # On CUDA, gloo too: the statistics, token counts and fingerprints are all-reduced as CPU
    # tensors, which a process group of NCCL alone refuses ("no backend for device type cpu").
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=timedelta(minutes=30))
    return True


# What gloo's TCP transport says when a peer is gone or silent ("Read error ...: Connection reset
# by peer", "Connection closed by peer", "Timed out waiting ... for recv"): a plain RuntimeError.
_GLOO_TRANSPORT = "gloo/transport/"


def is_peer_failure(exc: BaseException) -> bool:
    """`exc` is a collective failing because another rank (or the link to it) went away, not an
    error of this rank's own: torch's DistError family (NCCL, the store) or gloo's transport."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and _GLOO_TRANSPORT in str(exc))


def launched_as_rank() -> bool:
    """This process was started as a rank by torchrun (RANK set), whether or not it has joined;
    its world may be one rank (a job shrunk to one node by `resources.min_nodes`)."""
    return "RANK" in os.environ


def any_true(flag: bool) -> bool:
    """True on every rank when it is true on any (a stop agreed at a step boundary)."""
    if not active():
        return bool(flag)
    return all_sum_floats([float(bool(flag))])[0] > 0


def from_rank0(obj):
    """Rank 0's `obj` on every rank (any picklable object)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if active():
        dist.barrier()


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of `t` over ranks (a new tensor; `t` itself in one process)."""
    if not active():
        return t
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_sum_floats(values: list[float]) -> list[float]:
    """Float64 sums over ranks of a list of numbers (one all-reduce)."""
    if not active():
        return list(values)
    return all_sum(torch.tensor(values, dtype=torch.float64)).tolist()


def all_gather_int(n: int) -> list[int]:
    """Every rank's `n`, in rank order."""
    if not active():
        return [n]
    out = [None] * world_size()
    dist.all_gather_object(out, int(n))
    return [int(x) for x in out]


def all_max_int(n: int) -> int:
    return max(all_gather_int(n))


def share(items: list, r: int | None = None, ws: int | None = None) -> list:
    """Rank r's contiguous share of `items` (sizes differ by at most one, early ranks larger)."""
    r = rank() if r is None else r
    ws = world_size() if ws is None else ws
    base, extra = divmod(len(items), ws)
    start = r * base + min(r, extra)
    return items[start:start + base + (1 if r < extra else 0)]


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _blocks(model) -> list[torch.nn.Module]:
    """The transformer blocks (HF decoders keep them in `model.model.layers`)."""
    inner = getattr(model, "model", model)
    return list(getattr(inner, "layers", []))


def shard_policy(model: torch.nn.Module, compute_dtype: torch.dtype) -> torch.nn.Module:
    """FSDP2: each block, then the root, sharded over the ranks (in place; returns `model`).

    The sharded parameters stay float32 (master weights, what AdamW updates); on CUDA with a
    bf16 compute dtype the all-gathered weights are bf16 and gradients reduce in float32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if compute_dtype == torch.bfloat16 and next(model.parameters()).device.type == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in _blocks(model):
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    for m in model.modules():
        if is_sharded(m):
            m.set_gradient_divide_factor(1.0)  # sum, not mean: the loss is already global
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return model


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank (all-gathered when sharded), on the CPU."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))


def iter_full_state(model, dtype: torch.dtype | None = None):
    """(name, whole tensor) pairs of `model`'s state dict, one tensor alive at a time: a
    sharded tensor is cast to `dtype` shard by shard and then all-gathered alone.

    For the weight sync: `full_state_dict` would gather the whole float32 model on every rank
    and the sync would then build a second, whole copy in the engine's dtype; streamed, a
    rank's extra memory is its largest tensor in the engine's dtype (the embedding). Every
    rank must consume the pairs in the same order (each gather is a collective).
    """
    from torch.distributed.tensor import DTensor

    for name, t in model.state_dict().items():
        t = t.detach()
        if dtype is not None:
            t = t.to(dtype)
        yield name, t.full_tensor() if isinstance(t, DTensor) else t


@torch.no_grad()
def copy_weights(dst, src) -> None:
    """`dst`'s weights := `src`'s (same architecture; the reference reset to the policy).
    Both sharded alike (FSDP2 over the same ranks): shard by shard, no gather."""
    from torch.distributed.tensor import DTensor

    if hasattr(dst, "copy_weights_from"):  # a LoRA reference: the adapter's snapshot (models/lora.py)
        dst.copy_weights_from(src)
        return
    targets = dst.state_dict()
    for name, t in src.state_dict().items():
        target = targets[name]
        if isinstance(target, DTensor) != isinstance(t, DTensor):
            raise ValueError(f"copy_weights: {name} is sharded on one side only")
        if isinstance(t, DTensor):
            target.to_local().copy_(t.to_local())
        else:
            target.copy_(t)


def load_full_weights(model, state: dict[str, torch.Tensor]) -> None:
    """Whole tensors (e.g. read from safetensors; tied duplicates may be absent) into `model`,
    each rank keeping its shard when `model` is sharded."""
    if not is_sharded(model):
        missing, unexpected = model.load_state_dict(state, strict=False)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        missing, unexpected = set_model_state_dict(
            model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    tied = {n for n in missing if _is_tied(model, n, state)}
    if unexpected or set(missing) - tied:
        raise ValueError(f"weights do not fit the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")


def _is_tied(model, name: str, state: dict) -> bool:
    """`name` shares its parameter with a tensor that `state` holds (tied embeddings)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    p = params.get(name)
    return p is not None and any(params.get(k) is p for k in state)


def dummy_pass(model, backward: bool) -> None:
    """A zero-weight forward (and backward) on one token, so that a rank with fewer
    micro-batches still joins every FSDP all-gather and reduce-scatter of the others."""
    device = next(model.parameters()).device
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    with torch.set_grad_enabled(backward):
        out = model(input_ids=ids, position_ids=torch.zeros_like(ids), use_cache=False)
        if backward:
            (out.logits.float().sum() * 0.0).backward()


def gradient_sync(model, last: bool) -> None:
    """FSDP2: reduce-scatter gradients only in the mini-batch's last backward (`last`); the
    earlier micro-batches add into unsharded local gradients. One reduce-scatter of the fp32
    gradient per mini-batch instead of one per micro-batch, for an unsharded gradient held
    (4 bytes/param) until that last backward (docs/results.md, multi-rank figures)."""
    if active() and is_sharded(model):
        model.set_requires_gradient_sync(last)


@torch.no_grad()
def replicate_from_rank0(tensors) -> None:
    """Rank 0's values of `tensors` (e.g. a LoRA adapter) on every rank, in place."""
    if not active():
        return
    for t in tensors:
        dist.broadcast(t.data, src=0)


@torch.no_grad()
def all_reduce_replicated_grads(model) -> None:
    """A replicated (not sharded) model on ranks: the SUM over ranks of its trainable
    parameters' gradients, in one all-reduce of one flat buffer (a parameter that no backward
    of this rank reached counts as zero). Nothing in one process or for a sharded model, whose
    FSDP reduce-scatter does this in its last backward (`gradient_sync`)."""
    if not active() or is_sharded(model):
        return
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p)
        offset += n


def pad_count(model, n_chunks: int) -> int:
    """Dummy passes this rank must add so that all ranks run the same number of forwards."""
    if not (active() and is_sharded(model)):
        return 0
    return all_max_int(n_chunks) - n_chunks


# --------------------------------------------------------------------------- checkpoints
# torch.distributed.checkpoint writes each rank's shards plus the metadata to reshard them,
# so a checkpoint saved by N ranks loads into M (one process included: no process group).


def save_sharded(folder, model, optimizer) -> None:
    """Model and optimizer state as a DCP checkpoint in `folder` (every rank calls this)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(folder), no_dist=not active())


def load_sharded(folder, model, optimizer) -> None:
    """Restore `save_sharded`'s state into this run's (maybe differently) sharded model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(folder), no_dist=not active())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_full_optimizer(model, optimizer, state: dict) -> None:
    """A one-process `optimizer.state_dict()` (parameters by index, in `model.parameters()`
    order) into this rank's optimizer over the sharded `model` (each rank keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [n for n, _ in model.named_parameters()]
    full = {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def save_consolidated(folder, model, tokenizer=None) -> None:
    """The whole model as an HF folder (safetensors) for download: gathered on every rank,
    written by rank 0 only."""
    full = full_state_dict(model)
    if rank() == 0:
        model.save_pretrained(folder, state_dict=full, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
    if active():
        dist.barrier()
