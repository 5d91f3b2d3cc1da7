"""Everything one training run holds, built once from the spec (and a checkpoint to resume).

`build_run` resolves the model (an HF folder, a hub id, or `builtin:tiny`), loads policy and
reference, creates the optimizer, the rollout engine, the scorer and the prompt stream, and
restores the trainer state when resuming. `trainer.loop.train_in_process` then only runs steps.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from trainer.checkpoints import io as checkpoint
from trainer import collectives as distributed
from trainer.events import Phase, PhaseProgress, no_progress
from trainer.prompt_stream import PromptStream
from trainer.rollouts import encode_prompts
from trainer.engines import default_engine, make_engine
from trainer.models.loading import load_policy, resolve_device
from trainer.models.lora import load_lora_policy, trainable_parameters
from trainer.precision import compute_dtype
from trainer.algo.advantages import ADVANTAGES, AdvantageFn
from trainer.algo.difficulty import DifficultyFilter, make_difficulty_filter
from trainer.algo.gaming import GamingWatch
from trainer.optim.optimizer import make_optimizer
from trainer.optim.update import UpdateConfig, auto_micro_batch_tokens
from trainer.algo.schedule import Plateau, StagePlan, replan, widest_samples
from trainer.settings import trainer_settings
from trainer.spec import TINY_MODEL, JobSpec
from trainer.stop import never
from trainer.tasks import build_task
from trainer.tasks.base import Task
from trainer.tasks.prompts import render_example, target_completion
from trainer.graders.scorer import GraderErrorWatch, make_scorer
from trainer.tasks.scoring import Scorer
from trainer.malloc import configure_malloc
from trainer.threads import configure_threads



# Run fields saved in TrainerState so that a resumed run continues them (step.py, loop.py).
RESUMED_COUNTERS = ("keep_rate_running", "keep_rounds_seen", "nonfinite_in_row", "stalled_steps")


@dataclass
class Run:
    spec: JobSpec
    out_dir: Path
    device: torch.device
    task: Task
    model_dir: Path
    tokenizer: object
    policy: torch.nn.Module
    ref: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    engine: object
    scorer: Scorer                               # or a GraderScorer (task.grader): one interface
    stream: PromptStream
    plans: list[StagePlan]
    state: checkpoint.TrainerState
    train_ids: list[list[int]]     # tokenised prompt of each training example
    eval_ids: list[list[int]]
    micro_batch_tokens: int
    compute_dtype: torch.dtype = torch.float32   # forwards under autocast; weights stay float32
    update_cfg: UpdateConfig | None = None       # the PPO update's settings, resolved once
    advantage_fn: AdvantageFn | None = None      # ADVANTAGES[algo.advantage], resolved once
    keep_rate_running: float = 1.0               # dynamic sampling's keep rate, for oversampling
    keep_rounds_seen: int = 0                    # generation rounds that rate is made of
    nonfinite_in_row: int = 0                    # updates skipped in a row (non-finite loss/grad)
    stalled_steps: int = 0                       # steps in a row that could not learn
    plateau: Plateau = field(default_factory=Plateau)  # rollout.broaden's memory of the metric
    gaming: GamingWatch = field(default_factory=GamingWatch)  # reward up, eval down (not resumed)
    stop_check: Callable[[], None] = never       # raises StopRequested inside long phases
    grader_watch: GraderErrorWatch = field(default_factory=GraderErrorWatch)  # (not resumed)
    progress: PhaseProgress = field(default_factory=no_progress)  # long phases' `progress` events
    difficulty: DifficultyFilter | None = None   # algo.difficulty_filter's retired prompts
    env: object | None = None                    # task.env's Environment, built once per job
    max_seq_len: int | None = None               # the engine's longest sequence (an episode's bound)

    def close(self) -> None:
        try:
            if self.env is not None:
                self.env.close()  # its sandboxes, sessions and servers: nothing left running
        finally:
            self.scorer.close()
            self.engine.close()


def spec_sha256(spec: JobSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def cache_dir() -> Path:
    return trainer_settings().cache_dir


def tiny_model_key(spec: JobSpec) -> str:
    """Cache key of the builtin:tiny model for this spec: its task and seed (and the build's
    version, bumped whenever the warm start changes so stale cached models are not reused;
    v3: the stopping hold-out moved from the eval split to a validation slice of train; v4: the
    warm start runs on one torch thread). The
    job's reward (grader, binary or score) is left out: the warm start learns the task's
    answers and stops on its built-in verifier's `correct`, whatever the job's reward
    (`_warm_started`)."""
    # A single-turn task's key leaves `env` out, so models cached before environments existed
    # are still found; an environment's job gets keys of its own.
    task = spec.task.model_dump(mode="json", exclude=REWARD_FIELDS | ({"env"} if spec.task.env is None else set()))
    key_src = {"task": task, "seed": spec.seed, "v": 4}
    return hashlib.sha256(json.dumps(key_src, sort_keys=True).encode()).hexdigest()[:20]


WARM_HOLDOUT_SIZE = 64
REWARD_FIELDS = {"reward", "grader", "grader_error_fraction", "grader_error_steps"}


def warm_start_holdout(task: Task, size: int = WARM_HOLDOUT_SIZE) -> list:
    """The examples the tiny warm start stops on: distinct training questions, none of them
    an eval question, in the (seeded) training order.

    Stopping and the in-band restore select a model by this hold-out's pass rate; stopping on
    the eval split made the step-0 eval a selected (biased) figure. The SFT still fits every
    training pair: the hold-out only decides how far it goes, as the RL trains on them all too.
    """
    eval_questions = {ex.question for ex in task.eval}
    holdout, seen = [], set()
    for ex in task.train:
        if ex.question not in eval_questions and ex.question not in seen:
            seen.add(ex.question)
            holdout.append(ex)
            if len(holdout) == size:
                break
    if not holdout:
        raise ValueError(f"task {task.name}: every training question is also an eval question, "
                         "so builtin:tiny's warm start has nothing to stop on; raise train_size "
                         "or set eval_disjoint")
    return holdout


def _tiny_model_dir(spec: JobSpec, task: Task, scorer: Scorer, stop_check: Callable[[], None],
                    progress: PhaseProgress | None = None, **build: object) -> Path:
    """Build (or reuse) the built-in tiny model, warm-started on this task's training split
    (`build`: build_tiny_model's knobs, e.g. a test's shorter warm start). A build reports
    a `warm_start` phase to `progress`; a cached model returns at once and reports nothing."""
    from trainer.models.tiny import ensure_tiny_model

    key = tiny_model_key(spec)
    template = spec.task.prompt_template
    pairs = [(render_example(ex, template), target_completion(ex.answer)) for ex in task.train]
    holdout = warm_start_holdout(task)
    holdout_prompts = [render_example(ex, template) for ex in holdout]
    by_prompt = dict(zip(holdout_prompts, holdout))

    def score_fn(prompts: list[str], completions: list[str]) -> list[bool]:
        exs = [by_prompt[p] for p in prompts]
        return scorer.score(completions, exs, [False] * len(exs)).correct

    with (progress or no_progress()).phase(Phase.warm_start, "builtin:tiny: warm start", lazy=True) as report:
        return ensure_tiny_model(cache_dir() / "models", key, seed=spec.seed, sft_pairs=pairs,
                                 score_fn=score_fn, holdout_prompts=holdout_prompts, stop_check=stop_check,
                                 on_progress=report, **build)


def prepare_tiny_model(spec: JobSpec, dataset_path: Path | None, stop_check: Callable[[], None] = never,
                       progress: PhaseProgress | None = None, **build: object) -> None:
    """Put the spec's builtin:tiny model in the cache (nothing for any other model): done once
    where a cancel reaches it, before many ranks, or a test's runs, find it there."""
    if spec.model.path != TINY_MODEL:
        return
    progress = progress or no_progress()
    task = _built_task(spec, dataset_path, stop_check, progress)
    scorer = Scorer(task, reward=spec.task.reward, truncated_reward=spec.algo.truncated_reward)
    try:
        _tiny_model_dir(spec, task, scorer, stop_check, progress, **build)
    finally:
        scorer.close()


