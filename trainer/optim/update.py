"""The model-facing half of the objective: log-probs and the micro-batched PPO update.

Large N is the normal case, not an option: a mini-batch of 512 x 128 / 4 samples
never goes through the model at once. Samples are packed into micro-batches of at most
`max_tokens` padded tokens; each micro-batch runs forward and backward on its own, with its
loss divided by the valid-token count of the WHOLE mini-batch, so the accumulated gradient
equals the full mini-batch's gradient while only one micro-batch's activations are alive.

When prompts repeat (groups of N), a micro-batch runs each prompt once and its responses
attend to the prompt's keys/values (`_shared_prefix_logits`); the budget then counts the
tokens actually run (prompts once, responses padded to the chunk's longest) plus each sample's
copy of its prompt's keys/values (`prompt_copy_weight`).

Packed rows (`packs`: plain-head, full-attention models under SDPA; `UpdateConfig.pack`): a
row holds several samples one after another, each seeing only itself through a block-diagonal
causal mask, with its own position ids, so a micro-batch's padding is its rows' unfilled
tails, not every sample's distance to its longest (`_packed_logits`, `_packed_prefix_logits`).
Otherwise (sliding windows, other heads or attention implementations):

Sequences are prompt + response, right-padded with token 0 and an attention mask; with right
padding real tokens never see padding under the causal mask, and position ids are simply
0 .. L-1 (passed explicitly so no model has to infer them from the mask).

Precision: the trainable weights and the optimizer state stay float32 (master weights);
with `compute_dtype` bfloat16 every forward runs under `torch.autocast`, so matmuls are bf16
while the update lands on the float32 weights (a bf16 weight cannot take a 1e-6 step). Dropout
is switched off at load time (`trainer.models.loading.disable_dropout`), so train/eval mode does not
change any log-prob here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from trainer import collectives as distributed
from trainer.algo.losses import KL_ESTIMATORS, is_ratio, is_weights, token_sum
from trainer.algo.objectives import OBJECTIVES, Totals
from trainer.optim.fused_head import fused_loss
from trainer.optim.logprobs import Segment, token_logp
from trainer.optim.model_io import fp32_output_head, hidden_states_out, sliced_head
from trainer.precision import autocast
from trainer.optim.packing import (Rows, _distinct_prompts, _packed_logits, _packed_prefix_logits, _per_sample,
                                   packed_micro_batches, packed_prefix_micro_batches)
from trainer.rollouts import Rollouts

# Activation memory one micro-batch may use when `micro_batch_tokens: auto`. A fixed budget
# (not a probe of free device memory) so that a run's micro-batching, and therefore its
# numerics, do not depend on what else is on the device.
ACTIVATION_BUDGET_BYTES = 4 * 2**30
# Upper bound for `auto`: tiny models would otherwise get millions of tokens per chunk,
# whose padding waste and latency buy nothing.
MAX_AUTO_TOKENS = 65_536


@dataclass(frozen=True)
class UpdateConfig:
    """What one PPO mini-batch update needs; built once per run from the spec."""

    clip_low: float = 0.2
    clip_high: float = 0.27
    kl_coef: float = 1e-4
    kl_estimator: str = "k2"
    is_band: tuple[float, float] | None = (0.5, 5.0)
    temperature: float = 1.0
    grad_clip: float | None = 1.0
    compute_dtype: torch.dtype = torch.float32
    # Run each prompt once per micro-batch and let its samples attend to its keys/values
    # (`_shared_prefix_logits`); off = the plain padded batch. Same objective either way.
    shared_prefix: bool = True
    # Pack several samples into one row of a micro-batch (`packs`): little padding, same
    # objective; off = one sample per row, padded to its micro-batch's longest.
    pack: bool = True
    # The policy objective (`OBJECTIVES`: ppo, gspo, cispo, dr_grpo) and dr_grpo's constant.
    loss: str = "ppo"
    max_new_tokens: int = 256
    # Project to the vocabulary and take the log-softmax in float32 under a bf16 autocast.
    fp32_head: bool = False
    # The head's gradient computed in the log-prob forward (trainer/optim/fused_head.py) where
    # the objective is a sum of per-token terms; off (or GSPO): the unfused `token_logp`.
    # Internal, for the before/after of bench/fused_head.py; the same gradients either way.
    fused_head: bool = True

    def __post_init__(self) -> None:
        # Resolved once here (an unknown name fails now), not looked up in every micro-batch.
        object.__setattr__(self, "kl_fn", KL_ESTIMATORS[self.kl_estimator])
        object.__setattr__(self, "objective", OBJECTIVES[self.loss])
        # GSPO's ratio is per sequence (it needs the whole sequence's log-probs), so it keeps
        # the unfused path; picked once here, not per micro-batch.
        object.__setattr__(self, "fuses", self.fused_head and self.objective.per_token)

    @classmethod
    def from_spec(cls, spec, compute_dtype: torch.dtype = torch.float32) -> "UpdateConfig":
        a = spec.algo
        return cls(a.clip_low, a.clip_high, a.kl_coef, a.kl_estimator,
                   a.is_truncation, spec.rollout.temperature, spec.optim.grad_clip, compute_dtype,
                   loss=a.loss, max_new_tokens=spec.rollout.max_new_tokens,
                   fp32_head=spec.model.fp32_lm_head)


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Sample indices grouped so each chunk's padded size len(chunk) * max_len <= max_tokens.

    Samples are sorted by length, longest first, so similar lengths share a chunk (little
    padding) and the largest chunk runs first (an out-of-memory shows up at once, not after
    minutes). A sample longer than the budget gets a chunk of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks: list[list[int]] = []
    for i in order:
        # Longest first: the chunk's first sample sets its padded length.
        if chunks and (len(chunks[-1]) + 1) * lengths[chunks[-1][0]] <= max_tokens:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def auto_micro_batch_tokens(model, max_seq_len: int,
                            budget_bytes: int = ACTIVATION_BUDGET_BYTES) -> int:
    """Tokens per micro-batch for `micro_batch_tokens: auto`, from a fixed activation budget.

    Rough bytes per token of a forward+backward without checkpointing:
    - logits: vocab x 4 bytes x 3 (the logits, their float32/tempered copy, their gradient);
    - per layer: (16 x hidden + 3 x intermediate) x parameter bytes (attention projections,
      norms and residuals; SwiGLU's gate, up and product).
    The result is clamped to [max_seq_len, MAX_AUTO_TOKENS] (a sequence must always fit).
    """
    cfg = model.config
    elem = next(model.parameters()).element_size()
    per_token = cfg.vocab_size * 4 * 3 + cfg.num_hidden_layers * _layer_elems_per_token(cfg) * elem
    tokens = min(budget_bytes // per_token, MAX_AUTO_TOKENS)
    return max(int(tokens), int(max_seq_len))


def _layer_elems_per_token(cfg) -> int:
    """Activation elements one token keeps per layer for the backward (see above)."""
    hidden = cfg.hidden_size
    inter = getattr(cfg, "intermediate_size", None) or 4 * hidden
    return 16 * hidden + 3 * inter


def prompt_copy_weight(model) -> float:
    """What one prompt position costs each sample of the shared-prompt forward, in tokens.

    The response pass gives every sample its own copy of the prompt's keys/values: the cache's
    index-select over the group, its concatenation with the response's keys/values, and the
    expansion to every query head that attention saves for the backward, per layer about
    2 x (kv heads + query heads) x head_dim elements. Measured in tokens of activation
    (`_layer_elems_per_token`), so the micro-batch budget can count it: ~0.1 for Qwen2
    shapes, i.e. a 2,000-token prompt costs each of its samples ~200 tokens.
    """
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * (kv + heads) * head_dim / _layer_elems_per_token(cfg)


def _pack(prompt_ids, response_ids, idx: list[int], device) -> dict:
    """Right-padded model inputs for the samples `idx` plus where their response tokens are."""
    seqs = [torch.tensor(prompt_ids[i] + response_ids[i], dtype=torch.long) for i in idx]
    plens = torch.tensor([len(prompt_ids[i]) for i in idx])
    if len(idx) and int(plens.min()) == 0:
        raise ValueError("empty prompt: the first response token would have no predicting position")
    rlens = torch.tensor([len(response_ids[i]) for i in idx])
    ids = pad_sequence(seqs, batch_first=True, padding_value=0)
    L = ids.shape[1]
    attn = (torch.arange(L).unsqueeze(0) < (plens + rlens).unsqueeze(1)).long()
    R = int(rlens.max()) if len(idx) else 0
    j = torch.arange(R).unsqueeze(0)
    resp_mask = j < rlens.unsqueeze(1)
    # Logits at position p predict token p + 1: response token j is predicted at plen-1+j.
    pred_pos = torch.where(resp_mask, plens.unsqueeze(1) - 1 + j, torch.zeros_like(j))
    targets = torch.where(resp_mask, ids.gather(1, (pred_pos + 1).clamp_max(L - 1)), 0)
    return {
        "input_ids": ids.to(device), "attention_mask": attn.to(device),
        "position_ids": torch.arange(L).expand(len(idx), L).to(device),
        "pred_pos": pred_pos.to(device), "targets": targets.to(device),
        "mask": resp_mask.to(device), "rlens": rlens.tolist(),
        "keep": max(L - int(plens.min()) + 1, 1) if len(idx) else 1,
    }


def _response_logits(model, batch: dict, compute_dtype: torch.dtype = torch.float32,
                     fp32_head: bool = False) -> list[Segment]:
    """The model's last hidden states (or logits, `sliced_head`) and, per sample, the
    positions in them that predict response tokens: one segment that trainer/optim/logprobs.py
    projects and reduces a slice at a time, so no [b, R, V] tensor is made here."""
    # logits_to_keep: only the tail from the shortest prompt on is kept (and, without a sliced
    # head, projected to the vocab), so long prompts do not cost a [L, V] logits tensor each.
    keep = batch["keep"]
    head = sliced_head(model)
    with autocast(batch["input_ids"].device, compute_dtype), hidden_states_out(model, head is not None), \
            fp32_output_head(model, fp32_head and head is None):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], logits_to_keep=keep, use_cache=False)
    L = batch["input_ids"].shape[1]
    return [(out.logits, (batch["pred_pos"] - (L - keep)).clamp_min(0), head)]


# ----------------------------------------------------------------------------- shared prefix
# All N samples of a group share one prompt. The plain batch runs that prompt N times; here it
# runs once per micro-batch, and the group's responses attend to its cached keys/values
# (index-selected over the group, so gradients from all N responses sum back into the one
# prompt pass). Same logits as the plain batch up to float rounding: same positions, same
# causal visibility, padding masked. Everything is right-padded, so no query row is fully
# masked (left padding would put NaNs into padded keys/values).


def uses_shared_prefix(model, prompt_ids, enabled: bool = True) -> bool:
    """Whether the shared-prefix forward applies: asked for, prompts repeat, no checkpointing
    (HF turns the key/value cache off under gradient checkpointing), not sharded."""
    if not enabled or getattr(model, "is_gradient_checkpointing", False):
        return False
    # Sharded (FSDP2): one forward per micro-batch, so that ranks with fewer micro-batches can
    # match the others' all-gathers with one zero-weight pass each (trainer/collectives.py).
    if distributed.is_sharded(model):
        return False
    return len({tuple(p) for p in prompt_ids}) < len(prompt_ids)


def attention_window(model) -> int | None:
    """The narrowest local attention span (sliding window, attention chunk) any layer of
    `model` uses, or None when every layer attends to the whole sequence."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    types = getattr(cfg, "layer_types", None)
    if types is not None and not any(t in ("sliding_attention", "chunked_attention") for t in types):
        return None
    spans = [s for s in (getattr(cfg, "sliding_window", None), getattr(cfg, "attention_chunk_size", None)) if s]
    return min(spans) if spans else None


def prefix_micro_batches(prompt_ids, response_ids, max_tokens: int,
                         window: int | None = None, prompt_weight: float = 0.0) -> list[list[int]]:
    """Sample indices in chunks for the shared-prefix forward, each holding at most
    `max_tokens` tokens: distinct prompts x their longest + samples x (the longest response
    + `prompt_weight` x the longest prompt). The last term is each sample's copy of the
    prompt's keys/values (`prompt_copy_weight`), which a long prompt makes the largest part.

    Longest prompts first (similar lengths share a chunk), and within a group the longest
    responses first (little response padding). A group over the budget is split; each part
    runs its prompt once. A single sample over the budget gets a chunk of its own.

    `window` (a sliding-window or chunked-attention model, `attention_window`): the window
    counts cache slots, and a prompt shorter than the chunk's longest is followed by padding
    slots before its responses, which would push its own tokens out of their window. So a
    chunk holds prompts of one length only, unless its longest prompt plus longest response
    fits in the window (then nothing can fall out of it).
    """
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompt_ids):
        groups.setdefault(tuple(p), []).append(i)
    chunks: list[list[int]] = []
    cur: list[int] = []
    seen: set[tuple] = set()
    pmax = rmax = 0
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[0])):
        for i in sorted(members, key=lambda i: -len(response_ids[i])):
            p2, r2 = max(pmax, len(key)), max(rmax, len(response_ids[i]))
            fits = (len(seen) + (key not in seen)) * p2 + (len(cur) + 1) * (r2 + prompt_weight * p2) <= max_tokens
            local_ok = window is None or len(key) == pmax or p2 + r2 <= window
            if cur and not (fits and local_ok):
                chunks.append(cur)
                cur, seen, p2, r2 = [], set(), len(key), len(response_ids[i])
            cur.append(i)
            seen.add(key)
            pmax, rmax = p2, r2
    if cur:
        chunks.append(cur)
    return chunks


