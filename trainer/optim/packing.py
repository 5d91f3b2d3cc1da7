"""Packed micro-batches: several samples to a row of the update's forward, each seeing only
itself (a block-diagonal causal mask, per-sample positions), so long responses of different
lengths are not padded to the longest. Used by `trainer.optim.update` where `packs(model)`."""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from trainer.optim.logprobs import Segment
from trainer.optim.model_io import hidden_states_out, sliced_head
from trainer.precision import autocast


class Rows(list):
    """A packed micro-batch: its sample indices row after row (so whatever only iterates the
    samples sees a plain list) and `sizes`, how many samples each row holds."""

    def __init__(self, rows: list[list[int]]):
        super().__init__(i for r in rows for i in r)
        self.sizes = [len(r) for r in rows]

    def rows(self) -> list[list[int]]:
        out, s = [], 0
        for n in self.sizes:
            out.append(list(self[s:s + n]))
            s += n
        return out


def _first_fit(items: list[int], sizes: list[int], capacity: int) -> list[list[int]]:
    """`items` (longest first) into rows whose `sizes` sum to at most `capacity`, each into the
    first row with room; an item over `capacity` gets a row of its own."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in items:
        n = sizes[i]
        for k, f in enumerate(free):
            if n <= f:
                rows[k].append(i)
                free[k] -= n
                break
        else:
            rows.append([i])
            free.append(capacity - n)
    return rows


def packed_micro_batches(lengths: list[int], max_tokens: int) -> list[Rows]:
    """Samples packed into rows of at most the longest length (and `max_tokens`), rows grouped
    so each chunk's rows x its widest row <= max_tokens; a row over the budget runs alone."""
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows = _first_fit(order, lengths, min(max(lengths), max_tokens))
    chunks: list[list[list[int]]] = []
    width = 0
    for row in rows:  # first-fit decreasing: the fullest rows first
        fill = sum(lengths[i] for i in row)
        if chunks and (len(chunks[-1]) + 1) * max(width, fill) <= max_tokens:
            chunks[-1].append(row)
            width = max(width, fill)
        else:
            chunks.append([row])
            width = fill
    return [Rows(c) for c in chunks]


def packed_prefix_micro_batches(prompt_ids, response_ids, max_tokens: int,
                                prompt_weight: float = 0.0) -> list[Rows]:
    """The shared-prompt chunks, packed: each group's response inputs (a response's tokens but
    its last; its first is predicted by the prompt's last position) in rows of at most the
    longest one's length, a row holding one prompt's samples. A chunk costs its distinct
    prompts x their longest + rows x (widest row + `prompt_weight` x longest prompt): each row,
    not each sample, now holds a copy of its prompt's keys/values (`prompt_copy_weight`).

    Rows go into chunks in one of two orders, whichever costs fewer tokens in all: group by
    group (a chunk runs few prompts), or widest rows first across groups (the groups' last,
    part-filled rows share a chunk instead of being padded to a full row's width).
    """
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompt_ids):
        groups.setdefault(tuple(p), []).append(i)
    inputs = [max(len(r) - 1, 0) for r in response_ids]
    if not inputs:
        return []
    pmax = max(len(k) for k in groups)
    # A row no wider than what fits a chunk beside its prompt (an input over it gets its own).
    capacity = max(1, min(max(inputs), int(max_tokens - pmax * (1 + prompt_weight))))
    rows = []  # (prompt, fill, samples), group by group, longest prompts first
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[0])):
        for row in _first_fit(sorted(members, key=lambda i: -inputs[i]), inputs, capacity):
            rows.append((key, sum(inputs[i] for i in row), row))

    def chunked(order):
        chunks: list[list[list[int]]] = []
        costs: list[float] = []
        cur: list[list[int]] = []
        seen: set[tuple] = set()
        p_cur = w_cur = 0
        for key, fill, row in order:
            p2, w2 = max(p_cur, len(key)), max(w_cur, fill)
            cost = (len(seen) + (key not in seen)) * p2 + (len(cur) + 1) * (w2 + prompt_weight * p2)
            if cur and cost > max_tokens:
                chunks.append(cur)
                cur, seen, p2, w2 = [], set(), len(key), fill
                cost = p2 + w2 + prompt_weight * p2
            cur.append(row)
            seen.add(key)
            p_cur, w_cur = p2, w2
            if len(cur) == 1:
                costs.append(cost)
            else:
                costs[-1] = cost
        if cur:
            chunks.append(cur)
        return chunks, sum(costs)

    by_group = chunked(rows)
    by_width = chunked(sorted(rows, key=lambda r: -r[1]))
    return [Rows(c) for c in min(by_group, by_width, key=lambda cc: cc[1])[0]]


