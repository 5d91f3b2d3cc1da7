"""The rollout room: prompts in, scored samples out, written once for every caller.

Training (`trainer.step`), evaluation (`trainer.evaluate`) and the pass@k probe
(`trainer.probe`) all sample through `generate_and_score` (generate.py): one engine call for
N samples of each prompt, decoding, scoring, and the grader's detail, handed back as one
typed `Episodes` batch that keeps the token ids exactly as the engine sampled them and a
per-token loss mask (None while every completion token is the model's: single-turn). The
training step turns it into `Rollouts` (batch.py), the batch the algorithm pieces work on;
evaluation and the probe count correct samples per prompt.

Multi-turn environments (`task.env`) go through `run_episodes` (multiturn.py), which returns
the same `Episodes`: a completion then holds the environment's tokens too (tool results,
observations, rendered by chat_tokens.py), with a 0 in the loss mask where they sit, and the
transcript, turns and tool-call counts per sample. The model's turns are parsed for tool calls
by tool_calls.py; the environments themselves live in environments/.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The names are imported on first use (PEP 562): the job spec checks a tools environment's
# source with environments/tools_env.py at submission, and the API that does so must not
# import torch, which batch.py does.
_HOME = {"Generation": "batch", "Rollouts": "batch", "SamplingConfig": "batch", "concat_rollouts": "batch",
         "Episodes": "generate", "encode_prompts": "generate", "generate_and_score": "generate",
         "run_episodes": "multiturn"}
__all__ = sorted(_HOME)

if TYPE_CHECKING:
    from trainer.rollouts.batch import Generation, Rollouts, SamplingConfig, concat_rollouts
    from trainer.rollouts.generate import Episodes, encode_prompts, generate_and_score
    from trainer.rollouts.multiturn import run_episodes


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