# ----------------------------------------------------------------------------- packed rows
# A micro-batch of samples padded to its longest wastes the difference on every shorter
# sample (~30 % of the positions run at ~100-token responses spread over 1..256). Packed, a
# row holds several samples one after another, each seeing only itself (and, in the shared-
# prompt forward, its prompt's keys/values): a 4-D block-diagonal causal mask and position
# ids that restart per sample, so every logit is the one the sample gets alone, up to float
# rounding. Rows are filled first-fit decreasing to the longest sample's length, so the
# padding left is the rows' unfilled tails.


def packs(model) -> bool:
    """Whether the update packs samples into rows: a plain-head model (the log-probs gather
    only real positions from its hidden states, `sliced_head`) whose layers all attend to the
    whole sequence (a sliding window counts cache slots, which packing would shift) under
    SDPA (which takes the 4-D boolean mask as it is; eager attention wants an additive one)."""
    return (sliced_head(model) is not None and attention_window(model) is None
            and getattr(model.config, "_attn_implementation", None) == "sdpa")

def _shared_prefix_logits(model, prompt_ids, response_ids, idx: list[int],
                          compute_dtype: torch.dtype, fp32_head: bool = False) -> tuple[list[Segment], dict]:
    """Hidden states (or logits) predicting each response token as two segments (the prompt's
    last position, then the response pass), plus the batch's targets / mask / rlens: one
    prompt pass per distinct prompt, one response pass."""
    device = next(model.parameters()).device
    group, prompts, plens, pmask, keep, col = _distinct_prompts(prompt_ids, idx)
    G, P = pmask.shape
    pmask = pmask.long()
    rlens = torch.tensor([len(response_ids[i]) for i in idx])
    R = int(rlens.max())
    resp = pad_sequence([torch.tensor(response_ids[i], dtype=torch.long) for i in idx], batch_first=True)
    resp = resp.reshape(len(idx), R)
    mask = torch.arange(R).unsqueeze(0) < rlens.unsqueeze(1)
    batch = {"targets": torch.where(mask, resp, 0).to(device), "mask": mask.to(device), "rlens": rlens.tolist()}
    head = sliced_head(model)
    with autocast(device, compute_dtype), hidden_states_out(model, head is not None), \
            fp32_output_head(model, fp32_head and head is None):
        out = model(input_ids=pad_sequence(prompts, batch_first=True).to(device),
                    attention_mask=pmask.to(device), position_ids=torch.arange(P).expand(G, P).to(device),
                    logits_to_keep=keep.to(device), use_cache=True)
        parts = [(out.logits[group.to(device), col[group].to(device)].unsqueeze(1), None, head)]
        if R > 1:
            cache = out.past_key_values
            cache.batch_select_indices(group.to(device))  # [G, ...] -> [b, ...]; grads sum back
            # Response inputs 0 .. R-2 predict tokens 1 .. R-1; padded inputs only feed padded
            # outputs (causal), so their mask can stay 1.
            attn = torch.cat([pmask[group], torch.ones(len(idx), R - 1, dtype=torch.long)], 1)
            pos = plens[group].unsqueeze(1) + torch.arange(R - 1).unsqueeze(0)
            out2 = model(input_ids=resp[:, :R - 1].to(device), attention_mask=attn.to(device),
                         position_ids=pos.to(device), past_key_values=cache, use_cache=True)
            parts.append((out2.logits, None, head))
    return parts, batch


