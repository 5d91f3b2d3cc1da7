"""builtin:tiny's warm start on multi-turn transcripts (trainer.models.tiny_tools): the ids it
fits are the ids the multi-turn driver produces, and only the model's turns carry loss."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import torch

from trainer.models.tiny import EOS, VOCAB, build_tokenizer, build_untrained
from trainer.models.tiny_tools import _batch, transcript_ids, warm_start_transcripts
from trainer.rollouts.batch import Generation, SamplingConfig
from trainer.rollouts.environments.base import EnvReply
from trainer.rollouts.environments.tool_schema import schemas
from trainer.rollouts.multiturn import run_episodes

TOOLS = schemas('def add(a: int, b: int) -> int:\n    """a + b"""\n    return a + b\n', False)
CALL = '<tool_call>{"name":"add","arguments":{"a":361,"b":-220}}</tool_call>'
QUESTION = "State the final answer: 361 - 220 =\nAnswer in <answer></answer>."


class AddEpisode:
    async def start(self):
        return [{"role": "user", "content": QUESTION}]

    async def step(self, turn):
        await asyncio.sleep(0)
        if not turn.tool_calls:
            return EnvReply(done=True)
        c = turn.tool_calls[0].arguments
        return EnvReply(messages=[{"role": "tool", "content": json.dumps(c["a"] + c["b"]),
                                   "tool_call_id": turn.tool_calls[0].id, "name": "add"}], tool_calls=1)

    async def finish(self, transcript):
        return None

    async def close(self):
        pass


class AddEnv:
    tools = TOOLS

    def episode(self, example, sample):
        return AddEpisode()

    def close(self):
        pass


class Scripted:
    """Plays the transcript: the call first, then the answer once a tool response is in context."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, sampling):
        out = Generation(prompt_index=[], token_ids=[], logprobs=[], finished=[])
        for p, prompt in enumerate(prompts):
            text = "<answer>141</answer>" if "<tool_response>" in self.tok.decode(prompt) else CALL
            for _ in range(sampling.n):
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                out.prompt_index.append(p)
                out.token_ids.append(ids)
                out.logprobs.append([-1.0] * len(ids))
                out.finished.append(True)
        return out


class Scorer:
    def score(self, texts, examples, truncated):
        ok = [not t and "141" in x for x, t in zip(texts, truncated)]
        return SimpleNamespace(rewards=[float(c) for c in ok], correct=ok, scores=None)


def test_transcript_ids_are_the_drivers_ids_and_loss_mask():
    tok = build_tokenizer()
    eps = run_episodes(Scripted(tok), tok, AddEnv(), Scorer(),
                       [SimpleNamespace(question=QUESTION, answer="141", payload={})],
                       SamplingConfig(n=2, max_new_tokens=80), max_turns=3, max_total_tokens=200)
    assert eps.correct == [True, True] and eps.tool_calls == [1, 1]
    prompt, ids, mask = transcript_ids([{"role": "user", "content": QUESTION}], TOOLS, [
        (CALL, [{"role": "tool", "content": "141"}]), ("<answer>141</answer>", None)])
    assert eps.prompt_ids[0] == prompt
    assert eps.completion_ids[0] == ids
    assert eps.loss_mask[0] == mask
    assert ids.count(VOCAB[EOS]) == 2 and 0 in mask   # both turns closed; the reply carries no loss


def test_only_the_models_turns_are_labelled():
    prompt, ids, mask = transcript_ids([{"role": "user", "content": "q"}], TOOLS, [
        ("t1", [{"role": "tool", "content": "77"}]), ("t2", None)])
    _, lab, att = _batch([(prompt, ids, mask)], skip=0)
    labelled = [t for t in lab[0].tolist() if t != -100]
    assert labelled == [t for t, m in zip(ids, mask) if m]
    assert int(att.sum()) == len(prompt) + len(ids)


def test_warm_start_fits_transcripts_and_stops_at_the_aim():
    model, _ = build_untrained(0, max_position_embeddings=512)
    rows = [transcript_ids([{"role": "user", "content": f"{a} + {a} ="}], TOOLS, [
        (f'<tool_call>{{"name":"add","arguments":{{"a":{a},"b":{a}}}}}</tool_call>',
         [{"role": "tool", "content": str(2 * a)}]), (f"<answer>{2 * a}</answer>", None)])
        for a in range(10, 18)]
    prompt, ids, mask = rows[0]
    _, lab, att = _batch([rows[0]], skip=0)

    def loss() -> float:
        with torch.no_grad():
            seq = torch.tensor([prompt + ids])
            return float(model(input_ids=seq, attention_mask=att, labels=lab).loss)

    before, calls = loss(), []

    def score(m, seed):
        calls.append(seed)
        return 0.5 if len(calls) >= 2 else 0.0

    report = warm_start_transcripts(model, rows, seed=0, score_fn=score, aim=0.45, max_steps=200,
                                    eval_every=20, batch_size=8, warmup_steps=5)
    assert report["steps"] == 40 and report["pass_rate"] == 0.5   # stopped at the second check
    assert loss() < before - 0.5