def _warm_started(spec: JobSpec, task: Task, scorer, stop_check: Callable[[], None],
                  progress: PhaseProgress | None) -> Path:
    """builtin:tiny for this job; its warm start stops on the task's built-in verifier even
    when a grader rewards the job (so the cached model is the same for every reward)."""
    if spec.task.grader is None:
        return _tiny_model_dir(spec, task, scorer, stop_check, progress)
    with Scorer(task, reward=spec.task.reward, truncated_reward=spec.algo.truncated_reward) as verifier:
        return _tiny_model_dir(spec, task, verifier, stop_check, progress)


def model_dir_for(spec: JobSpec, task: Task, scorer, stop_check: Callable[[], None] = never,
                  progress: PhaseProgress | None = None) -> Path:
    """The folder the spec's model loads from: builtin:tiny is warm-started (or found in the
    cache) here, reporting its `warm_start` phase to `progress`; any other path is used as it is."""
    if spec.model.path == TINY_MODEL:
        return _warm_started(spec, task, scorer, stop_check, progress)
    return Path(spec.model.path)


def start_dir(spec: JobSpec, start_from: checkpoint.StartFrom) -> Path:
    """Where a continued job's model loads from: the parent's checkpoint (full fine-tuning), or
    for LoRA the base its adapter was trained on (peft's adapter_config.json names it); the
    adapter itself then loads from the checkpoint."""
    folder = Path(start_from.folder)
    if spec.model.lora is None:
        return folder
    base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(f"the base model the continued job's adapter was trained on is gone ({base!r})")
    return Path(base)