def _chunks(model, prompt_ids, response_ids, max_tokens: int, shared: bool,
            pack: bool = True) -> tuple[list[list[int]], bool]:
    """The micro-batches and whether they run through the shared-prefix forward; packed rows
    (`Rows`) where `pack` and the model allows it (`packs`)."""
    pack = pack and packs(model)
    if uses_shared_prefix(model, prompt_ids, shared):
        if pack:
            return packed_prefix_micro_batches(prompt_ids, response_ids, max_tokens, prompt_copy_weight(model)), True
        return prefix_micro_batches(prompt_ids, response_ids, max_tokens, attention_window(model),
                                    prompt_copy_weight(model)), True
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    return (packed_micro_batches if pack else micro_batches)(lengths, max_tokens), False


def _logits(model, prompt_ids, response_ids, idx: list[int], compute_dtype: torch.dtype,
            shared: bool, fp32_head: bool = False) -> tuple[list[Segment], dict]:
    """Response logit segments and the batch (targets, mask, rlens; `scatter` where the
    segments are packed: `_per_sample`) by any of the forwards. `fp32_head` makes a model's
    own head float32 here; a sliced head (every packed layout) is float32 in `token_logp`."""
    if isinstance(idx, Rows):
        fn = _packed_prefix_logits if shared else _packed_logits
        return fn(model, prompt_ids, response_ids, idx, compute_dtype)
    if shared:
        return _shared_prefix_logits(model, prompt_ids, response_ids, idx, compute_dtype, fp32_head)
    batch = _pack(prompt_ids, response_ids, idx, next(model.parameters()).device)
    return _response_logits(model, batch, compute_dtype, fp32_head), batch


