"""The job spec, version 1: one frozen pydantic model that is the whole job.

The API takes it as the request body, the database stores its JSON, the worker rebuilds it
and the trainer runs it. It must stay importable without torch: only pydantic, the standard
library and (lazily, for task-name checks) reasoning-gym. Field names are a contract that
clients, the dashboard and tests rely on (version 1: new fields are optional). Cross-field
rules live here so that bad input is refused before anything is queued, with a message naming
the field. Every field's description is user documentation: `brorl schema --markdown` (`make
docs`) turns them, with the bounds and defaults, into docs/jobspec.md.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

# The sections and shared parts live in their own modules; imported here so that
# `from trainer.spec import ...` stays the one place callers take spec names from.
from trainer.spec_base import (  # noqa: F401
    MAX_EVAL_K,
    MAX_KEEP_LAST,
    MAX_SAMPLES_PER_STEP,
    MAX_TASK_CONFIG_BYTES,
    MAX_TOTAL_STEPS,
    MAX_WALL_SECONDS,
    FieldError,
    _first_bad_text,
    _Frozen,
    text_problem,
)
from trainer.spec_model import (  # noqa: F401
    MAX_LORA_RANK,
    MAX_VLLM_LORA_RANK,
    TINY_LINEAR_MODULES,
    TINY_MIN_NEW_TOKENS,
    TINY_MODEL,
    LoraSpec,
    ModelSpec,
)
from trainer.spec_shaping import DifficultyFilterSpec, OverlongSpec  # noqa: F401 (re-exported)
from trainer.spec_continue import ContinueFrom  # noqa: F401 (re-exported)
from trainer.spec_task import (  # noqa: F401
    DatasetTask,
    ReasoningGymTask,
    TaskSpec,
    check_grader,
    reasoning_gym_task_names,
)


class Stage(_Frozen):
    n: int = Field(..., ge=2, le=4096, description="Rollouts per prompt.")
    prompts_per_step: int = Field(..., ge=1, le=8192, description=(
        f"Prompts per step; n x prompts_per_step is at most {MAX_SAMPLES_PER_STEP:,} samples per step."))
    steps: int = Field(..., ge=1, le=MAX_TOTAL_STEPS, description=(
        f"Steps of this stage; all stages together at most {MAX_TOTAL_STEPS:,}."))

    @property
    def samples_per_step(self) -> int:
        return self.n * self.prompts_per_step

    @model_validator(mode="after")
    def _budget(self) -> "Stage":
        if self.samples_per_step > MAX_SAMPLES_PER_STEP:
            raise ValueError(
                f"n x prompts_per_step = {self.samples_per_step} exceeds "
                f"{MAX_SAMPLES_PER_STEP} samples per step")
        return self


def _default_schedule() -> list[Stage]:
    return [Stage(n=16, prompts_per_step=64, steps=200), Stage(n=512, prompts_per_step=16, steps=100)]


class BroadenSpec(_Frozen):
    """Broaden on a plateau: when `metric` has not risen by `min_delta` over `patience`
    evaluations, the next stage starts with n x `factor` (up to `max_n`)."""

    metric: str = Field("eval/pass@1", pattern=r"^eval/pass@[0-9]{1,4}$",
                        description="An eval metric, eval/pass@k with k in eval.k (or 1).")
    patience: int = Field(2, ge=1, le=1000, description="Evaluations without improvement.")
    min_delta: float = Field(0.01, ge=0, le=1, description="Smallest rise that counts as improvement.")
    factor: int = Field(4, ge=2, le=64, description="n is multiplied by this at each broadening.")
    max_n: int = Field(512, ge=2, le=4096, description="n never grows past this.")
    prompts: Literal["keep_prompts", "keep_samples"] = Field(
        "keep_prompts", description="Prompts per step of a broadened stage: keep_prompts keeps the "
        "first stage's (samples per step grow with n); keep_samples divides them by the growth of "
        "n (never below min_prompts).")
    min_prompts: int = Field(
        8, ge=1, le=8192, description="keep_samples never goes below this many prompts per step: "
        "fewer prompts per update lost what the narrow stage learned (docs/results.md, section 6).")
    trigger: Literal["plateau", "probe"] = Field(
        "plateau", description="plateau: broaden at every plateau. probe: at a plateau, first probe the "
        "current policy (probe_n samples on probe_prompts eval prompts) and broaden only when the share "
        "of prompts all-wrong at the stage's n yet solved within probe_n is at least min_solvable "
        "(docs/probe.md); otherwise wait `patience` more evaluations and look again.")
    probe_n: int = Field(256, ge=4, le=4096, description="trigger probe: samples per prompt (>= max_n).")
    probe_prompts: int = Field(32, ge=1, le=1024, description="trigger probe: eval prompts probed.")
    min_solvable: float = Field(0.10, ge=0, le=1, description="trigger probe: the solvable all-wrong share "
                                "that justifies broadening (the probe rule's WATCH_MIN).")


class RolloutSpec(_Frozen):
    engine: Literal["auto", "vllm", "hf"] = Field(
        "auto", description="auto: vLLM on a CUDA device, the HF engine on a CPU, where it measured "
        "as fast or faster and needs no weight sync (docs/results.md, sections 2-3).")
    schedule: list[Stage] = Field(
        default_factory=_default_schedule, min_length=1, max_length=32,
        description="The broadening schedule: stages of (n, prompts_per_step, steps) run in order; "
                    "each stage's lr follows optim.lr_scaling and optim.lr_batch.")
    max_new_tokens: int = Field(256, ge=1, le=131_072, description=(
        f"Longest response in tokens; a longer one is cut and gets algo.truncated_reward. At least "
        f"{TINY_MIN_NEW_TOKENS} with builtin:tiny, which writes one character per token."))
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature of the rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the rollouts; 1 = off.")
    broaden: BroadenSpec | None = Field(
        None, description="Broaden on a plateau. It replaces later stages: give one stage, whose "
                          "steps are then the whole job's; each plateau starts a wider stage.")

    @field_validator("schedule")
    @classmethod
    def _total_steps(cls, stages: list[Stage]) -> list[Stage]:
        total = sum(s.steps for s in stages)
        if total > MAX_TOTAL_STEPS:
            raise ValueError(f"the stages add up to {total} steps; at most {MAX_TOTAL_STEPS}")
        return stages


# --------------------------------------------------------------------------- optim / algo


class OptimSpec(_Frozen):
    lr: float = Field(1e-6, gt=0, le=0.01, description="LR at the first stage's batch B0 = prompts x n.")
    lr_scaling: Literal["sqrt", "linear", "none"] = Field(
        "sqrt", description="Each stage's lr = lr x f(B / B0), f = sqrt (the paper), linear or none "
                            "(every stage keeps lr); B counts what lr_batch says.")
    lr_batch: Literal["prompts_capped", "samples"] = Field(
        "prompts_capped", description="What lr_scaling's batch ratio counts. samples: B = prompts x n "
        "(the paper). prompts_capped (default): the samples ratio, capped at the growth of prompts per "
        "step, so a stage with no more prompts than the first never gets a larger lr (a broad stage "
        "of 4 prompts at lr x sqrt(2) lost pass@1 where lr x 1 gained: docs/results.md, section 6).")
    warmup_steps: int = Field(0, ge=0, le=MAX_TOTAL_STEPS,
                              description="Linear warmup of the lr over the first steps of the job.")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="AdamW's beta1 and beta2.")
    weight_decay: float = Field(0.01, ge=0, le=10, description="AdamW's decoupled weight decay.")
    grad_clip: float | None = Field(1.0, gt=0, le=1e6, description="Max global grad norm; null = off.")
    optimizer_state: Literal["fp32", "8bit", "cpu_offload"] = Field(
        "fp32", description="AdamW state: fp32 (8 bytes/param) or 8bit (bitsandbytes, 2 bytes/param) "
                            "on the device, or cpu_offload (float32 masters and moments on the CPU, "
                            "weights in the compute dtype on the device, as ZeRO-Offload).")
    max_nonfinite_steps: int = Field(
        3, ge=1, le=1000, description="Updates in a row with a non-finite loss or gradient before the job fails.")


class AlgoSpec(_Frozen):
    loss: Literal["ppo", "gspo", "cispo", "dr_grpo"] = Field(
        "ppo", description="The policy objective (docs/objectives.md). ppo: token-level clipped ratio "
        "(Clip-Higher), over the mini-batch's tokens. gspo: one clipped ratio per sequence (the "
        "geometric mean of its token ratios), mean over sequences; use clip_low/clip_high near "
        "3e-4/4e-4, as the paper. cispo: every token's log-prob weighted by its ratio capped at "
        "1 + clip_high, stop-gradient (no token's gradient dropped; MiniMax-M1 and ScaleRL use caps "
        "of 4 to 5, i.e. clip_high 3 to 4). dr_grpo: ppo's terms over samples x "
        "rollout.max_new_tokens; with advantage group_mean (Dr. GRPO's) or reinforce_pp_baseline "
        "(one batch-wide scale), never grpo (its per-group std is what Dr. GRPO removes).")
    advantage: Literal["reinforce_pp_baseline", "grpo", "group_mean"] = Field(
        "reinforce_pp_baseline", description="reinforce_pp_baseline (the paper's): reward minus the "
        "mean of the prompt's n rewards, then whitened over the whole batch; grpo: the same "
        "difference divided by the group's std, no batch whitening; group_mean: the difference "
        "alone (Dr. GRPO's, TRL's scale_rewards none).")
    advantage_whitening: Literal["sample", "token"] = Field(
        "sample", description="reinforce_pp_baseline's batch whitening: over samples (each "
                              "response counts once) or over tokens (OpenRLHF's choice).")
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO clips the probability ratio at 1 - clip_low.")
    clip_high: float = Field(0.27, gt=0, le=100, description="PPO clips the probability ratio at "
                             "1 + clip_high (Clip-Higher); at least clip_low.")
    kl_coef: float = Field(1e-4, ge=0, le=1e3, description="Weight of the KL penalty to the reference "
                           "policy; 0 drops the penalty and the reference model's memory.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k2", description="KL(policy || reference) estimator in the loss: k2 (the recipe's, half the "
                          "squared log ratio) or k3 (ratio - 1 - log ratio). k1 (the log ratio) is refused "
                          "with kl_coef > 0: as a loss its gradient averages to zero (docs/kl.md).")
    ref_reset_every: int | None = Field(300, ge=1, le=MAX_TOTAL_STEPS, description=(
        "Steps between resets of the KL reference to the current policy (the optimizer state is "
        "kept); null = never."))
    dynamic_sampling: bool = Field(True, description="Drop prompts whose n rewards are all equal "
                                   "(no learning signal) and refill the batch with fresh prompts.")
    max_refill_rounds: int = Field(3, ge=0, le=100, description="Extra generation rounds per step "
                                   "that refill the prompts dynamic sampling dropped.")
    is_truncation: tuple[float, float] | None = Field(
        (0.5, 5.0), description="Truncated importance sampling between the trainer's and the rollout "
        "engine's token probabilities: tokens whose ratio is outside [low, high] are dropped, with "
        "0 < low < 1 < high; null = off.")
    mini_batches: int = Field(4, ge=1, le=MAX_SAMPLES_PER_STEP, description="PPO updates (optimizer "
                              "steps) per step; at most the smallest stage's samples per step.")
    micro_batch_tokens: Literal["auto"] | Annotated[int, Field(ge=1, le=2**31 - 1)] = Field(
        "auto", description="Tokens per forward/backward chunk, so memory does not grow with n; auto "
                            "sizes it from a fixed activation budget for the model.")
    truncated_reward: float = Field(0.0, ge=-1e6, le=1e6, description="Reward of a response cut at "
                                    "rollout.max_new_tokens (it is not verified).")
    max_oversample: float = Field(
        4.0, ge=1, le=64, description="Dynamic sampling asks each round for the missing "
        "prompts divided by the running keep rate, at most this many times the missing ones.")
    stall_steps: int = Field(
        10, ge=1, le=MAX_TOTAL_STEPS, description="Steps in a row with every response truncated or "
                                                  "no group kept before the job gets a warning event.")
    fail_on_stall: bool = Field(False, description="Fail the job after stall_steps instead of only warning.")
    overlong: OverlongSpec | None = Field(
        None, description="DAPO's soft overlong punishment; null = off. Use it when many responses run "
        "into rollout.max_new_tokens: the penalty grows before the cut, so the policy learns to finish "
        "within the budget instead of learning from cut, unscored answers.")
    difficulty_filter: DifficultyFilterSpec | None = Field(
        None, description="Retire training prompts the policy always (or never) solves across steps; "
        "null = off. Use it for runs of many passes over a small training split, where solved prompts "
        "come back each pass and dynamic sampling would throw their groups away again. Never leaves "
        "fewer prompts than the largest prompts_per_step.")

    @model_validator(mode="after")
    def _high_ge_low(self) -> "AlgoSpec":
        # After the model, not a field validator of clip_high: pydantic skips those for a
        # default, so {clip_low: 0.5} passed and its stored form (clip_high 0.27 written out)
        # was refused by the worker's re-validation (tests/trainer/test_spec_roundtrip.py).
        if self.clip_high < self.clip_low:
            raise FieldError("algo.clip_high", f"must be >= clip_low ({self.clip_low})")
        return self

    @model_validator(mode="after")
    def _dr_grpo_keeps_no_group_std(self) -> "AlgoSpec":
        if self.loss == "dr_grpo" and self.advantage == "grpo":
            raise FieldError("algo.advantage", "grpo divides by each group's std, which Dr. GRPO removes: "
                             "use group_mean (Dr. GRPO's) or reinforce_pp_baseline with loss dr_grpo")
        return self

    @model_validator(mode="after")
    def _k1_is_not_a_loss(self) -> "AlgoSpec":
        # k1 = log pi - log ref. As a loss term its gradient is kl_coef x grad log pi, whose
        # mean over samples drawn from pi is zero: noise, no pull towards the reference.
        # Peers that use k1 put it in the reward instead; this trainer's KL is a loss term.
        if self.kl_estimator == "k1" and self.kl_coef > 0:
            raise FieldError("algo.kl_estimator",
                             "k1 does not work as a KL loss: its gradient, kl_coef x grad log pi, "
                             "averages to zero over the policy's own samples, so it adds noise and "
                             "no pull towards the reference; use k2 (the recipe's) or k3, or "
                             "kl_coef 0 for no KL")
        return self

    @field_validator("is_truncation")
    @classmethod
    def _band(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not (0 < v[0] < 1 < v[1]):
            raise ValueError(f"needs 0 < low < 1 < high, got {list(v)}")
        return v


class EvalSpec(_Frozen):
    every: int = Field(50, ge=0, le=MAX_TOTAL_STEPS, description=(
        "Evaluate on the held-out split every this many steps (and before the first update and at "
        "the end); 0 = before the first update and at the end only."))
    samples_per_prompt: int = Field(16, ge=1, le=4096, description="Samples per held-out prompt; "
                                    "pass@1 is their mean.")
    k: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 4, 16], min_length=1, max_length=MAX_EVAL_K,
        description="The k of each reported eval/pass@k (unbiased estimator); each at most "
                    "samples_per_prompt.")
    temperature: float = Field(0.6, gt=0, le=2, description="Sampling temperature of the evaluation.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling of the evaluation.")
    gaming_window: int = Field(3, ge=0, le=100, description="Warn (a `warning` event) when over this "
                               "many evaluations the training reward rose and eval pass@1 fell, each by "
                               "at least gaming_min_delta: a reward being gamed; 0 = never.")
    gaming_min_delta: float = Field(0.02, ge=0, le=1, description="How far both must move for that "
                                    "warning.")

    @model_validator(mode="after")
    def _k_bound(self) -> "EvalSpec":
        bad = [k for k in self.k if k > self.samples_per_prompt]
        if bad:
            raise FieldError("eval.k", f"{bad} exceed samples_per_prompt ({self.samples_per_prompt})")
        return self


class CheckpointSpec(_Frozen):
    every: int = Field(50, ge=0, le=MAX_TOTAL_STEPS, description=(
        "Save a checkpoint every this many steps (and at the end); 0 = only at the end."))
    # Bounded so that one job's checkpoints cannot fill the artifact volume.
    keep_last: int = Field(3, ge=1, le=MAX_KEEP_LAST, description="Newest checkpoints kept; older "
                           "ones are deleted.")


MAX_GPUS_PER_NODE = 64


class ResourcesSpec(_Frozen):
    """What one job runs on: `gpus_per_node` trainer processes (ranks) on each of `nodes` nodes.

    More than one rank in all (`world_size`) runs the job on that many ranks, the policy sharded
    with FSDP2 (a LoRA job: the base replicated on every rank, the adapter's gradients
    all-reduced; on a CPU worker each rank is one process, gloo): on one node under torchrun,
    on several through the Ray launcher, which a deployment serves only where it is set up
    (BRORL_RAY_ADDRESS, BRORL_RAY_MAX_NODES: the API refuses nodes > 1 elsewhere).
    """

    gpus_per_node: int = Field(1, ge=1, le=MAX_GPUS_PER_NODE,
                               description="Trainer processes (ranks), one per GPU, on the job's node. The "
                                           "deployment must serve that count (BRORL_GPU_COUNTS); more "
                                           "than 1 needs optim.optimizer_state fp32.")
    nodes: int = Field(1, ge=1, le=1024, description="Nodes, each running gpus_per_node ranks; more than "
                       "1 only where the deployment serves multi-node jobs (BRORL_RAY_ADDRESS, "
                       "BRORL_RAY_MAX_NODES), placed all at once by Ray.")
    min_nodes: int | None = Field(None, ge=1, le=1024, description=(
        "The fewest nodes the job may run on (the Ray launcher): when all `nodes` cannot be placed "
        "within BRORL_RAY_SHRINK_AFTER_S because fewer nodes that can hold one exist (a node was "
        "lost, say), the job runs on the nodes there are, down to this many, and resumes its "
        "checkpoint on that smaller world. null: exactly `nodes`, waiting for them."))

    @property
    def world_size(self) -> int:
        """Ranks in all."""
        return self.nodes * self.gpus_per_node

    @model_validator(mode="after")
    def _min_nodes_at_most_nodes(self) -> "ResourcesSpec":
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise FieldError("resources.min_nodes", f"{self.min_nodes} is more than resources.nodes ({self.nodes})")
        return self


class LimitsSpec(_Frozen):
    max_wall_seconds: int = Field(86_400, ge=1, le=MAX_WALL_SECONDS, description=(
        "An attempt that runs longer stops at its next step and the job fails (counted from the "
        "attempt's start)."))
    max_attempts: int = Field(3, ge=1, le=100, description="Attempts in all: a job whose worker or "
                              "rank died is retried from its newest checkpoint up to this many times.")


class SamplesSpec(_Frozen):
    """Rollouts kept for people to read (the job's samples table): how reward hacking is caught."""

    per_step: int = Field(8, ge=0, le=64, description="Rollouts stored per step, half of them the "
                          "highest-reward ones and half the lowest; 0 stores none.")
    max_chars: int = Field(4000, ge=100, le=20_000, description="Prompt and completion are each "
                           "cut to this many characters when stored.")


# --------------------------------------------------------------------------- the job


class JobSpec(_Frozen):
    """A BroRL job: the model, the task and its reward, the broadening schedule of rollouts, the
    optimizer and the RL algorithm, evaluation, checkpoints, limits and resources. Unknown
    fields are errors; every field but name and task has a default."""

    spec_version: Literal[1] = Field(1, description="The spec's version; 1 is the only one.")
    name: str = Field(..., min_length=1, max_length=200, description="Free text, shown in job lists.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seeds the task's questions (or the dataset's "
                      "train/eval split), the sampling and builtin:tiny's weights.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="The policy to train.")
    task: TaskSpec = Field(..., description="What the model answers and how answers are rewarded.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How rollouts are generated: "
                                 "the broadening schedule and sampling.")
    optim: OptimSpec = Field(default_factory=OptimSpec, description="The optimizer (AdamW) and the "
                             "learning rate of each stage.")
    algo: AlgoSpec = Field(default_factory=AlgoSpec, description="The RL algorithm: advantages, the "
                           "clipped PPO loss, KL, dynamic sampling, mini- and micro-batches.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Evaluation on the held-out split.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="When checkpoints "
                                       "are saved and how many are kept.")
    limits: LimitsSpec = Field(default_factory=LimitsSpec, description="Wall-clock and retry limits.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="How many GPUs "
                                     "(ranks) the job runs on.")
    samples: SamplesSpec = Field(default_factory=SamplesSpec, description="Rollouts stored for reading "
                                 "(the job's samples table).")
    continue_from: ContinueFrom | None = Field(None, description="Start from a checkpoint of one of "
                                               "your earlier jobs (its weights, or its base and adapter).")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        # The spec is stored as it came (JSONB on PostgreSQL): one NUL anywhere, in a name or
        # deep in a task config, would fail the insert with a 500 instead of a 422 here.
        found = _first_bad_text(data, "")
        if found is not None:
            raise FieldError(*found)
        return data

    @model_validator(mode="after")
    def _ranks_use_plain_adamw(self) -> "JobSpec":
        # (A LoRA job is not sharded; its own rule below refuses these states on any count.)
        if self.resources.world_size > 1 and self.optim.optimizer_state != "fp32" and self.model.lora is None:
            raise FieldError("optim.optimizer_state",
                             f"{self.optim.optimizer_state} is not supported on many ranks "
                             f"(resources: {self.resources.world_size} ranks in all): FSDP2 shards the "
                             "fp32 AdamW state over the ranks instead; use fp32")
        return self

    @model_validator(mode="after")
    def _lora_runs_here(self) -> "JobSpec":
        # What LoRA does not run with yet is refused, never trained some other way.
        if self.model.lora is None:
            return self
        if self.rollout.engine != "hf" and self.model.lora.rank > MAX_VLLM_LORA_RANK:
            raise FieldError("model.lora.rank", f"{self.model.lora.rank} exceeds vLLM's largest LoRA "
                             f"rank ({MAX_VLLM_LORA_RANK}); use rollout.engine hf or a smaller rank")
        if self.optim.optimizer_state != "fp32":
            raise FieldError("model.lora", f"optim.optimizer_state {self.optim.optimizer_state} is "
                             "not supported with an adapter, whose float32 AdamW state is small: use fp32")
        return self

    @model_validator(mode="after")
    def _mini_batches_fit(self) -> "JobSpec":
        smallest = min(s.samples_per_step for s in self.rollout.schedule)
        if self.algo.mini_batches > smallest:
            raise FieldError(
                "algo.mini_batches",
                f"{self.algo.mini_batches} exceeds the smallest stage's samples per step ({smallest})")
        return self

    @model_validator(mode="after")
    def _tiny_can_answer(self) -> "JobSpec":
        # builtin:tiny is character-level: '<answer>-123</answer>' plus end of text is ~22
        # tokens. Below that every response is truncated and the job cannot learn.
        if self.model.path == TINY_MODEL and self.rollout.max_new_tokens < TINY_MIN_NEW_TOKENS:
            raise FieldError(
                "rollout.max_new_tokens",
                f"{self.rollout.max_new_tokens} is too short for builtin:tiny, which writes its "
                f"answer one character per token: use at least {TINY_MIN_NEW_TOKENS}")
        return self

    @model_validator(mode="after")
    def _overlong_leaves_room(self) -> "JobSpec":
        o = self.algo.overlong
        if o is not None and o.buffer >= self.rollout.max_new_tokens:
            raise FieldError("algo.overlong.buffer", f"{o.buffer} must be less than rollout.max_new_tokens "
                             f"({self.rollout.max_new_tokens}): the penalty grows over the last buffer tokens")
        return self

    @model_validator(mode="after")
    def _broaden_fits(self) -> "JobSpec":
        b = self.rollout.broaden
        if b is None:
            return self
        if len(self.rollout.schedule) != 1:
            raise FieldError("rollout.broaden", "replaces the schedule's later stages: give exactly "
                             f"one stage in rollout.schedule (got {len(self.rollout.schedule)})")
        k = int(b.metric.split("@")[1])
        if k != 1 and k not in self.eval.k:
            raise FieldError("rollout.broaden.metric", f"{b.metric} is not evaluated: add {k} to eval.k")
        if self.eval.every == 0:
            raise FieldError("rollout.broaden", "needs periodic evaluations: set eval.every > 0")
        first = self.rollout.schedule[0]
        if b.max_n <= first.n:
            raise FieldError("rollout.broaden.max_n", f"{b.max_n} leaves no room above the first "
                             f"stage's n ({first.n})")
        if b.trigger == "probe" and b.probe_n < b.max_n:
            raise FieldError("rollout.broaden.probe_n", f"{b.probe_n} must be at least max_n ({b.max_n}): "
                             "the probe has to see past every stage's n")
        widest = b.max_n * first.prompts_per_step
        if b.prompts == "keep_prompts" and widest > MAX_SAMPLES_PER_STEP:
            raise FieldError("rollout.broaden.max_n", f"max_n x prompts_per_step = {widest} exceeds "
                             f"{MAX_SAMPLES_PER_STEP} samples per step")
        return self

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.rollout.schedule)


# --------------------------------------------------------------------------- helpers


def spec_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Flatten a ValidationError into [{field, message}] with dotted field paths.

    Cross-field rules raise FieldError, whose path is absolute; pydantic reports those at
    the validator's own location, so the path is recovered from the message prefix.
    """
    out = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, FieldError):
            loc, msg = ctx_err.path, ctx_err.message
        out.append({"field": loc or "(body)", "message": msg})
    return out


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML or JSON spec file."""
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    return JobSpec.model_validate(data)


def changed_fields(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths where two dumped specs (`model_dump(mode="json")`) differ, sorted; a list
    (e.g. `rollout.schedule`) counts as one field."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b, path = old.get(key), new.get(key), f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_fields(a, b, path + ".")
        elif a != b:
            out.append(path)
    return out


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