def _built_task(spec: JobSpec, dataset_path: Path | None, stop_check: Callable[[], None],
                progress: PhaseProgress) -> Task:
    """The spec's task, built inside a `task` phase (a large dataset or generator takes a while)."""
    with progress.phase(Phase.task, "building the task's training and eval examples"):
        return job_task(spec, dataset_path, stop_check)


def job_task(spec: JobSpec, dataset_path: Path | None = None, stop_check: Callable[[], None] = never) -> Task:
    """The spec's examples: its reasoning-gym task or dataset, else (a task.env of type verifiers
    or openenv with neither) the environment's own."""
    t = spec.task
    if t.env is not None and t.reasoning_gym is None and t.dataset is None:
        from trainer.rollouts.environments import environment_task

        return environment_task(t.env, trainer_settings(), spec.seed)
    return build_task(t, spec.seed, dataset_path, stop_check=stop_check)


def job_environment(spec: JobSpec, out_dir: Path | None = None, name: str | None = None):
    """The job's multi-turn `Environment` (None without task.env); the caller closes it. Its
    sandboxes and sessions are tagged with `name` (a probe's or an evaluation's id and attempt),
    else the job's from `out_dir`, else the spec's hash (a local run)."""
    if spec.task.env is None:
        return None
    from trainer.rollouts.environments import build_environment

    # The worker's out_dir is <job id>/attempt-<n>: both parts, so the tag names the job.
    where = name or (f"{Path(out_dir).parent.name}-{Path(out_dir).name}" if out_dir else spec_sha256(spec)[:12])
    tag = "brorl-" + "".join(c for c in where if c.isalnum() or c in "-_")[:64]
    return build_environment(spec.task.env, task=spec.task, settings=trainer_settings(), tag=tag)


def env_budget(spec: JobSpec) -> int:
    """An episode's completion tokens, the model's and the environment's (task.env.max_total_tokens,
    else rollout.max_new_tokens); a single-turn completion's otherwise."""
    env = spec.task.env
    if env is None or env.max_total_tokens is None:
        return spec.rollout.max_new_tokens
    return env.max_total_tokens