def _pad_rows(rows, idx: list[int], device) -> torch.Tensor:
    """[b, R] float32 right-padded (with 0) from per-sample 1-D tensors or lists."""
    ts = [torch.as_tensor(rows[i], dtype=torch.float32) for i in idx]
    return pad_sequence(ts, batch_first=True, padding_value=0.0).to(device)


# ----------------------------------------------------------------------------- log-probs


@torch.no_grad()
def sequence_logprobs(model, prompt_ids, response_ids, temperature: float, max_tokens: int,
                      with_entropy: bool = False, compute_dtype: torch.dtype = torch.float32,
                      shared_prefix: bool = True, pack: bool = True, fp32_head: bool = False):
    """Per-sample 1-D float32 CPU tensors of log pi(response token | prefix) at `temperature`.

    With `with_entropy`, returns (logprobs, entropies), entropies per response token.
    `fp32_head`: the head in float32 under a bf16 compute dtype (as the update's, `UpdateConfig`).
    Results are in the order of the inputs, whatever the micro-batching.
    """
    logps: list[torch.Tensor] = [None] * len(prompt_ids)  # type: ignore[list-item]
    ents: list[torch.Tensor] = [None] * len(prompt_ids)  # type: ignore[list-item]
    chunks, shared = _chunks(model, prompt_ids, response_ids, max_tokens, shared_prefix, pack)
    pad = distributed.pad_count(model, len(chunks))  # before any forward: it is a collective too
    for chunk in chunks:
        logits, batch = _logits(model, prompt_ids, response_ids, chunk, compute_dtype, shared, fp32_head)
        out = token_logp(logits, batch["targets"], temperature, with_entropy=with_entropy, fp32_head=fp32_head)
        lp = _per_sample(out[0] if with_entropy else out, batch).cpu()
        ent = _per_sample(out[1], batch).cpu() if with_entropy else None
        for row, (i, n) in enumerate(zip(chunk, batch["rlens"])):
            logps[i] = lp[row, :n].clone()
            if with_entropy:
                ents[i] = ent[row, :n].clone()
    for _ in range(pad):  # FSDP: the same number of forwards on every rank
        distributed.dummy_pass(model, backward=False)
    return (logps, ents) if with_entropy else logps


