"""Rollouts with plain transformers: a hand-written sampling loop over the trainer's own model.

Why not `model.generate`: it would keep the logits of every step to report log-probs (at a
150k vocabulary and N = 512 that is gigabytes), and it re-runs the prompt for each of the n
samples. This loop (1) prefills each unique prompt once and copies its KV cache n times,
(2) reduces every step's logits to the sampled token's log-prob immediately, and (3) works in
chunks of at most `max_batch_tokens` (rows x sequence length) and of at most `max_kv_bytes` of
key/value cache, so the KV held at once is bounded whatever N x prompts and the response
length are. Prompts of different lengths in one chunk are left-padded, with explicit position
ids so padding does not shift positions.

Rows that have finished (EOS) are dropped from the forward once a quarter of the running rows
are done (`_generate_chunk`): with responses of very different lengths most of a chunk would
otherwise keep decoding tokens nobody reads. Sampling still draws over every row of the chunk
(finished rows with their last logits), because the sampler (`_draw`) takes one uniform per
row from the random stream: the tokens drawn are the same as without dropping rows.

The decode steps write each new key/value into a cache allocated once per chunk at its full
width (`_Preallocated`) instead of HF's default, which concatenates the whole cache with the
new token's at every step and layer (O(length^2) copying: ~a quarter of a 256-token
generation's time on the CPU). The attention reads the filled part as a view: same values,
same samples (`test_hf_preallocated_cache_keeps_the_samples`).

Prompts of one call that share a long common prefix (the opening of one prompt's
trajectories at every turn of a multi-turn episode, `trainer/rollouts/multiturn.py`) have it
prefilled once (`_plan_prefixes`: the prompts sorted, neighbours' common prefixes, groups chosen
to save the most prefill tokens): each group's prefix runs once, its keys/values are copied to
the group's prompts, and only each prompt's own suffix runs on top, left-padded in its own
block with the padding masked and explicit position ids that continue from the prefix length.
The row layout is [pad | prefix | pad | suffix], so the chunk bounds count that width. It is
only used on models whose every layer attends to the whole sequence (padding inside the row
would shift a sliding window), when a group's prefix is at least `min_shared_prefix` tokens
and the padded prefill shrinks by at least a quarter; otherwise (distinct prompts of a
single-turn step) the call runs as before. Same tokens and log-probs up to float rounding
(`tests/trainer/engines/test_hf_prefix.py`).

The engine uses the trainer's model object itself, so `sync_weights` has nothing to load and
nothing can be stale: it returns 0.0 at once. (Given a different module it copies the
state dict and checks the copy tensor by tensor.)
"""
from __future__ import annotations

import time

import torch
from transformers.cache_utils import DynamicLayer

from trainer.collectives import iter_full_state
from trainer.engines.base import WeightSyncError
from trainer.precision import autocast
from trainer.rollouts import Generation, SamplingConfig

# Key/value cache one generation chunk may hold (keys and values of every layer, all rows at
# the full prompt + max_new_tokens width, allocated at once: `_Preallocated`).
MAX_KV_BYTES = 512 * 2**20
# Shortest common prefix prompts of one call must share to have it prefilled once.
MIN_SHARED_PREFIX = 32