# An env's opening (its messages through the chat template, with the tools' schemas) is longer
# than the task's single-turn prompt; the engine's sequences get this much room beyond it.
ENV_PROMPT_ROOM = 2048


@dataclass
class _Models:
    policy: torch.nn.Module
    tokenizer: object
    ref: torch.nn.Module | None
    engine_model: torch.nn.Module  # what the HF engine generates with (the policy, or a whole copy on ranks)
    source: Path                   # the folder the engine loads from


def _load_models(spec: JobSpec, model_dir: Path, resume: Path | None, device, cdtype) -> _Models:
    """The policy, the KL reference and the engine's model, placed on this process's ranks."""
    if spec.model.lora is not None:  # the base from model_dir, the adapter from the checkpoint
        policy, tokenizer, ref = load_lora_policy(spec, model_dir, resume, device)
        models = _Models(policy, tokenizer, ref, policy, model_dir)
    else:
        source = Path(resume) if resume else model_dir
        policy, tokenizer = load_policy(source, spec.model.dtype, device,
                                        gradient_checkpointing=spec.model.gradient_checkpointing)
        # The reference is never trained: it may live in the compute dtype (half the memory);
        # on many ranks it is sharded like the policy (each rank holds 1 / ranks of it).
        ref = copy.deepcopy(policy).to(cdtype).eval().requires_grad_(False) if spec.algo.kl_coef > 0 else None
        models = _Models(policy, tokenizer, ref, policy, source)
    if distributed.active() and spec.model.lora is not None:
        # LoRA on ranks: the frozen base is replicated, not sharded (every rank loaded it
        # whole); the adapter starts as rank 0's, and its gradients are all-reduced in the
        # update (trainer/collectives.py). Engines and reference are as in one process.
        distributed.replicate_from_rank0(trainable_parameters(models.policy))
    elif distributed.active():
        # The HF engine generates with a whole float32 copy, refreshed from the gathered
        # weights; vLLM holds its own and is verified against the sharded policy (no copy).
        kind = spec.rollout.engine if spec.rollout.engine != "auto" else default_engine(device)
        if kind == "hf":
            models.engine_model = copy.deepcopy(models.policy).eval().requires_grad_(False)
        distributed.shard_policy(models.policy, cdtype)
        if models.ref is not None:
            distributed.shard_policy(models.ref, cdtype)
    return models


def _optimizer_and_state(spec: JobSpec, models: _Models, resume: Path | None, cdtype):
    """The optimizer, the trainer state and the stage plans: fresh, or as the checkpoint left them."""
    plans = replan(spec, [])
    optimizer = make_optimizer(trainable_parameters(models.policy), spec.optim, plans[0].lr, device_dtype=cdtype)
    state = checkpoint.TrainerState(step=0, stage=0, data_cursor=0, ref_step=0,
                                    spec_sha256=spec_sha256(spec), spec=spec.model_dump(mode="json"))
    if resume:
        state = checkpoint.load_state(Path(resume), optimizer, models.ref, models.policy)
        if models.ref is not None and not (Path(resume) / "trainer_state" / "ref.safetensors").is_file():
            distributed.copy_weights(models.ref, models.policy)  # reference == policy at that step
        plans = replan(spec, state.broaden_starts)
    return optimizer, state, plans