# ----------------------------------------------------------------------------- update


def model_token_mask(valid: torch.Tensor, loss_mask, idx: list[int]) -> torch.Tensor:
    """[b, R] bool: the tokens that carry loss, ratios, KL and entropy: valid (not padding) and
    the model's own (`Rollouts.loss_mask` 1; an environment's tokens are context only). Every
    forward (padded, shared-prefix, packed) gives `valid` per sample in the order of `idx`."""
    if loss_mask is None:
        return valid
    own = pad_sequence([torch.as_tensor(loss_mask[i], dtype=torch.bool) for i in idx], batch_first=True)
    own = own.to(valid.device)
    if own.shape[1] < valid.shape[1]:  # only when every sample's mask is shorter: pad with 0
        own = torch.nn.functional.pad(own, (0, valid.shape[1] - own.shape[1]))
    return valid & own[:, :valid.shape[1]]


def _policy_loss(logp, old, engine, adv, ref, mask, cfg: UpdateConfig, totals: Totals):
    """The micro-batch's loss from [b, R] per-sample log-probs, and what its statistics need
    (old log-probs, IS truncation, clip masks, KL). `old` None: the current log-probs, detached."""
    if old is None:
        old = logp.detach()
    weights, truncated = is_weights(old, engine, cfg.is_band)
    pg, clip_low, clip_high = cfg.objective.terms(logp, old, adv, mask, cfg.clip_low, cfg.clip_high)
    per_token = weights * pg
    kl = torch.zeros_like(logp)
    if ref is not None:
        kl = cfg.kl_fn(logp, ref)
        per_token = per_token + cfg.kl_coef * kl
    return cfg.objective.aggregate(per_token, mask, totals), (old, truncated, clip_low, clip_high, kl)