def _block_causal(seg: torch.Tensor) -> torch.Tensor:
    """[rows, W, W] bool: position q sees k <= q of its own sample (`seg` [rows, W] holds each
    position's sample; padding has an id of its own per position, so it sees itself only and
    no query row is empty)."""
    W = seg.shape[1]
    causal = torch.ones(W, W, dtype=torch.bool).tril_()
    return (seg.unsqueeze(2) == seg.unsqueeze(1)) & causal


def _row_layout(rows: list[list[int]], spans: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per packed row: `seg` [rows, W] (the sample's place in the chunk, or a unique negative id
    on padding), the offset of each sample in its row, and the width W."""
    W = max((sum(spans[k] for k in row) for row in rows), default=0)
    seg = -1 - torch.arange(len(rows) * W).view(len(rows), W)
    offset = torch.zeros(len(spans), dtype=torch.long)
    for r, row in enumerate(rows):
        o = 0
        for k in row:
            seg[r, o:o + spans[k]] = k
            offset[k] = o
            o += spans[k]
    return seg, offset, W


def _row_of(rows: list[list[int]], n: int) -> torch.Tensor:
    """[n] long: the row each sample (its place in the chunk) is packed into."""
    out = torch.zeros(n, dtype=torch.long)
    for r, row in enumerate(rows):
        out[row] = r
    return out


def _per_sample(flat: torch.Tensor, batch: dict) -> torch.Tensor:
    """[b, R] per sample (zeros past each response) of a packed forward's [1, N] per-token
    values; a padded forward's [b, R] as it is."""
    where = batch.get("scatter")
    if where is None:
        return flat
    b, R = batch["mask"].shape
    return flat.new_zeros(b * R).scatter(0, where, flat[0]).view(b, R)


def _flat_targets(response_ids, idx: list[int], first: int, device) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The chunk's mask and rlens, and per response token from `first` on (sample after sample)
    its sample's place in the chunk and its index, for the flat [1, N] layout."""
    rlens = torch.tensor([len(response_ids[i]) for i in idx])
    R = int(rlens.max()) if len(idx) else 0
    mask = torch.arange(R).unsqueeze(0) < rlens.unsqueeze(1)
    n = (rlens - first).clamp_min(0)
    sample = torch.repeat_interleave(torch.arange(len(idx)), n)
    start = torch.cumsum(n, 0) - n
    j = torch.arange(int(n.sum())) - start.repeat_interleave(n) + first
    return {"mask": mask.to(device), "rlens": rlens.tolist()}, sample, j


def _packed_logits(model, prompt_ids, response_ids, chunk: Rows,
                   compute_dtype: torch.dtype) -> tuple[list[Segment], dict]:
    """The plain forward on packed rows: each sample's prompt + response at its row offset,
    positions from 0, seeing only itself; one [1, N] segment over every response token."""
    device = next(model.parameters()).device
    idx = list(chunk)
    plens = torch.tensor([len(prompt_ids[i]) for i in idx])
    if len(idx) and int(plens.min()) == 0:
        raise ValueError("empty prompt: the first response token would have no predicting position")
    seqs = [prompt_ids[i] + response_ids[i] for i in idx]
    place = {i: k for k, i in enumerate(idx)}
    rows = [[place[i] for i in row] for row in chunk.rows()]
    seg, offset, W = _row_layout(rows, [len(s) for s in seqs])
    flat_ids = torch.zeros(len(rows) * W, dtype=torch.long)
    pos = torch.zeros(len(rows) * W, dtype=torch.long)
    base = _row_of(rows, len(idx)) * W + offset
    for k, s in enumerate(seqs):
        flat_ids[base[k]:base[k] + len(s)] = torch.tensor(s)
        pos[base[k]:base[k] + len(s)] = torch.arange(len(s))
    batch, sample, j = _flat_targets(response_ids, idx, 0, device)
    # Response token j of a sample is predicted at its row position plen - 1 + j.
    where = base[sample] + plens[sample] - 1 + j
    batch["targets"] = flat_ids[where + 1].unsqueeze(0).to(device)
    batch["scatter"] = (sample * batch["mask"].shape[1] + j).to(device)
    head = sliced_head(model)
    with autocast(device, compute_dtype), hidden_states_out(model, head is not None):
        out = model(input_ids=flat_ids.view(len(rows), W).to(device),
                    attention_mask=_block_causal(seg).unsqueeze(1).to(device),
                    position_ids=pos.view(len(rows), W).to(device), use_cache=False)
    x = out.logits.reshape(1, -1, out.logits.shape[-1])
    return [(x, where.unsqueeze(0).to(device), head)], batch


def _distinct_prompts(prompt_ids, idx: list[int]):
    """The chunk's distinct prompts: each sample's group, the prompts, their lengths, the
    padded prompt mask [G, P], and the last positions to project (`keep`, each group's `col`
    in it): only a prompt's last position predicts its responses' first token."""
    slots: dict[tuple, int] = {}
    group = torch.tensor([slots.setdefault(tuple(prompt_ids[i]), len(slots)) for i in idx])
    prompts = [torch.tensor(k, dtype=torch.long) for k in slots]
    plens = torch.tensor([len(p) for p in prompts])
    if int(plens.min()) == 0:
        raise ValueError("empty prompt: the first response token would have no predicting position")
    P = int(plens.max())
    pmask = torch.arange(P).unsqueeze(0) < plens.unsqueeze(1)
    keep = torch.unique(plens - 1)
    return group, prompts, plens, pmask, keep, torch.searchsorted(keep, plens - 1)


def _packed_prefix_logits(model, prompt_ids, response_ids, chunk: Rows,
                          compute_dtype: torch.dtype) -> tuple[list[Segment], dict]:
    """The shared-prompt forward on packed rows: one pass over the distinct prompts, then one
    over rows of response inputs, each row attending to its prompt's keys/values and each
    sample to itself. Two [1, .] segments: every sample's first token (from its prompt's last
    position), then the rest."""
    device = next(model.parameters()).device
    idx = list(chunk)
    place = {i: k for k, i in enumerate(idx)}
    rows = [[place[i] for i in row] for row in chunk.rows()]
    group, prompts, plens, pmask, keep, col = _distinct_prompts(prompt_ids, idx)
    G, P = pmask.shape
    rlens = torch.tensor([len(response_ids[i]) for i in idx])
    spans = (rlens - 1).clamp_min(0).tolist()
    seg, offset, W = _row_layout(rows, spans)
    row_group = torch.tensor([int(group[row[0]]) for row in rows], dtype=torch.long)
    flat_ids = torch.zeros(len(rows) * W, dtype=torch.long)
    pos = torch.zeros(len(rows) * W, dtype=torch.long)
    base = _row_of(rows, len(idx)) * W + offset
    for k, i in enumerate(idx):
        n = spans[k]
        if n:
            flat_ids[base[k]:base[k] + n] = torch.tensor(response_ids[i][:n])
            pos[base[k]:base[k] + n] = plens[group[k]] + torch.arange(n)
    batch, sample, j = _flat_targets(response_ids, idx, 1, device)
    R = batch["mask"].shape[1]
    # Every response's tokens one after another; a token is at its response's start + j.
    tokens = torch.tensor([t for i in idx for t in response_ids[i]], dtype=torch.long)
    start = torch.cumsum(rlens, 0) - rlens
    lead = torch.nonzero(rlens > 0).squeeze(1)
    targets = torch.cat([tokens[start[lead]], tokens[start[sample] + j]])
    batch["targets"] = targets.unsqueeze(0).to(device)
    batch["scatter"] = torch.cat([lead * R, sample * R + j]).to(device)
    head = sliced_head(model)
    with autocast(device, compute_dtype), hidden_states_out(model, head is not None):
        out = model(input_ids=pad_sequence(prompts, batch_first=True).to(device),
                    attention_mask=pmask.long().to(device), position_ids=torch.arange(P).expand(G, P).to(device),
                    logits_to_keep=keep.to(device), use_cache=True)
        xa = out.logits.reshape(1, -1, out.logits.shape[-1])
        parts = [(xa, (group[lead] * len(keep) + col[group[lead]]).unsqueeze(0).to(device), head)]
        if len(sample):
            cache = out.past_key_values
            cache.batch_select_indices(row_group.to(device))  # [G, ...] -> [rows, ...]; grads sum back
            mask = torch.cat([pmask[row_group].unsqueeze(1).expand(-1, W, -1), _block_causal(seg)], 2)
            out2 = model(input_ids=flat_ids.view(len(rows), W).to(device), attention_mask=mask.unsqueeze(1).to(device),
                         position_ids=pos.view(len(rows), W).to(device), past_key_values=cache, use_cache=True)
            # Response token j >= 1 of a sample is predicted by its input j - 1.
            parts.append((out2.logits.reshape(1, -1, out2.logits.shape[-1]),
                          (base[sample] + j - 1).unsqueeze(0).to(device), head))
    return parts, batch
