"""The production rollout engine: an in-process `vllm.LLM`, synced and verified after each step.

In-process (no engine subprocess) because weight sync needs the worker's model object:
`VLLM_ENABLE_V1_MULTIPROCESSING=0` is set (setdefault) before vLLM is imported.

Sizing (from the step's shape, decided by the caller through `max_num_seqs`):
- `max_num_seqs`: how many sequences are decoded together; `size_max_num_seqs` gives
  min(prompts x n, 1024). More than ~512 at once buys nothing on CPU (measured on 2 cores:
  N = 128 and N = 512 ran at the same rate, ~550 samples/s on builtin:tiny) and only grows the
  KV cache; vLLM queues the rest.
- KV cache: `kv_cache_bytes` = bytes per token x max_model_len x max_num_seqs x 1.1, i.e.
  every running sequence can reach full length without preemption; capped at a quarter of
  free RAM (CPU) or 30 % of free GPU memory (the trainer shares the device), floored at one
  full-length sequence. Passed as `kv_cache_memory_bytes` (CPU and GPU alike); on CPU an
  explicit `VLLM_CPU_KVCACHE_SPACE` (GiB) in the environment still wins (vLLM's legacy rule).

Log-probs: `logprobs_mode="processed_logprobs"`, i.e. after temperature (and top-p, see
engines/base.py), which is the trainer's softmax(logits / T) convention when top_p = 1.

Weight sync: `worker.reload_weights(weights_iterator=...)` (works on vLLM-CPU), falling back
to `model_runner.model.load_weights(...)` if the first raises; the path that worked is kept.
Then the prefix cache is reset (cached KV blocks were computed with the old weights), and two
checks run, either of which raises `WeightSyncError`:
1. Fingerprint: sum and sum of squares (float64) over the engine's parameters vs the trainer's
   tensors cast to the engine dtype. Exact up to summation order, so it catches weights that
   are stale by even one small optimizer step. Invariant to vLLM's fused (qkv, gate_up)
   and zero-padded (vocab) layouts; enabled only when, at start-up, the engine's fingerprint
   equals the checkpoint's on disk (a model whose loader transforms weights skips it).
2. Sync check: prompt log-probs of a fixed token sequence vs the trainer model's, max abs diff
   within `logprob_tolerance(dtype)`: the end-to-end check that the logits are right.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from trainer import collectives as distributed  # noqa: E402
from trainer.engines.base import (WeightSyncError, logprob_tolerance, sync_check_tokens,  # noqa: E402
                                  trainer_token_logprobs)
from trainer.precision import DTYPES  # noqa: E402
from trainer.rollouts import Generation, SamplingConfig  # noqa: E402

log = logging.getLogger(__name__)

MAX_NUM_SEQS_CAP = 1024
# The weight sync reaches into vLLM's internals (`driver_worker.worker.reload_weights`,
# `model_runner.model`), which move between minor versions: only this series is supported
# (pyproject's gpu extra and vllm-cpu pin the same).
SUPPORTED_VLLM_SERIES = "0.32."


def check_vllm_version(version: str) -> None:
    """Refuse at start-up a vLLM whose internals the weight sync has not been checked against."""
    if not version.startswith(SUPPORTED_VLLM_SERIES):
        raise RuntimeError(
            f"vLLM {version} is not supported: the trainer's weight sync uses vLLM internals "
            f"checked on {SUPPORTED_VLLM_SERIES}x only; install vllm=={SUPPORTED_VLLM_SERIES}* "
            f"(pip install -c constraints.txt '.[gpu]') or use rollout.engine: hf")


def size_max_num_seqs(samples_per_step: int, cap: int = MAX_NUM_SEQS_CAP) -> int:
    """Concurrent sequences for a step of `samples_per_step` (see the module docstring)."""
    return max(1, min(samples_per_step, cap))


def kv_cache_bytes(model_dir: Path, dtype: str, max_model_len: int, max_num_seqs: int) -> int:
    """KV-cache bytes for the shape (the rule is in the module docstring)."""
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    per_token = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * DTYPES[dtype].itemsize
    need = int(per_token * max_model_len * max_num_seqs * 1.1)
    if torch.cuda.is_available():
        cap = int(0.30 * torch.cuda.mem_get_info()[0])
    else:
        import psutil

        cap = int(0.25 * psutil.virtual_memory().available)
    floor = per_token * max_model_len + (16 << 20)
    return max(floor, min(need, cap))


class VLLMEngine:
    name = "vllm"

    def __init__(self, model_dir: Path, *, dtype: str = "float32", seed: int = 0,
                 max_model_len: int = 2048, max_num_seqs: int = 256,
                 kv_cache_gib: float | None = None, sync_check_len: int = 48,
                 llm_kwargs: dict | None = None):
        import vllm
        from vllm import LLM

        check_vllm_version(vllm.__version__)
        self.dtype = dtype
        self.model_dir = Path(model_dir)
        kv = (int(kv_cache_gib * (1 << 30)) if kv_cache_gib is not None
              else kv_cache_bytes(self.model_dir, dtype, max_model_len, max_num_seqs))
        set_threads = torch.set_num_threads
        self.llm = LLM(
            model=str(self.model_dir), dtype=dtype, seed=seed, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max(8192, max_num_seqs, max_model_len),
            kv_cache_memory_bytes=kv,
            # CUDA graphs capture fixed buffers; eager keeps start-up short on CPU.
            enforce_eager=not torch.cuda.is_available(),
            gpu_memory_utilization=0.3, logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            # vLLM-CPU 0.32 crashes when a seeded request's prefill is split across steps
            # (`CPU Generator does not use offset`); whole-prompt prefills avoid the split.
            enable_chunked_prefill=torch.cuda.is_available(),
            **(llm_kwargs or {}))  # LoRA: enable_lora, max_lora_rank (trainer/engines/vllm_lora.py)
        # vLLM-CPU's worker replaces torch.set_num_threads with a warning no-op for the whole
        # process; in-process, that would silently take thread control away from the trainer.
        torch.set_num_threads = set_threads
        self._loader = None  # the sync path that worked, once known
        self.lora_request = None  # LoRA: the adapter of the current weight version
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        self.sync_check = sync_check_tokens(vocab, sync_check_len)
        disk = _disk_fingerprint(self.model_dir, DTYPES[dtype])
        self.fingerprint_check = disk is not None and _close(disk, self._engine_fingerprint())
        if not self.fingerprint_check:
            # Expected on vLLM-CPU, which repacks linear weights into its own kernel layout.
            log.info("vLLM weight fingerprint differs from the checkpoint's at start-up "
                     "(the loader transforms weights?): sync verified by the sync check only")

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, *,
                 ignore_eos: bool = False) -> Generation:
        """n samples per unique prompt via `SamplingParams(n=...)` (shares the prompt prefix)."""
        from vllm import SamplingParams

        # vLLM refuses n > 1 with greedy decoding (temperature 0), whose n samples are one and
        # the same: ask for one and repeat it, as the HF engine's greedy samples come out.
        greedy = sampling.temperature == 0
        params = [SamplingParams(
            n=1 if greedy else sampling.n, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, logprobs=0, ignore_eos=ignore_eos,
            # Distinct per prompt; vLLM gives child sample j the seed + j.
            seed=(sampling.seed * 1_000_003 + i * 65_537) % (2 ** 62))
            for i in range(len(prompts))]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 use_tqdm=False, lora_request=self.lora_request)
        gen = Generation(prompt_index=[], token_ids=[], logprobs=[], finished=[])
        for i, req in enumerate(outs):
            for c in [c for c in sorted(req.outputs, key=lambda c: c.index)
                      for _ in range(sampling.n if greedy else 1)]:
                ids = list(c.token_ids)
                gen.prompt_index.append(i)
                gen.token_ids.append(ids)
                gen.logprobs.append([step[t].logprob for t, step in zip(ids, c.logprobs)])
                gen.finished.append(c.finish_reason == "stop")
        return gen

    # ------------------------------------------------------------------ weight sync

    def _worker(self):
        return self.llm.llm_engine.model_executor.driver_worker.worker

    def _engine_model(self) -> torch.nn.Module:
        return self._worker().model_runner.model

    def _load(self, weights) -> None:
        """Load `weights()` (a fresh iterator of (name, tensor) per call) into the engine."""
        loaders = {
            "reload_weights": lambda: self._worker().reload_weights(weights_iterator=weights()),
            "load_weights": lambda: self._engine_model().load_weights(weights()),
        }
        order = [self._loader] if self._loader else list(loaders)
        errors = []
        for name in order:
            try:
                loaders[name]()
                self._loader = name
                return
            except Exception as exc:  # noqa: BLE001 - try the next path, report all below
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
        raise WeightSyncError("could not load weights into vLLM: " + "; ".join(errors))

    def sync_weights(self, model: torch.nn.Module) -> float:
        """Load `model`'s weights into the engine, reset the prefix cache, verify."""
        t0 = time.perf_counter()
        # The trainer's float32 master weights go over in the engine's dtype (bf16 on a GPU),
        # streamed tensor by tensor (sharded ones gathered alone, after the cast).
        self._load(lambda: distributed.iter_full_state(model, DTYPES[self.dtype]))
        self.llm.reset_prefix_cache()
        self.verify(model)
        return time.perf_counter() - t0

    def verify(self, model: torch.nn.Module) -> float:
        """Raise `WeightSyncError` unless the engine holds `model`'s weights; returns the sync check's diff."""
        if self.fingerprint_check:
            mine = _module_fingerprint(model, DTYPES[self.dtype])
            theirs = self._engine_fingerprint()
            if not _close(mine, theirs):
                raise WeightSyncError(
                    f"vLLM weights are not the trainer's: fingerprint {theirs} vs {mine}")
        diff = self.sync_check_diff(model)
        tol = logprob_tolerance(self.dtype)
        if not diff <= tol:  # also catches NaN
            raise WeightSyncError(
                f"vLLM sync-check log-probs differ from the trainer's by {diff:.3g} (> {tol:g})")
        return diff

    def sync_check_diff(self, model: torch.nn.Module) -> float:
        """max |engine - trainer| log-prob over the sync check's token sequence."""
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0)
        out = self.llm.generate([{"prompt_token_ids": self.sync_check}], sp, use_tqdm=False,
                                lora_request=self.lora_request)[0]
        # Entry 0 is None (no log-prob for the first token); entry t holds token t's.
        eng = torch.tensor([d[t].logprob for t, d in zip(self.sync_check[1:], out.prompt_logprobs[1:])])
        ref = trainer_token_logprobs(model, self.sync_check)
        return float((eng - ref).abs().max())

    def _engine_fingerprint(self) -> tuple[float, float]:
        return _fingerprint(self._engine_model().parameters(), None)

    def close(self) -> None:
        """Drop the engine; in-process, freeing it is a matter of releasing references."""
        import gc

        self.llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------- fingerprints