def _micro_step(model, mb: Rollouts, idx: list[int], old_logp, ref_logp,
                cfg: UpdateConfig, totals: Totals, shared: bool) -> dict[str, float]:
    """Forward + backward of one micro-batch; returns its token SUMS for the statistics.

    `old_logp` None: the policy has not moved since the rollouts' log-probs would have been
    taken (the first and only mini-batch), so old = current, detached: the ratio is 1 with
    the gradient of the ratio, without a separate no-grad pass over the batch.
    """
    device = next(model.parameters()).device
    logits, batch = _logits(model, mb.prompt_ids, mb.response_ids, idx, cfg.compute_dtype, shared, cfg.fp32_head)
    mask = model_token_mask(batch["mask"], mb.loss_mask, idx)
    old = None if old_logp is None else _pad_rows(old_logp, idx, device)
    engine = _pad_rows(mb.engine_logprobs, idx, device)
    adv = mb.advantages[idx].to(device)
    ref = None if ref_logp is None else _pad_rows(ref_logp, idx, device)

    def loss_of(lp):  # the segments' layout -> per sample (`_per_sample`) -> the objective
        return _policy_loss(_per_sample(lp, batch), old, engine, adv, ref, mask, cfg, totals)

    if cfg.fuses:
        loss, logp, entropy = fused_loss(logits, batch["targets"], cfg.temperature, lambda lp: loss_of(lp)[0],
                                         fp32_head=cfg.fp32_head)
        with torch.no_grad():
            _, (old, truncated, clip_low, clip_high, kl) = loss_of(logp)
    else:
        logp, entropy = token_logp(logits, batch["targets"], cfg.temperature, with_entropy=True,
                                   fp32_head=cfg.fp32_head)
        loss, (old, truncated, clip_low, clip_high, kl) = loss_of(logp)
    loss.backward()

    with torch.no_grad():
        entropy = _per_sample(entropy, batch)
        ratio = is_ratio(old, engine)
        return {
            "loss": loss.item(),
            "pg_clipfrac_low": token_sum(clip_low.float(), mask).item(),
            "pg_clipfrac_high": token_sum(clip_high.float(), mask).item(),
            "kl": token_sum(kl.detach(), mask).item(),
            "entropy": token_sum(entropy, mask).item(),
            "is_ratio_mean": token_sum(ratio, mask).item(),
            "is_truncated_frac": token_sum(truncated.float(), mask).item(),
            # The sampler/learner mismatch: k3 estimate of KL(engine || trainer) on the engine's
            # own tokens (r - 1 - log r, r = trainer / engine) and the sum of r^2 for the ESS.
            "mismatch_kl": token_sum(ratio - 1 - torch.log(ratio), mask).item(),
            "is_ratio_sq": token_sum(ratio * ratio, mask).item(),
        }


STAT_KEYS = ("loss", "pg_clipfrac_low", "pg_clipfrac_high", "kl", "entropy", "is_ratio_mean",
             "is_truncated_frac", "mismatch_kl", "is_ratio_sq")