class HFEngine:
    name = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer_or_eos_id, *, seed: int = 0,
                 max_batch_tokens: int = 131_072, pad_id: int | None = None,
                 compute_dtype: torch.dtype = torch.float32, max_kv_bytes: int | None = None,
                 compact: bool = True, preallocate: bool = True,
                 min_shared_prefix: int | None = MIN_SHARED_PREFIX):
        self.model = model
        self.compute_dtype = compute_dtype
        if isinstance(tokenizer_or_eos_id, int):
            self.eos_id = tokenizer_or_eos_id
        else:
            self.eos_id = tokenizer_or_eos_id.eos_token_id
            if pad_id is None:
                pad_id = tokenizer_or_eos_id.pad_token_id
        # Pad positions are masked out, so any valid id works as filler.
        self.pad_id = self.eos_id if pad_id is None else pad_id
        # Stop on every EOS id of the model's generation_config (chat models list several,
        # e.g. <|im_end|> and <|endoftext|>), as vLLM does.
        self.eos_ids = sorted({self.eos_id, *_generation_eos_ids(model)} - {None})
        self.seed = seed
        self.max_batch_tokens = max_batch_tokens
        self.max_kv_bytes = MAX_KV_BYTES if max_kv_bytes is None else max_kv_bytes
        self.compact = compact
        self.preallocate = preallocate
        # None: never prefill a shared prefix once (every prompt whole, as before).
        self.min_shared_prefix = min_shared_prefix

    # ------------------------------------------------------------------ interface

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, *,
                 ignore_eos: bool = False) -> Generation:
        """P prompts x `sampling.n` samples, prompt-major (see engines/base.py for the contract)."""
        device = next(self.model.parameters()).device
        gen = torch.Generator(device=device).manual_seed(sampling.seed)
        out = Generation(prompt_index=[], token_ids=[], logprobs=[], finished=[])
        was_training = self.model.training
        self.model.eval()
        plan = self._plan_prefixes(prompts)
        if plan is None:
            width = max(map(len, prompts))
        else:
            width = max(plan[1]) + max(len(p) - n for p, n in zip(prompts, plan[1]))
        try:
            for chunk in self._chunks(prompts, sampling, width):
                shared = None if plan is None else ([plan[0][p] for p, _ in chunk], [plan[1][p] for p, _ in chunk])
                with autocast(device, self.compute_dtype):
                    ids, lps, fin = self._generate_chunk(
                        [prompts[p] for p, _ in chunk], [c for _, c in chunk], sampling, gen, ignore_eos,
                        shared)
                for (p, count) in chunk:
                    out.prompt_index.extend([p] * count)
                out.token_ids.extend(ids)
                out.logprobs.extend(lps)
                out.finished.extend(fin)
        finally:
            self.model.train(was_training)
        return out

    def sync_weights(self, model: torch.nn.Module) -> float:
        if model is self.model:
            return 0.0
        t0 = time.perf_counter()
        dst = self.model.state_dict()
        if set(dst) != set(model.state_dict()):
            raise WeightSyncError("HF engine copy and trainer model have different tensors")
        # Tensor by tensor (each gathered alone when `model` is sharded over ranks): no whole
        # second copy of the model is built on the way.
        with torch.no_grad():
            for k, v in iter_full_state(model):
                dst[k].copy_(v)
                if not torch.equal(dst[k].to(v.device, v.dtype), v):
                    raise WeightSyncError(f"HF engine copy of {k} differs from the trainer's")
        return time.perf_counter() - t0

    def close(self) -> None:
        self.model = None

    # ------------------------------------------------------------------ internals

    def _plan_prefixes(self, prompts: list[list[int]]):
        """(group id, prefix length) per prompt when prefilling shared prefixes once pays, else None.

        The prompts are sorted; a run of neighbours whose common prefixes are all at least
        `min_shared_prefix` long can share the shortest of them. Within a run, splitting at its
        shortest neighbour prefix (into runs that share longer ones) is chosen where it saves
        more prefill tokens ((members - 1) x prefix per group), so the openings of several
        prompts that also share a system prompt are grouped per opening. Each prefix stops at
        least one token short of its prompts (the suffix's last position gives the logits).
        A prompt in no group gets a "group" of its own whose prefix is as long as the longest
        shared one allows, which keeps the row width [prefix | suffix] near the longest prompt.
        Cheap when prompts share nothing: one sort and a slice comparison per neighbour pair.
        """
        least = self.min_shared_prefix
        if least is None or len(prompts) < 2 or _attention_window(self.model) is not None:
            return None
        order = sorted(range(len(prompts)), key=prompts.__getitem__)
        adj = [_common_prefix(prompts[a], prompts[b], least) for a, b in zip(order, order[1:])]
        if not any(adj):
            return None

        def best(lo: int, hi: int, depth: int = 0) -> tuple[int, list]:
            """Best grouping of sorted positions lo..hi (inclusive): (tokens saved, groups)."""
            if lo == hi:
                return 0, [([lo], 0)]
            low = min(adj[lo:hi])
            whole = (hi - lo) * low if low else -1
            if depth > 64 and whole >= 0:
                return whole, [(list(range(lo, hi + 1)), low)]
            saved, parts, start = 0, [], lo
            for i in range(lo, hi + 1):
                if i == hi or adj[i] == low:
                    s, g = best(start, i, depth + 1)
                    saved, start = saved + s, i + 1
                    parts.extend(g)
            if whole >= saved:
                return whole, [(list(range(lo, hi + 1)), low)]
            return saved, parts

        groups = best(0, len(order) - 1)[1]  # (sorted positions, prefix length) per group
        width = max(n for _, n in groups)
        group_of, prefix = [0] * len(prompts), [0] * len(prompts)
        for g, (members, n) in enumerate(groups):
            for m in members:
                p = order[m]
                group_of[p] = g
                # A prompt of its own: as much of it as fits the shared width in the prefix part.
                prefix[p] = n if len(members) > 1 else min(len(prompts[p]) - 1, width)
        # Padded prefill tokens (prefix rows + suffix rows) against every prompt whole.
        longest = max(map(len, prompts))
        suffix = max(len(p) - n for p, n in zip(prompts, prefix))
        total = len(groups) * max(prefix) + len(prompts) * suffix
        if 4 * total > 3 * len(prompts) * longest:
            return None
        return group_of, prefix

    def _chunks(self, prompts: list[list[int]], sampling: SamplingConfig, width: int | None = None):
        """Lists of (prompt index, sample count) whose rows fit `max_batch_tokens`.

        Rows of one prompt stay contiguous and in order, so concatenating the chunks keeps the
        prompt-major layout; a prompt whose n samples alone exceed the budget is split.
        `width`: a row's prompt part (the longest prompt, or the shared-prefix layout's width).
        """
        width = (max(map(len, prompts)) if width is None else width) + sampling.max_new_tokens
        max_rows = max(1, min(self.max_batch_tokens // width,
                              self.max_kv_bytes // (kv_bytes_per_token(self.model) * width)))
        chunk, rows = [], 0
        for p in range(len(prompts)):
            left = sampling.n
            while left:
                take = min(left, max_rows - rows)
                chunk.append((p, take))
                rows += take
                left -= take
                if rows == max_rows:
                    yield chunk
                    chunk, rows = [], 0
        if chunk:
            yield chunk

    def _left_padded(self, seqs: list[list[int]], device):
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(seqs):
            if p:
                ids[i, width - len(p):] = torch.tensor(p, device=device)
                mask[i, width - len(p):] = 1
        return ids, mask

    def _prefill_shared(self, prompts, shared, device):
        """Each group's prefix once, its cache copied to the group's prompts, then the suffixes
        on top: (output, attention mask over [prefix block | suffix block], position ids)."""
        group_of, prefix = shared
        first: dict[int, int] = {}
        for i, g in enumerate(group_of):
            first.setdefault(g, i)
        heads = list(first.values())
        row = torch.tensor([heads.index(first[g]) for g in group_of], device=device)
        ids, pmask = self._left_padded([prompts[i][:prefix[i]] for i in heads], device)
        ppos = (pmask.cumsum(-1) - 1).clamp(min=0)
        cache = self.model(input_ids=ids, attention_mask=pmask, position_ids=ppos, use_cache=True,
                           logits_to_keep=1).past_key_values
        cache.batch_select_indices(row)
        sids, smask = self._left_padded([p[n:] for p, n in zip(prompts, prefix)], device)
        spos = (smask.cumsum(-1) - 1).clamp(min=0) + torch.tensor(prefix, device=device)[:, None]
        mask = torch.cat([pmask[row], smask], -1)
        out = self.model(input_ids=sids, attention_mask=mask, position_ids=spos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        return out, mask, spos

    @torch.inference_mode()
    def _generate_chunk(self, prompts, counts, sampling, gen, ignore_eos, shared=None):
        device = next(self.model.parameters()).device
        if shared is not None and len(set(shared[0])) < len(prompts):
            out, mask, pos = self._prefill_shared(prompts, shared, device)
        else:
            ids, mask = self._left_padded(prompts, device)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            # Prefill the unique prompts once, then replicate their cache rows per sample. Only the
            # last position's logits are needed: logits_to_keep=1 skips a [P, width, V] projection.
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                             logits_to_keep=1)
        rep = torch.repeat_interleave(torch.arange(len(prompts), device=device),
                                      torch.tensor(counts, device=device))
        cache = out.past_key_values
        cache.batch_select_indices(rep)
        if self.preallocate:
            _preallocate(cache, sampling.max_new_tokens)
        logits, mask, pos = out.logits[rep, -1].float(), mask[rep], pos[rep, -1]
        rows = len(rep)
        toks = torch.empty((rows, sampling.max_new_tokens), dtype=torch.long, device=device)
        lps = torch.zeros((rows, sampling.max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(rows, dtype=torch.bool, device=device)
        length = torch.full((rows,), sampling.max_new_tokens, dtype=torch.long, device=device)
        live = torch.arange(rows, device=device)  # the rows the model still runs, in order
        for t in range(sampling.max_new_tokens):
            tok, lp = _sample(logits, sampling, gen)
            toks[:, t], lps[:, t] = tok, lp
            if not ignore_eos:
                hit = torch.isin(tok, torch.tensor(self.eos_ids, device=device)) & ~done
                length[hit] = t + 1
                done |= hit
                if bool(done.all()):
                    break
            if t + 1 == sampling.max_new_tokens:
                break
            if self.compact and not ignore_eos and 4 * int(done[live].sum()) >= len(live):
                keep = ~done[live]  # drop finished rows from the forward (module docstring)
                live, mask, pos = live[keep], mask[keep], pos[keep]
                cache.batch_select_indices(keep.nonzero().squeeze(1))
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=device)], -1)
            pos = pos + 1
            out = self.model(input_ids=tok[live, None], attention_mask=mask, position_ids=pos[:, None],
                             past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits[live] = out.logits[:, -1].float()
        length, toks, lps = length.tolist(), toks.tolist(), lps.tolist()
        return ([toks[i][:n] for i, n in enumerate(length)],
                [lps[i][:n] for i, n in enumerate(length)],
                done.tolist())


class _Preallocated(DynamicLayer):
    """A DynamicLayer whose keys/values live in a buffer allocated once at the chunk's full
    width: `update` writes the new tokens into it and `keys`/`values` are views of its filled
    part (HF's own grows by `torch.cat`, copying the whole cache at every step)."""

    def __init__(self, layer: DynamicLayer, extra: int):
        super().__init__()
        k, v = layer.keys, layer.values
        self.dtype, self.device, self.is_initialized = k.dtype, k.device, True
        self.length = k.shape[-2]
        shape = (*k.shape[:-2], self.length + extra, k.shape[-1])
        self.k_buf = k.new_empty(shape)
        self.v_buf = v.new_empty((*shape[:-1], v.shape[-1]))
        self.k_buf[..., :self.length, :] = k
        self.v_buf[..., :self.length, :] = v
        self._views()

    def _views(self) -> None:
        self.keys = self.k_buf[..., :self.length, :]
        self.values = self.v_buf[..., :self.length, :]

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        if self.length + n > self.k_buf.shape[-2]:  # past the width it was made for: grow
            self.k_buf = torch.cat([self.k_buf, self.k_buf.new_empty(self.k_buf.shape)], -2)
            self.v_buf = torch.cat([self.v_buf, self.v_buf.new_empty(self.v_buf.shape)], -2)
        self.k_buf[..., self.length:self.length + n, :] = key_states
        self.v_buf[..., self.length:self.length + n, :] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.k_buf, self.v_buf = self.k_buf[indices], self.v_buf[indices]
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.k_buf = self.k_buf.repeat_interleave(repeats, dim=0)
        self.v_buf = self.v_buf.repeat_interleave(repeats, dim=0)
        self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the generation loop never crops its cache")


def _preallocate(cache, extra: int) -> None:
    """Swap the cache's plain (full-attention) layers for `_Preallocated` ones with room for
    `extra` more tokens; sliding-window and other layer kinds keep HF's own."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            layers[i] = _Preallocated(layer, extra)


def _common_prefix(a: list[int], b: list[int], least: int) -> int:
    """Length of a and b's common prefix, capped one short of the shorter; 0 under `least`."""
    cap = min(len(a), len(b)) - 1
    if cap < least or a[:least] != b[:least]:
        return 0
    lo, hi = least, cap  # a[:lo] == b[:lo]; find the largest such lo <= cap by halving
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _attention_window(model) -> int | None:
    """The narrowest local attention span any layer uses (sliding window, attention chunk), or
    None when every layer attends to the whole sequence (as `trainer.optim.update`'s)."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    types = getattr(cfg, "layer_types", None)
    if types is not None and not any(t in ("sliding_attention", "chunked_attention") for t in types):
        return None
    if getattr(cfg, "use_sliding_window", True) is False and not getattr(cfg, "attention_chunk_size", None):
        return None
    spans = [s for s in (getattr(cfg, "sliding_window", None), getattr(cfg, "attention_chunk_size", None)) if s]
    return min(spans) if spans else None


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token keeps in the cache, over all layers."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return max(2 * cfg.num_hidden_layers * kv * head_dim * next(model.parameters()).element_size(), 1)


def _generation_eos_ids(model) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def _sample(logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator):
    """(token, log-prob under the distribution it was drawn from) per row.

    That is softmax(logits / T), and with top_p < 1 the nucleus renormalised, as vLLM's
    processed log-probs (engines/base.py). temperature 0 = greedy, raw-logit log-prob.
    """
    if sampling.temperature == 0:
        lp = torch.log_softmax(logits, -1)
        tok = lp.argmax(-1)
        return tok, lp.gather(-1, tok[:, None]).squeeze(-1)
    lp = torch.log_softmax(logits / sampling.temperature, -1)
    probs = lp.exp()
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = sorted_p.cumsum(-1) - sorted_p >= sampling.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        lp = lp - sorted_p.sum(-1, keepdim=True).log()  # renormalised over the nucleus
    tok = _draw(probs, gen)
    return tok, lp.gather(-1, tok[:, None]).squeeze(-1)


# Vocabulary entries per block of `_draw`'s two-level inverse CDF.
_BLOCK = 1024


def _draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row, drawn with probability probs[row] / probs[row].sum().

    Why not `torch.multinomial`: for one sample it draws an exponential variate for every
    vocabulary entry (the exponential-race trick), ~100 ms a step for 32 rows at a 152k
    vocabulary on one CPU thread: as long as the model's own forward. This is inverse-CDF
    sampling with one uniform per row: pick the block of `_BLOCK` entries from the blocks'
    sums (float32) accumulated in float64, then the entry from the block's own float64
    cumulative sum, ~1 ms.
    An entry of probability 0 (outside top_p's nucleus) is never drawn: the target mass is in
    (0, total], and the first entry whose cumulative mass reaches it has mass of its own.
    """
    rows, vocab = probs.shape
    full = vocab - vocab % _BLOCK
    sums = probs[:, :full].reshape(rows, -1, _BLOCK).sum(-1).double()
    if full < vocab:
        sums = torch.cat([sums, probs[:, full:].sum(-1, keepdim=True).double()], -1)
    cdf = torch.nn.functional.pad(sums.cumsum(-1), (1, 0))  # cdf[:, b]: the mass before block b
    total = cdf[:, -1]
    if not bool((torch.isfinite(total) & (total > 0)).all()):  # multinomial refused these too
        raise ValueError("the next-token probabilities are not finite or sum to 0 (NaN or inf "
                         "logits): the model's weights or its inputs have gone bad")
    u = (1 - torch.rand(rows, 1, generator=gen, dtype=torch.float64, device=probs.device)) * total[:, None]
    block = torch.searchsorted(cdf, u) - 1  # u > 0 = cdf[:, 0]: the block b with cdf[b] < u <= cdf[b+1]
    before = cdf.gather(-1, block)
    cols = block * _BLOCK + torch.arange(_BLOCK, device=probs.device)
    inner = probs.gather(-1, cols.clamp(max=vocab - 1)).masked_fill(cols >= vocab, 0).cumsum(-1, dtype=torch.float64)
    # The block's float32 sum and its float64 cumulative sum may differ in the last bits.
    rest = torch.minimum(u - before, inner[:, -1:])
    return cols.gather(-1, torch.searchsorted(inner, rest)).squeeze(-1)