def build_run(spec: JobSpec, out_dir: Path, resume: Path | None, dataset_path: Path | None,
              stop_check: Callable[[], None] = never, progress: PhaseProgress | None = None,
              start_from: checkpoint.StartFrom | None = None) -> Run:
    """Everything the loop needs. On torchrun's ranks (trainer/distributed/launch.py joined the process
    group first) the policy is sharded with FSDP2 and each rank's engine holds a whole copy;
    a LoRA policy is replicated instead (each rank holds the base and the adapter).
    `progress` hears each long phase: task, warm_start (a builtin:tiny build), model_load,
    engine_start (`trainer.events.Phase`). `start_from`: another job's checkpoint to start
    from (`spec.continue_from`): its weights or adapter (and optimizer state), fresh counters."""
    progress = progress or no_progress()
    torch.manual_seed(spec.seed)
    configure_threads()  # before any torch work: the default ignores affinity and cgroup quotas
    configure_malloc(trainer_settings().malloc)  # how freed tensors leave the RSS (trainer/malloc.py)
    device = resolve_device()
    task = _built_task(spec, dataset_path, stop_check, progress)
    scorer = make_scorer(spec, task, stop_check)
    try:
        model_dir = start_dir(spec, start_from) if start_from is not None else \
            model_dir_for(spec, task, scorer, stop_check, progress)
    except BaseException:  # a stop during the warm start: the scorer's processes go too
        scorer.close()
        raise
    cdtype = compute_dtype(spec.model.dtype, device)
    loading = f"loading {spec.model.path}" + (" and the checkpoint to resume from" if resume else
                                              " from the checkpoint it continues" if start_from else "")
    with progress.phase(Phase.model_load, loading):
        models = _load_models(spec, model_dir, resume or (start_from and start_from.folder), device, cdtype)
        policy, tokenizer = models.policy, models.tokenizer
        optimizer, state, plans = _optimizer_and_state(spec, models, resume, cdtype)
        if resume is None and start_from is not None and start_from.optimizer:
            checkpoint.load_optimizer(start_from.folder, optimizer, policy)

    template = spec.task.prompt_template
    train_ids = encode_prompts(tokenizer, task.train, template)
    eval_ids = encode_prompts(tokenizer, task.eval, template)
    max_len = max(len(p) for p in train_ids + eval_ids) + spec.rollout.max_new_tokens
    if spec.task.env is not None:  # an episode: its opening, then model and environment tokens
        max_len = max(len(p) for p in train_ids + eval_ids) + ENV_PROMPT_ROOM + env_budget(spec)
        positions = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
        max_len = min(max_len, positions) if isinstance(positions, int) else max_len
    kind = spec.rollout.engine if spec.rollout.engine != "auto" else default_engine(device)
    with progress.phase(Phase.engine_start, f"starting the {kind} rollout engine"):
        engine = make_engine(spec.rollout.engine, models.source, models.engine_model, tokenizer,
                             dtype=spec.model.dtype, seed=spec.seed, max_model_len=max_len,
                             max_num_seqs=max(widest_samples(spec), len(eval_ids) * spec.eval.samples_per_prompt),
                             lora_rank=spec.model.lora.rank if spec.model.lora is not None else None)
        if models.engine_model is not policy:
            engine.sync_weights(policy)  # a resume restored the sharded weights from dcp/
    budget = spec.algo.micro_batch_tokens
    micro = auto_micro_batch_tokens(policy, max_len) if budget == "auto" else int(budget)
    try:
        env = job_environment(spec, out_dir)
    except BaseException:
        scorer.close()
        engine.close()
        raise
    return Run(spec=spec, out_dir=Path(out_dir), device=device, task=task, model_dir=model_dir,
               tokenizer=tokenizer, policy=policy, ref=models.ref, optimizer=optimizer, engine=engine,
               scorer=scorer, stream=PromptStream(range(len(task.train)), spec.seed, state.data_cursor),
               plans=plans, state=state, train_ids=train_ids, eval_ids=eval_ids,
               micro_batch_tokens=micro, compute_dtype=cdtype,
               update_cfg=UpdateConfig.from_spec(spec, cdtype),
               advantage_fn=ADVANTAGES[spec.algo.advantage], stop_check=stop_check,
               plateau=Plateau(state.plateau_best, state.plateau_since), progress=progress,
               difficulty=make_difficulty_filter(spec, len(task.train), state.difficulty), env=env, max_seq_len=max_len,
               **{name: getattr(state, name) for name in RESUMED_COUNTERS})