def _clip_grad_norm(params: list, max_norm: float | None) -> float:
    """Global grad norm before clipping; clips to `max_norm` (None: no clipping). Sharded
    (DTensor) gradients: the norm is reduced over ranks first, as torchtitan does."""
    if not params:
        return 0.0
    total = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def _grad_params(model, optimizer) -> list:
    """The tensors whose `.grad` hold the mini-batch's gradient: the model's parameters, or an
    optimizer's own float32 copies where it sums micro-batches there (trainer/optim/offload.py)."""
    own = getattr(optimizer, "grad_params", None)
    return own() if own is not None else [p for p in model.parameters() if p.grad is not None]


def ppo_update(model, optimizer, minibatch: Rollouts, old_logp, ref_logp,
               cfg: UpdateConfig, max_tokens: int) -> dict[str, float]:
    """One PPO optimizer step on a mini-batch, micro-batched; returns the step's statistics.

    Valid tokens are the model's own: padding and an environment's tokens (`loss_mask` 0,
    multi-turn) carry no loss, ratio, KL or entropy and are not counted (`model_token_mask`).
    Loss per valid token = is_weight * the objective's term (`cfg.loss`, trainer/algo/objectives.py)
    + kl_coef * KL estimator (the KL term is not IS-weighted and is skipped when `ref_logp` is
    None), aggregated over the mini-batch as the objective says (ppo and cispo: divided by its
    total valid tokens). Tokens dropped by IS truncation stay in that denominator (they count
    as seen, with zero policy-gradient weight).
    All statistics are token-weighted means over the mini-batch, except `loss` (the
    mini-batch loss itself), `grad_norm` (the global norm before clipping) and `is_ess`.

    `old_logp` None means old = current (detached): only right for the first mini-batch of
    a step, before any optimizer step (`trainer.step.train_on_batch` passes None when there is
    one).

    A mini-batch whose loss or gradient norm is not finite is not applied (the weights and the
    optimizer state stay as they were); `skipped` = 1 says so and the caller counts them.
    """
    if minibatch.advantages is None:
        raise ValueError("minibatch.advantages is None: compute advantages before the update")
    # On many ranks the mini-batch is the union of every rank's share: its token count (the
    # loss denominator) and the statistics are sums over ranks (trainer/collectives.py).
    # Tokens that carry loss: the model's own (an environment's tokens are context only).
    n_tokens, n_samples = (int(v) for v in distributed.all_sum_floats(
        [sum(minibatch.model_lengths()), len(minibatch.response_ids)]))
    sizes = Totals(tokens=n_tokens, samples=n_samples, max_new_tokens=cfg.max_new_tokens)
    totals = dict.fromkeys(STAT_KEYS, 0.0)
    chunks, shared = _chunks(model, minibatch.prompt_ids, minibatch.response_ids, max_tokens, cfg.shared_prefix,
                             cfg.pack)
    pad = distributed.pad_count(model, len(chunks))  # before any forward: it is a collective too
    last = len(chunks) + pad - 1  # every rank runs as many backwards: the last syncs gradients
    for i, chunk in enumerate(chunks):
        distributed.gradient_sync(model, i == last)
        for k, v in _micro_step(model, minibatch, chunk, old_logp, ref_logp, cfg, sizes, shared).items():
            totals[k] += v
    for i in range(len(chunks), last + 1):
        distributed.gradient_sync(model, i == last)
        distributed.dummy_pass(model, backward=True)
    distributed.all_reduce_replicated_grads(model)  # LoRA on ranks: the adapter's gradients
    if distributed.active():
        totals = dict(zip(STAT_KEYS, distributed.all_sum_floats([totals[k] for k in STAT_KEYS])))

    grad_norm = _clip_grad_norm(_grad_params(model, optimizer), cfg.grad_clip)
    finite = math.isfinite(totals["loss"]) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    denom = max(n_tokens, 1)
    stats = {k: (v if k == "loss" else v / denom) for k, v in totals.items() if k != "is_ratio_sq"}
    # Normalised effective sample size of the trainer/engine token weights: (sum r)^2 /
    # (n sum r^2), 1 when the two policies agree, towards 1/n when a few tokens dominate.
    stats["is_ess"] = totals["is_ratio_mean"] ** 2 / (denom * totals["is_ratio_sq"]) if totals["is_ratio_sq"] > 0 else 1.0
    stats["grad_norm"] = grad_norm
    stats["skipped"] = 0.0 if finite else 1.0
    stats["n_tokens"] = n_tokens
    return stats
