"""`model.path: builtin:tiny`: a small Qwen2 model with a character-level tokenizer, no download.

Nothing can be fetched from a model hub on the workers, yet demos and tests need a policy that
already gets *some* answers right (RL learns nothing from all-wrong groups). So the model is
built here from a config, deterministically from the seed, and warm-started with a short
supervised pass on the job's own training examples until its sampled pass@1 (temperature 1)
on hold-out prompts (training questions that are not eval questions: `trainer.run.warm_start_holdout`)
lands in a target band. The result is saved as an ordinary HF folder
(config, safetensors, tokenizer, generation config) that transformers and vLLM load unchanged,
and cached by a key the caller derives from (task, config, seed).

Determinism: weights, data order and evaluation samples come from the seed, and the pass is
bounded by a step count (not by time), so two builds with the same inputs give identical weights
(same torch build and CPU kind). The pass runs on one torch thread whatever the process's count
(`WARM_START_THREADS`), so the thread count no longer changes the result. `max_sft_seconds` adds
an optional wall-clock cap for callers that prefer a bounded build time to reproducibility.

Shipped seeds: the demo's model (examples/demo.yaml) comes with the package (`SEEDS_DIR`), the
same folder this build writes for its key, so a fresh machine's first job skips the ten
minutes of SFT; any other task is built as above.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIALS = (PAD, EOS, UNK)
# Printable ASCII (space .. ~) plus newline and tab: enough for any task prompt we build; other
# characters map to <unk> rather than failing.
CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n", "\t")
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}

SIZES = {
    # ~0.6 M parameters: fast enough to warm-start and to train on 2 CPU cores.
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),
    # ~24 M parameters: the benchmark's "bigger" model (compute-bound sooner).
    "25m": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=2),
}

ScoreFn = Callable[[list[str], list[str]], list[bool]]
# on_progress(done, total, message): the build's progress, for job events and the CLI's line.
ProgressFn = Callable[[int, int, str], None]
# The build reports at least this often (seconds) between hold-out evaluations.
PROGRESS_EVERY_S = 2.0
# torch threads of the warm start. Its matmuls are small (64 sequences of ~60 tokens): a second
# thread gained little on a quiet 2-core machine, and on shared cores it spin-waited for a
# descheduled partner: 16 s per SFT step with 2 threads against 1.5 s with 1 on the same
# loaded machine (load ~15). One thread also makes the weights independent of the machine's count.
WARM_START_THREADS = 1


def _byte_symbol(ch: str) -> str:
    """GPT-2 byte-level symbol of a one-byte character (' ' -> 'Ġ', newline -> 'Ċ', 'a' -> 'a')."""
    from tokenizers.pre_tokenizers import ByteLevel

    table = {chr(b): sym for b, sym in zip(range(256), _byte_alphabet(ByteLevel))}
    return table[ch]


def _byte_alphabet(byte_level) -> list[str]:
    # The alphabet is returned unordered; rebuild GPT-2's byte -> symbol order explicitly.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    assert set(out.values()) == set(byte_level.alphabet())
    return [out[b] for b in range(256)]


def build_tokenizer():
    """The character-level tokenizer: one token per character, no BOS, `<eos>` ends a reply.

    Simplification vs a plain WordLevel/Split/Fuse tokenizer wrapped in PreTrainedTokenizerFast: transformers
    5.19's AutoTokenizer always loads a `model_type: qwen2` folder as `Qwen2Tokenizer`, which
    rebuilds a byte-level BPE from the saved vocabulary, so a plain character vocabulary loses
    its spaces and newlines on reload. The vocabulary is therefore stored in byte-level form
    (' ' as 'Ġ', newline as 'Ċ') with no merges: one token per character both as built here
    and as AutoTokenizer / vLLM load it back (tests/trainer/models/test_tiny_model.py checks this).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {(tok if tok in SPECIALS else _byte_symbol(tok)): i for tok, i in VOCAB.items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left", clean_up_tokenization_spaces=False)


def encode(text: str) -> list[int]:
    """Same ids as `build_tokenizer()` gives, without the tokenizer call (hot SFT loop)."""
    unk = VOCAB[UNK]
    return [VOCAB.get(ch, unk) for ch in text]


def build_untrained(seed: int, *, size: str = "tiny", max_position_embeddings: int = 4096):
    """(model, tokenizer): the randomly initialised Qwen2 model, same weights for the same seed."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(VOCAB), tie_word_embeddings=True,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=None, eos_token_id=VOCAB[EOS], pad_token_id=VOCAB[PAD],
        **SIZES[size])
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=VOCAB[EOS], pad_token_id=VOCAB[PAD], bos_token_id=None)
    return model, tokenizer


def save_folder(model, tokenizer, out_dir: Path) -> Path:
    """Save model + tokenizer into one HF folder (what vLLM and transformers load)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# --------------------------------------------------------------------------- warm start


def _sft_batch(pairs: list[tuple[str, str]], rng: random.Random, batch_size: int, skip: int):
    """Teacher-forcing batch of pairs drawn uniformly (with replacement).

    Token ids start after the first `skip` prompt characters (the prefix all prompts share,
    see `_sft_loss`). Right-padded; labels are -100 except on the completion and its eos.
    """
    rows = [pairs[rng.randrange(len(pairs))] for _ in range(batch_size)]
    seqs, labels = [], []
    for prompt, completion in rows:
        p, c = encode(prompt[skip:]), encode(completion) + [VOCAB[EOS]]
        seqs.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(map(len, seqs))
    ids = torch.full((batch_size, width), VOCAB[PAD], dtype=torch.long)
    lab = torch.full((batch_size, width), -100, dtype=torch.long)
    mask = torch.zeros((batch_size, width), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(l)] = torch.tensor(l)
        mask[i, :len(s)] = 1
    return ids, lab, mask


def _shared_prefix(pairs: list[tuple[str, str]]) -> str:
    """The text every prompt starts with, minus at least one character (the loss needs the
    last prompt token inside the per-example part)."""
    prompts = [p for p, _ in pairs]
    return os.path.commonprefix(prompts)[:max(0, min(map(len, prompts)) - 1)]


def _sft_loss(model, prefix: list[int], ids, lab, mask) -> torch.Tensor:
    """Mean completion-token cross-entropy, running the shared prompt prefix only once.

    Task prompts share a long fixed preamble (chain_sum: ~40 % of the tokens). It is run
    with batch size 1 and its KV cache repeated over the batch (the copy is differentiable,
    so its gradient is the sum over the batch, as in a full forward); the result equals the
    plain teacher-forced loss on prefix + ids.
    """
    batch, k = ids.shape[0], len(prefix)
    if k == 0:
        return model(input_ids=ids, attention_mask=mask, labels=lab).loss
    cache = model.model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
    cache.batch_repeat_interleave(batch)
    full_mask = torch.cat([torch.ones((batch, k), dtype=mask.dtype), mask], 1)
    pos = torch.arange(k, k + ids.shape[1]).expand(batch, -1)
    logits = model(input_ids=ids, attention_mask=full_mask, position_ids=pos,
                   past_key_values=cache, use_cache=True).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), lab[:, 1:].reshape(-1),
        ignore_index=-100)


