"""The job spec, version 1: one frozen pydantic model that is the whole job.

The API takes it as the request body, the database stores its JSON, the worker rebuilds it
and the trainer runs it (ARCHITECTURE.md rule 1). It must stay importable without torch:
only pydantic, the standard library and (lazily, for task-name checks) reasoning-gym.
Field names, defaults and bounds follow shared/JOBSPEC.md; cross-field rules live here so
that bad input is refused before anything is queued, with a message naming the field.
"""
from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

SPEC_VERSION = 1
MAX_SAMPLES_PER_STEP = 1_048_576
MAX_TOTAL_STEPS = 1_000_000


MAX_TASK_CONFIG_BYTES = 16 * 1024
MAX_EVAL_K = 16
MAX_KEEP_LAST = 100
MAX_WALL_SECONDS = 30 * 86_400


class _Frozen(BaseModel):
    # allow_inf_nan=False: JSON's NaN/Infinity literals are refused in every float field
    # (a NaN weight_decay once trained a NaN model; Postgres and SQLite then disagree on it).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class FieldError(ValueError):
    """A cross-field rule broken at `path` (dotted, relative to the whole spec)."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


# --------------------------------------------------------------------------- model

TINY_MODEL = "builtin:tiny"
TINY_MIN_NEW_TOKENS = 24


class ModelSpec(_Frozen):
    path: str = Field("builtin:tiny", min_length=1, max_length=4096,
                      description="HF model folder, HF hub id, or builtin:tiny (built on the worker).")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute dtype (auto = bf16 on CUDA, float32 on CPU); trainable "
                            "weights and optimizer state are float32 either way (on the CPU "
                            "with optim.optimizer_state cpu_offload).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward.")


# --------------------------------------------------------------------------- task


@functools.lru_cache(maxsize=1)
def reasoning_gym_task_names() -> tuple[str, ...]:
    """Registered reasoning-gym task names (imported lazily: it is not needed elsewhere)."""
    from reasoning_gym.factory import DATASETS

    return tuple(sorted(DATASETS))


class ReasoningGymTask(_Frozen):
    name: str = Field(..., min_length=1, max_length=200, description="A registered reasoning-gym task.")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=f"The task's config fields (at most {MAX_TASK_CONFIG_BYTES} bytes as JSON).")
    train_size: int = Field(10_000, ge=1, le=10_000_000)
    eval_size: int = Field(200, ge=1, le=100_000)
    eval_disjoint: bool = Field(
        True, description="Drop eval questions that also occur in the training split. A closed "
        "task space (e.g. one-digit sums) has few unseen questions: false samples eval from the "
        "same generator with another seed, overlaps allowed.")

    @field_validator("config")
    @classmethod
    def _small_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        # Stored with the job and sent back on every read: a few KB, not megabytes of junk.
        try:
            size = len(json.dumps(config, allow_nan=False))
        except (ValueError, TypeError, RecursionError):
            raise ValueError("must be plain JSON without NaN or Infinity") from None
        if size > MAX_TASK_CONFIG_BYTES:
            raise ValueError(f"is {size} bytes as JSON; at most {MAX_TASK_CONFIG_BYTES}")
        return config

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        names = reasoning_gym_task_names()
        if name not in names:
            close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ValueError(f"unknown reasoning-gym task {name!r}{hint}")
        return name

    @model_validator(mode="after")
    def _config_is_valid(self) -> "ReasoningGymTask":
        from reasoning_gym.factory import DATASETS

        _, config_cls = DATASETS[self.name]
        try:
            cfg = config_cls(**self.config)
            if hasattr(cfg, "validate"):
                cfg.validate()
        except (TypeError, ValueError, AssertionError) as exc:
            raise FieldError("task.reasoning_gym.config", f"invalid for {self.name}: {exc}") from None
        return self


class DatasetTask(_Frozen):
    id: str = Field(..., min_length=1, max_length=64, description="An uploaded JSONL dataset (ds_...).")
    verifier: Literal["exact", "numeric", "math", "regex"] = "exact"
    eval_fraction: float = Field(0.05, gt=0, lt=1)
    numeric_tolerance: float = Field(1e-6, ge=0, le=1e6, description="Relative tolerance for `numeric`.")


class TaskSpec(_Frozen):
    reasoning_gym: ReasoningGymTask | None = None
    dataset: DatasetTask | None = None
    prompt_template: str | None = Field(
        None, max_length=20_000,
        description="null: the default prompt asking for <answer>...</answer>; else must contain {question}.")
    reward: Literal["binary", "score"] = "binary"

    @field_validator("prompt_template")
    @classmethod
    def _has_question(cls, v: str | None) -> str | None:
        if v is not None and "{question}" not in v:
            raise ValueError("must contain the placeholder {question}")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> "TaskSpec":
        if (self.reasoning_gym is None) == (self.dataset is None):
            raise FieldError("task", "give exactly one of reasoning_gym or dataset")
        return self


# --------------------------------------------------------------------------- rollout


class Stage(_Frozen):
    n: int = Field(..., ge=2, le=4096, description="Rollouts per prompt.")
    prompts_per_step: int = Field(..., ge=1, le=8192)
    steps: int = Field(..., ge=1, le=MAX_TOTAL_STEPS)

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
        "fewer prompts per update lost what the narrow stage learned (docs/results.md, issue 12).")
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
        "as fast or faster and starts instantly (README, Evidence).")
    schedule: list[Stage] = Field(default_factory=_default_schedule, min_length=1, max_length=32)
    max_new_tokens: int = Field(256, ge=1, le=131_072)
    temperature: float = Field(1.0, gt=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
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
    lr_scaling: Literal["sqrt", "linear", "none"] = "sqrt"
    lr_batch: Literal["prompts_capped", "samples"] = Field(
        "prompts_capped", description="What lr_scaling's batch ratio counts. samples: B = prompts x n "
        "(the paper). prompts_capped (default): the samples ratio, capped at the growth of prompts per "
        "step, so a stage with no more prompts than the first never gets a larger lr (a broad stage "
        "of 4 prompts at lr x sqrt(2) lost pass@1 where lr x 1 gained: docs/results.md, section 6).")
    warmup_steps: int = Field(0, ge=0, le=MAX_TOTAL_STEPS)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    weight_decay: float = Field(0.01, ge=0, le=10)
    grad_clip: float | None = Field(1.0, gt=0, le=1e6, description="Max global grad norm; null = off.")
    optimizer_state: Literal["fp32", "8bit", "cpu_offload"] = Field(
        "fp32", description="AdamW state: fp32 (8 bytes/param) or 8bit (bitsandbytes, 2 bytes/param) "
                            "on the device, or cpu_offload (float32 masters and moments on the CPU, "
                            "weights in the compute dtype on the device, as ZeRO-Offload).")
    max_nonfinite_steps: int = Field(
        3, ge=1, le=1000, description="Updates in a row with a non-finite loss or gradient before the job fails.")


class AlgoSpec(_Frozen):
    advantage: Literal["reinforce_pp_baseline", "grpo"] = "reinforce_pp_baseline"
    advantage_whitening: Literal["sample", "token"] = Field(
        "sample", description="reinforce_pp_baseline's batch whitening: over samples (each "
                              "response counts once) or over tokens (OpenRLHF's choice).")
    clip_low: float = Field(0.2, gt=0, lt=1)
    clip_high: float = Field(0.27, gt=0, le=100)
    kl_coef: float = Field(1e-4, ge=0, le=1e3)
    kl_estimator: Literal["k1", "k2", "k3"] = "k2"
    ref_reset_every: int | None = Field(300, ge=1, le=MAX_TOTAL_STEPS, description="Steps; null = never.")
    dynamic_sampling: bool = True
    max_refill_rounds: int = Field(3, ge=0, le=100)
    is_truncation: tuple[float, float] | None = (0.5, 5.0)
    mini_batches: int = Field(4, ge=1, le=MAX_SAMPLES_PER_STEP)
    micro_batch_tokens: Literal["auto"] | Annotated[int, Field(ge=1, le=2**31 - 1)] = "auto"
    truncated_reward: float = Field(0.0, ge=-1e6, le=1e6)
    max_oversample: float = Field(
        4.0, ge=1, le=64, description="Cap on generating 1/keep_rate times the missing prompts.")
    stall_steps: int = Field(
        10, ge=1, le=MAX_TOTAL_STEPS, description="Steps in a row with every response truncated or "
                                                  "no group kept before a warning.")
    fail_on_stall: bool = Field(False, description="Fail the job instead of only warning.")

    @field_validator("clip_high")
    @classmethod
    def _high_ge_low(cls, v: float, info) -> float:
        low = info.data.get("clip_low")
        if low is not None and v < low:
            raise ValueError(f"must be >= clip_low ({low})")
        return v

    @field_validator("is_truncation")
    @classmethod
    def _band(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not (0 < v[0] < 1 < v[1]):
            raise ValueError(f"needs 0 < low < 1 < high, got {list(v)}")
        return v


class EvalSpec(_Frozen):
    every: int = Field(50, ge=0, le=MAX_TOTAL_STEPS, description="Steps; 0 = only at the end.")
    samples_per_prompt: int = Field(16, ge=1, le=4096)
    k: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 4, 16], min_length=1, max_length=MAX_EVAL_K)
    temperature: float = Field(0.6, gt=0, le=2)
    top_p: float = Field(0.95, gt=0, le=1)

    @model_validator(mode="after")
    def _k_bound(self) -> "EvalSpec":
        bad = [k for k in self.k if k > self.samples_per_prompt]
        if bad:
            raise FieldError("eval.k", f"{bad} exceed samples_per_prompt ({self.samples_per_prompt})")
        return self


class CheckpointSpec(_Frozen):
    every: int = Field(50, ge=0, le=MAX_TOTAL_STEPS, description="Steps; 0 = only at the end.")
    # Bounded so that one job's checkpoints cannot fill the artifact volume.
    keep_last: int = Field(3, ge=1, le=MAX_KEEP_LAST)


MAX_GPUS_PER_NODE = 64


class ResourcesSpec(_Frozen):
    """What one job runs on: `gpus_per_node` trainer processes (ranks) on each of `nodes` nodes.

    gpus_per_node > 1 runs the job under torchrun on that many ranks of one node, the policy
    sharded with FSDP2 (on a CPU worker each rank is one process, gloo); multi-node is designed
    (README, Many GPUs) but does not run yet, so nodes > 1 is refused at submission.
    """

    gpus_per_node: int = Field(1, ge=1, le=MAX_GPUS_PER_NODE,
                               description="Trainer processes (ranks), one per GPU, on the job's node.")
    nodes: int = Field(1, ge=1, le=1024, description="Nodes; only 1 is supported so far.")

    @model_validator(mode="after")
    def _one_node(self) -> "ResourcesSpec":
        if self.nodes > 1:
            raise FieldError("resources.nodes", f"{self.nodes} nodes asked: multi-node is not yet "
                             "supported, use nodes: 1 (README, Many GPUs)")
        return self


class LimitsSpec(_Frozen):
    max_wall_seconds: int = Field(86_400, ge=1, le=MAX_WALL_SECONDS)
    max_attempts: int = Field(3, ge=1, le=100)


# --------------------------------------------------------------------------- the job


class JobSpec(_Frozen):
    """A BroRL job. See shared/JOBSPEC.md and the README for every field."""

    spec_version: Literal[1] = 1
    name: str = Field(..., min_length=1, max_length=200)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    model: ModelSpec = Field(default_factory=ModelSpec)
    task: TaskSpec
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec)
    algo: AlgoSpec = Field(default_factory=AlgoSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)

    @model_validator(mode="after")
    def _ranks_use_plain_adamw(self) -> "JobSpec":
        if self.resources.gpus_per_node > 1 and self.optim.optimizer_state != "fp32":
            raise FieldError("optim.optimizer_state",
                             f"{self.optim.optimizer_state} is not supported on many ranks "
                             f"(resources.gpus_per_node {self.resources.gpus_per_node}): FSDP2 shards the "
                             "fp32 AdamW state over the ranks instead; use fp32")
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


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