def _fingerprint(tensors, dtype: torch.dtype | None) -> tuple[float, float]:
    """(sum, sum of squares) in float64 over unique tensors, each first cast to `dtype`.

    Tied weights count once, as in the engine: tensors are told apart by identity (a module's
    `parameters()` already yields a tied one once). Not by `data_ptr()`: that is 0 for every
    FSDP2-sharded parameter (a DTensor), which made a sharded policy's fingerprint its first
    tensor. A sharded tensor adds its local shard's sums, which are then summed over the ranks
    (one all-reduce; every rank fingerprints its shards at the same point of the step).
    """
    whole = torch.zeros(2, dtype=torch.float64)
    shards = torch.zeros(2, dtype=torch.float64)
    sharded = False
    seen = set()
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        x, part = _local_part(t.detach())
        sharded |= part
        if dtype is not None:
            x = x.to(dtype)
        x = x.double()
        (shards if part else whole).add_(torch.stack([x.sum(), (x * x).sum()]).cpu())
    if sharded:
        whole += distributed.all_sum(shards)
    return float(whole[0]), float(whole[1])


def _local_part(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(what this rank holds of `t`, whether that is one shard of a tensor split over ranks).
    A DTensor replicated anywhere (not plain FSDP sharding) is gathered whole instead."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t, False
    if all(p.is_shard() for p in t.placements):
        return t.to_local(), True
    return t.full_tensor(), False


def _module_fingerprint(model: torch.nn.Module, dtype: torch.dtype) -> tuple[float, float]:
    return _fingerprint(model.parameters(), dtype)


def _disk_fingerprint(model_dir: Path, dtype: torch.dtype) -> tuple[float, float] | None:
    """Fingerprint of the safetensors checkpoint in `model_dir` (None if there is none)."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    tensors = []
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            tensors.extend(fh.get_tensor(k) for k in fh.keys())
    return _fingerprint(tensors, dtype)


def _close(a: tuple[float, float], b: tuple[float, float], rel: float = 1e-6) -> bool:
    """Equal up to float64 summation-order error (orders of magnitude below one SGD step)."""
    return all(abs(x - y) <= rel * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))
