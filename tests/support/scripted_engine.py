"""A rollout engine whose model turns are written by the test: `script(context_text, j)` gives
sample j's text for a prompt; its ids are the tokenizer's, EOS appended, cut at
`max_new_tokens` (unfinished then). Log-probs: `logprob(context_length, k)` for the turn's k-th
token (default -1.0 each). Records each call's prompts and sampling."""
from __future__ import annotations

from typing import Any, Callable

from trainer.rollouts import Generation


class ScriptedEngine:
    def __init__(self, tok: Any, script: Callable[[str, int], str],
                 logprob: Callable[[int, int], float] | None = None):
        self.tok, self.script, self.calls = tok, script, []
        self.logprob = logprob or (lambda context, k: -1.0)

    def generate(self, prompts, sampling) -> Generation:
        self.calls.append((prompts, sampling))
        out = Generation(prompt_index=[], token_ids=[], logprobs=[], finished=[])
        for p, prompt in enumerate(prompts):
            for j in range(sampling.n):
                ids = self.tok(self.script(self.tok.decode(prompt), j), add_special_tokens=False)["input_ids"]
                ids = ids + [self.tok.eos_token_id]
                out.prompt_index.append(p)
                out.finished.append(len(ids) <= sampling.max_new_tokens)
                ids = ids[:sampling.max_new_tokens]
                out.token_ids.append(ids)
                out.logprobs.append([self.logprob(len(prompt), k) for k in range(len(ids))])
        return out
