"""The rollout room: prompts in, scored samples out, written once for every caller.

Training (`trainer.step`), evaluation (`trainer.evaluate`) and the pass@k probe
(`trainer.probe`) all sample through `generate_and_score` (generate.py): one engine call for
N samples of each prompt, decoding, scoring, and the grader's detail, handed back as one
typed `Episodes` batch that keeps the token ids exactly as the engine sampled them and a
per-token loss mask (None while every completion token is the model's: single-turn). The
training step turns it into `Rollouts` (batch.py), the batch the algorithm pieces work on;
evaluation and the probe count correct samples per prompt.

Later multi-turn environments extend `Episodes` rather than add a fourth path: a completion
then holds the environment's tokens too, with a 0 in the mask where they sit.
"""
from trainer.rollouts.batch import Generation, Rollouts, SamplingConfig, concat_rollouts
from trainer.rollouts.generate import Episodes, encode_prompts, generate_and_score

__all__ = ["Episodes", "Generation", "Rollouts", "SamplingConfig", "concat_rollouts", "encode_prompts",
           "generate_and_score"]
