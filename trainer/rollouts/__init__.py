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
from trainer.rollouts.batch import Generation, Rollouts, SamplingConfig, concat_rollouts
from trainer.rollouts.generate import Episodes, encode_prompts, generate_and_score
from trainer.rollouts.multiturn import run_episodes

__all__ = ["Episodes", "Generation", "Rollouts", "SamplingConfig", "concat_rollouts", "encode_prompts",
           "generate_and_score", "run_episodes"]
