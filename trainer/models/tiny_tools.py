"""Warm-starting `builtin:tiny` on multi-turn transcripts (tool calls, tool answers, final answer).

`trainer.models.tiny.warm_start` fits (prompt text, completion text) pairs: one model turn. A
multi-turn episode is laid out differently by the driver (`trainer.rollouts.multiturn`) for a
tokenizer without a chat template (`trainer.rollouts.chat_tokens`):

    opening ids | turn 1 ids, <eos> | reply ids | turn 2 ids, <eos> | ...

with the model's end-of-turn token kept in the context (its sampled ids are never re-tokenised)
and the environment's reply rendered as `plain_reply` renders it. Text pairs cannot hold an
<eos> in the middle of a prompt (the character encoder spells "<eos>" out), so this module fits
id sequences with a loss mask: the model's turns (each with its <eos>) carry the loss, the
opening and the replies do not, exactly where the driver's loss mask is 1 and 0.

`transcript_ids` builds one such sequence; `warm_start_transcripts` runs the supervised pass
over many (the same optimiser, batch and shared-prefix trick as `tiny.warm_start`) and stops
when `score_fn(model)` (the caller's hold-out pass rate, e.g. episodes run against the tool)
reaches `aim`, keeping the last in-band weights as the single-turn warm start does.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable

import torch

from trainer.models.tiny import EOS, PAD, VOCAB, _on_warm_start_threads, _sft_loss, encode
from trainer.rollouts.chat_tokens import plain_opening, plain_reply

Message = dict[str, Any]
# (prompt ids, completion ids, completion loss mask): one transcript as the driver lays it out.
Transcript = tuple[list[int], list[int], list[int]]


def transcript_ids(opening: list[Message], tools: list[dict[str, Any]] | None,
                   turns: list[tuple[str, list[Message] | None]]) -> Transcript:
    """One episode's ids: `opening` (the environment's first messages) under the plain format
    with the tools' signatures, then per turn the model's text and <eos> (mask 1) and, where the
    turn is followed by the environment's reply messages, their rendering (mask 0)."""
    prompt = encode(plain_opening(opening, tools))
    ids: list[int] = []
    mask: list[int] = []
    for text, reply in turns:
        turn = encode(text) + [VOCAB[EOS]]
        ids += turn
        mask += [1] * len(turn)
        if reply:
            env = encode(plain_reply(reply))
            ids += env
            mask += [0] * len(env)
    return prompt, ids, mask


def _batch(rows: list[Transcript], skip: int):
    seqs = [p[skip:] + c for p, c, _ in rows]
    labels = [[-100] * (len(p) - skip) + [t if m else -100 for t, m in zip(c, k)] for p, c, k in rows]
    width = max(map(len, seqs))
    ids = torch.full((len(rows), width), VOCAB[PAD], dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (s, lb) in enumerate(zip(seqs, labels)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(lb)] = torch.tensor(lb)
        att[i, :len(s)] = 1
    return ids, lab, att


def _shared_prefix(rows: list[Transcript]) -> list[int]:
    """The prompt ids every transcript starts with, less one (the loss needs the last prompt
    token inside the per-example part)."""
    first = rows[0][0]
    k = min(len(p) for p, _, _ in rows) - 1
    for p, _, _ in rows:
        while k > 0 and p[:k] != first[:k]:
            k -= 1
    return first[:max(0, k)]


@_on_warm_start_threads
def warm_start_transcripts(model, transcripts: list[Transcript], *, seed: int,
                           score_fn: Callable[[Any, int], float], target=(0.05, 0.60),
                           aim: float = 0.45, max_steps: int = 1200, eval_every: int = 25,
                           batch_size: int = 32, lr: float = 2e-3, warmup_steps: int = 50,
                           log: Callable[[str], None] | None = None) -> dict:
    """Supervised pass over `transcripts` until `score_fn(model, seed)` >= `aim` (inside
    `target`) or `max_steps`; returns {steps, pass_rate, seconds, history}. As in
    `tiny.warm_start`, a final rate outside `target` restores the last in-band weights."""
    if not transcripts:
        raise ValueError("no transcripts to warm-start on")
    rng = random.Random(seed)
    rows = sorted(transcripts)   # canonical order: the draws depend on the seed alone
    prefix = _shared_prefix(rows)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    t0, step, history, in_band, rate = time.monotonic(), 0, [], None, 0.0
    while step < max_steps:
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup_steps)
        batch = _batch([rows[rng.randrange(len(rows))] for _ in range(batch_size)], len(prefix))
        loss = _sft_loss(model, prefix, *batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % eval_every:
            continue
        model.eval()
        rate = float(score_fn(model, seed + step))
        history.append((step, round(loss.item(), 4), rate))
        if log is not None:
            log(f"warm start (transcripts): step {step} loss {loss.item():.3f} pass@1 {rate:.3f} "
                f"({time.monotonic() - t0:.0f} s)")
        if target[0] <= rate <= target[1]:
            in_band = (rate, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if rate >= aim:
            break
    if not target[0] <= rate <= target[1] and in_band is not None:
        model.load_state_dict(in_band[1])
        rate = in_band[0]
    model.eval()
    return {"steps": step, "pass_rate": rate, "seconds": time.monotonic() - t0, "history": history}