def sampled_pass_rate(model, prompts: list[str], score_fn: ScoreFn, *, seed: int,
                      max_new_tokens: int) -> float:
    """pass@1 of one temperature-1 sample per prompt, sampled by the HF engine's own loop."""
    from trainer.engines.hf_engine import HFEngine
    from trainer.rollouts import SamplingConfig

    engine = HFEngine(model, VOCAB[EOS], seed=seed, pad_id=VOCAB[PAD])
    gen = engine.generate([encode(p) for p in prompts],
                          SamplingConfig(n=1, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed))
    texts = [_decode(ids) for ids in gen.token_ids]
    ok = score_fn(prompts, texts)
    return sum(map(bool, ok)) / max(1, len(ok))


def _decode(ids: list[int]) -> str:
    inv = _INV_VOCAB
    return "".join(inv[i] for i in ids if i >= len(SPECIALS))


_INV_VOCAB = {i: t for t, i in VOCAB.items()}


def _on_warm_start_threads(fn):
    """Run `fn` with torch's intra-op thread count at `WARM_START_THREADS`, restored after."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(WARM_START_THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)
    return wrapper


@_on_warm_start_threads
def warm_start(model, *, seed: int, sft_pairs: list[tuple[str, str]], score_fn: ScoreFn,
               holdout_prompts: list[str], target=(0.05, 0.60), aim: float = 0.45,
               max_steps: int = 1200, max_sft_seconds: float | None = None, eval_every: int = 25,
               batch_size: int = 64, lr: float = 2e-3, warmup_steps: int = 50,
               stop_check: Callable[[], None] | None = None,
               on_progress: ProgressFn | None = None) -> dict:
    """Supervised pass until sampled pass@1 >= `aim` (inside `target`), or a cap is hit.

    Returns a small report {steps, pass_rate, seconds, history}. If the final pass rate is
    outside `target`, the last evaluated weights that were inside the band are restored.
    `on_progress(step, max_steps, message)` hears of the pass every `PROGRESS_EVERY_S` seconds
    at most and after each evaluation; its last call says (max_steps, max_steps), as the pass
    may stop early.
    """
    rng = random.Random(seed)
    # Uniform draws over all training pairs: the model must come out broadly, not narrowly,
    # competent, since RL sharpens what it already samples sometimes. On chain_sum (2 one-digit
    # terms) uniform SFT stopped at pass@1 ~0.4 had pass@8 ~0.9 and RL then raised eval pass@1;
    # an earlier shortest-first curriculum covered ~25 % of the questions (pass@8 0.2) and RL
    # could not move it. On the harder chain_sum (2-3 terms, <= 2 digits) uniform draws got
    # into the band no later than that curriculum did.
    # `aim` 0.45: the demo's build stopped earlier (step 275, hold-out 0.36) gained about half as
    # much from the demo's RL (+0.06 vs +0.10 eval pass@1 in 25 steps, docs/results.md
    # section 0); the hold-out pass rate is noisy (+-0.06), hence the margin to 0.60.
    pairs = sorted(sft_pairs)  # canonical order: the draws depend on the seed, not on input order
    prefix = _shared_prefix(pairs)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    max_new = max(len(encode(c)) for _, c in sft_pairs) + 4
    t0, step, history, in_band = time.monotonic(), 0, [], None
    rate = 0.0
    report = _throttled(on_progress, max_steps)
    report(0, f"warm start: SFT on {len(pairs)} examples, up to {max_steps} steps", force=True)
    while step < max_steps and (max_sft_seconds is None or time.monotonic() - t0 < max_sft_seconds):
        if stop_check is not None:
            stop_check()  # minutes of CPU: a cancel must not wait for the end of it
        model.train()
        # Short linear warm-up; then constant: the pass is stopped early by the band anyway.
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup_steps)
        batch = _sft_batch(pairs, rng, batch_size, len(prefix))
        loss = _sft_loss(model, encode(prefix), *batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % eval_every:
            report(step, f"warm start: step {step}, loss {loss.item():.3f}")
            continue
        rate = sampled_pass_rate(model, holdout_prompts, score_fn, seed=seed + step,
                                 max_new_tokens=max_new)
        history.append((step, round(loss.item(), 4), rate))
        log.info("tiny warm start: step %d loss %.3f pass@1 %.3f", step, loss.item(), rate)
        if target[0] <= rate <= target[1]:
            in_band = (rate, {k: v.detach().clone() for k, v in model.state_dict().items()})
        report(step, f"warm start: step {step}, loss {loss.item():.3f}, "
                     f"sampled pass@1 {rate:.2f} (aim {aim:.2f})", force=True)
        if rate >= aim:
            break
    if not target[0] <= rate <= target[1] and in_band is not None:
        # Overshot the band, or the time ran out after a noisy dip: the last in-band weights.
        model.load_state_dict(in_band[1])
        rate = in_band[0]
    model.eval()
    if not target[0] <= rate <= target[1]:
        log.warning("tiny warm start ended outside the target band: pass@1 %.3f after %d steps",
                    rate, step)
    report(max_steps, f"warm start done: {step} steps, sampled pass@1 {rate:.2f}", force=True)
    return {"steps": step, "pass_rate": rate, "seconds": time.monotonic() - t0, "history": history}


def _throttled(on_progress: ProgressFn | None, total: int):
    """report(done, message, force=False): calls `on_progress` when forced or when
    `PROGRESS_EVERY_S` has passed since its last call; nothing without a callback."""
    last = [float("-inf")]

    def report(done: int, message: str, force: bool = False) -> None:
        now = time.monotonic()
        if on_progress is not None and (force or now - last[0] >= PROGRESS_EVERY_S):
            last[0] = now
            on_progress(min(done, total), total, message)
    return report


# --------------------------------------------------------------------------- build + cache


def build_tiny_model(out_dir: Path, *, seed: int, sft_pairs: list[tuple[str, str]],
                     score_fn: ScoreFn, holdout_prompts: list[str], target=(0.05, 0.60),
                     aim: float = 0.45, max_sft_steps: int = 1200,
                     max_sft_seconds: float | None = None, size: str = "tiny",
                     stop_check: Callable[[], None] | None = None,
                     on_progress: ProgressFn | None = None) -> Path:
    """Build, warm-start and save the builtin model into `out_dir`; returns `out_dir`.

    With no `sft_pairs` the randomly initialised model is saved (benchmarks need no skill).
    `on_progress(done, total, message)`: see `warm_start` (no call without `sft_pairs`).
    """
    torch.manual_seed(seed)
    longest = max((len(p) + len(c) for p, c in sft_pairs), default=0)
    # Room for the prompts plus generous replies; rope needs no more than the engine uses.
    max_pos = max(2048, 2 ** math.ceil(math.log2(longest + 512))) if longest else 4096
    model, tokenizer = build_untrained(seed, size=size, max_position_embeddings=max_pos)
    report = None
    if sft_pairs:
        report = warm_start(model, seed=seed, sft_pairs=sft_pairs, score_fn=score_fn,
                            holdout_prompts=holdout_prompts, target=target, aim=aim,
                            max_sft_seconds=max_sft_seconds, max_steps=max_sft_steps,
                            stop_check=stop_check, on_progress=on_progress)
    save_folder(model, tokenizer, out_dir)
    if report is not None:
        import json
        (Path(out_dir) / "warm_start.json").write_text(json.dumps(report, indent=1))
    return Path(out_dir)


# Warm starts shipped with the package, by cache key: the demo's (examples/demo.yaml), so a
# fresh machine's first job trains at once instead of after minutes of SFT on 2 cores. Each is
# what `build_tiny_model` writes for that key (regenerate: `python -m trainer.tiny_seeds`).
SEEDS_DIR = Path(__file__).parent / "seeds"


def shipped_seed(key: str) -> Path | None:
    """The shipped warm-started folder for `key`, if the package has one."""
    folder = SEEDS_DIR / f"tiny-{key}"
    return folder if (folder / "config.json").exists() else None


def ensure_tiny_model(cache_dir: Path, key: str, **build_kwargs) -> Path:
    """The cached folder for `key`: copied from a shipped seed, or built, first if absent.

    Atomic: built in a temporary sibling folder, then renamed into place, so a crashed or
    concurrent build never leaves a half-written folder under the final name. If two workers
    race, the loser's rename fails and its copy is discarded (both are identical by design).
    """
    cache_dir = Path(cache_dir)
    final = cache_dir / f"tiny-{key}"
    if (final / "config.json").exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{key}-", dir=cache_dir))
    try:
        seed = shipped_seed(key)
        if seed is not None:
            log.info("builtin:tiny: the warm start shipped for this task (%s), no build", seed)
            shutil.copytree(seed, tmp, dirs_exist_ok=True)
        else:
            build_tiny_model(tmp, **build_kwargs)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
