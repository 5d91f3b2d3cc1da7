"""The BroRL loop in one process (or on one rank), top to bottom; `trainer.entry.train` calls it.

Each step: maybe evaluate -> pick prompts -> generate N rollouts per prompt -> score ->
advantages -> filter (refill) -> PPO mini-batches (micro-batched backward) -> optimizer step
-> sync weights into the rollout engine -> log -> maybe checkpoint -> maybe reset reference.
The step itself lives in `trainer.step`; building the run in `trainer.run`.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

from trainer.checkpoints import io as checkpoint
from trainer import collectives as distributed
from trainer.run import RESUMED_COUNTERS, Run, build_run, spec_sha256
from trainer.prompt_stream import mix_seed
from trainer.evaluate import EvalContext, evaluate
from trainer.events import EventType, Phase, PhaseProgress
from trainer.algo.schedule import broaden, stage_for_step, stage_warning
from trainer.result import TrainResult
from trainer.sink import MetricsSink
from trainer.spec import JobSpec, changed_fields
from trainer.step import run_step
from trainer.stop import StopRequested, never, stop_check

log = logging.getLogger(__name__)


def _due(every: int, step: int) -> bool:
    return every > 0 and step % every == 0


def _eval_context(run: Run) -> EvalContext:
    """The run's engine and scorer over the eval split: what evaluation and the probe sample."""
    return EvalContext(run.engine, run.tokenizer, run.scorer, run.task.eval, run.eval_ids, env=run.env,
                       max_context=run.max_seq_len)


def _evaluate(run: Run, sink: MetricsSink, step: int) -> dict[str, float]:
    run.stop_check()
    prompts, per = len(run.eval_ids), run.spec.eval.samples_per_prompt
    with run.progress.phase(Phase.eval, f"evaluating at step {step}: {prompts} prompts x {per} samples",
                            total=prompts * per, step=step):
        values = evaluate(_eval_context(run), run.spec, seed=mix_seed(run.spec.seed, 104729))  # same draws each time
    values = distributed.from_rank0(values)  # the ranks' engines agree; one figure is reported
    sink.event(EventType.eval, {"step": step, **values})
    return values


def _checkpoint(run: Run, sink: MetricsSink, step: int) -> Path:
    run.state.step = step
    run.state.data_cursor = run.stream.cursor
    for name in RESUMED_COUNTERS:
        setattr(run.state, name, getattr(run, name))
    run.state.plateau_best, run.state.plateau_since = run.plateau.best, run.plateau.since
    run.state.difficulty = run.difficulty.state_dict() if run.difficulty is not None else None
    saved = checkpoint.save(run.out_dir, run.state, run.policy, run.tokenizer, run.optimizer, run.ref)
    sink.checkpoint(step, saved.path, saved.nbytes, saved.sha256)
    # Prune after the sink recorded the new one: a listed checkpoint is never missing its files.
    if distributed.rank() == 0:
        checkpoint.prune(checkpoint.checkpoints_dir(run.out_dir), run.spec.checkpoint.keep_last)
    return saved.path


class StallError(RuntimeError):
    """The job could not learn for `algo.stall_steps` steps and `algo.fail_on_stall` is set."""


def stall_reason(spec: JobSpec, values: dict) -> str | None:
    """Why this step could not teach the policy anything, naming the knob to turn; else None."""
    if values.get("truncated_frac", 0.0) >= 1.0:
        return (f"every response was cut at rollout.max_new_tokens ({spec.rollout.max_new_tokens}) "
                f"before it finished: raise rollout.max_new_tokens")
    if spec.algo.dynamic_sampling and values.get("kept_groups", 1) == 0:
        return ("no prompt group had differing rewards, so dynamic sampling kept nothing to learn "
                "from (frac_all_correct / frac_all_wrong say which side): use an easier or harder "
                "task config, a larger rollout n, or raise algo.max_refill_rounds")
    return None


def _check_stall(run: Run, sink: MetricsSink, step: int, values: dict) -> None:
    """Warn once when `algo.stall_steps` steps in a row could not learn; fail if asked to."""
    reason = stall_reason(run.spec, values)
    run.stalled_steps = run.stalled_steps + 1 if reason else 0
    if reason and run.stalled_steps == run.spec.algo.stall_steps:
        message = f"no learning for {run.stalled_steps} steps in a row (to step {step}): {reason}"
        sink.event(EventType.warning, {"step": step, "message": message})
        log.warning(message)
        if run.spec.algo.fail_on_stall:
            raise StallError(message + " (algo.fail_on_stall is set)")


def _check_gaming(run: Run, sink: MetricsSink, step: int, values: dict, evaluated: dict | None) -> None:
    """Warn when the training reward rises while eval pass@1 falls (`trainer.algo.gaming`)."""
    if values.get("reward_mean") is not None:
        run.gaming.step(values["reward_mean"])
    if evaluated is None or "eval/pass@1" not in evaluated:
        return
    ev = run.spec.eval
    if message := run.gaming.evaluation(step, evaluated["eval/pass@1"], ev.gaming_window, ev.gaming_min_delta):
        sink.event(EventType.warning, {"step": step, "message": message})
        log.warning(message)


def _check_resumed_spec(run: Run, sink: MetricsSink) -> None:
    """A run resumed under a spec other than its checkpoint's continues with the new spec and
    says which fields changed, in a `warning` event (docs/resume.md); later checkpoints record
    the new spec."""
    now = run.spec.model_dump(mode="json")
    digest = spec_sha256(run.spec)
    if run.state.spec_sha256 == digest:
        return
    saved = run.state.spec
    changed = changed_fields(saved, now) if saved is not None else []
    what = (", ".join(changed) if changed else
            "unknown fields (the checkpoint predates saved specs; only its hash differs)")
    message = (f"resumed from step {run.state.step} with a spec that differs from the checkpoint's "
               f"in: {what}; the run continues with the new values")
    sink.event(EventType.warning, {"step": run.state.step, "message": message, "changed_fields": changed})
    log.warning(message)
    run.state.spec_sha256, run.state.spec = digest, now


def _maybe_broaden(run: Run, sink: MetricsSink, step: int, values: dict) -> None:
    """`rollout.broaden`: after an evaluation at `step` (steps completed), start a wider stage
    at the next step when the metric has not risen by min_delta over `patience` evaluations."""
    b = run.spec.rollout.broaden
    if b is None:
        return
    run.plateau.observe(values[b.metric], b.min_delta)
    if run.plateau.since < b.patience:
        return
    plans = broaden(run.spec, run.plans, step)
    if plans is None:  # at max_n already, or no step left
        return
    prev, new = stage_for_step(run.plans, step - 1), plans[-1]
    reason = (f"{b.metric} did not rise by {b.min_delta} over {b.patience} evaluations "
              f"(best {run.plateau.best:.4f}, now {values[b.metric]:.4f})")
    extra = {}
    if b.trigger == "probe":
        figures = _probe_current(run, step, prev.n)
        extra = {"probe": figures}
        if (figures["solvable_all_wrong"] or 0.0) < b.min_solvable:
            # Nothing a wider batch would find: stay, and look again after `patience` evaluations.
            run.plateau.since = 0
            sink.event(EventType.broaden_skipped, {"step": step, "reason": reason, "n": prev.n,
                                           "min_solvable": b.min_solvable, "probe": figures})
            log.info("plateau at step %d, but the probe found %.3f solvable all-wrong prompts at n %d "
                     "(< %.3f): not broadening", step, figures["solvable_all_wrong"] or 0.0, prev.n,
                     b.min_solvable)
            return
        reason += (f"; the probe found {figures['solvable_all_wrong']:.3f} of prompts all-wrong at "
                   f"n {prev.n} yet solved within {figures['n']} (>= {b.min_solvable})")
    run.plans = plans
    run.state.broaden_starts = [*run.state.broaden_starts, step]
    run.plateau.best, run.plateau.since = values[b.metric], 0  # the new stage gets `patience` evals
    sink.event(EventType.broadened, {"step": step, "reason": reason, "from_n": prev.n, "n": new.n,
                             "prompts_per_step": new.prompts_per_step, "lr": new.lr, "stage": new.index,
                             **extra})
    log.info("broadened at step %d: n %d -> %d (%s)", step, prev.n, new.n, reason)


def _probe_current(run: Run, step: int, at_n: int) -> dict:
    """`rollout.broaden.trigger: probe`: probe the current policy on the eval prompts."""
    from trainer.probe import probe_policy

    b = run.spec.rollout.broaden
    figures = probe_policy(_eval_context(run), run.spec, b.probe_n, b.probe_prompts, at_n, run.stop_check,
                           seed=mix_seed(run.spec.seed, 15485863, step))
    return distributed.from_rank0(figures)


def train_in_process(spec: JobSpec, sink: MetricsSink, should_stop: Callable[[], bool],
                     resume: Path | None = None, *, out_dir: Path, dataset_path: Path | None = None,
                     on_step: Callable[[int, dict], None] | None = None,
                     start_from: checkpoint.StartFrom | None = None) -> TrainResult:
    """`trainer.entry.train`'s contract, in this process; on ranks, each rank runs this."""
    if spec.resources.world_size > 1 and not distributed.launched_as_rank():
        raise ValueError("a job of more than one rank (resources.nodes x gpus_per_node) runs on ranks: "
                         "call trainer.train")
    # On ranks a stop is agreed at step boundaries only: one rank leaving a phase early would
    # leave the others waiting in a collective (the launcher kills ranks after a grace period).
    check = never if distributed.active() else stop_check(should_stop)
    try:
        run = build_run(spec, Path(out_dir), resume, dataset_path, check, PhaseProgress(sink),
                        start_from=None if resume is not None else start_from)
    except StopRequested:  # during the warm start of builtin:tiny
        return TrainResult.stopped_before_start()
    try:
        if resume is not None:
            _check_resumed_spec(run, sink)
        return _run_steps(run, sink, should_stop, on_step)
    finally:
        run.close()


def _run_steps(run: Run, sink: MetricsSink, should_stop: Callable[[], bool],
               on_step: Callable[[int, dict], None] | None) -> TrainResult:
    spec, total = run.spec, run.spec.total_steps
    start = done = run.state.step  # `done`: steps whose update, metrics and eval all finished
    last_eval, last_ckpt, stopped = None, None, False
    try:
        if start == 0:
            last_eval = _evaluate(run, sink, 0)
            sink.metrics(0, {**last_eval, "stage": 0, "n": run.plans[0].n})
            _maybe_broaden(run, sink, 0, last_eval)
        while done < total:
            if distributed.any_true(should_stop()):
                stopped = True
                break
            step = done + 1
            evaluated, saved = _step(run, sink, step, start, on_step)
            last_eval, last_ckpt = evaluated or last_eval, saved or last_ckpt
            done = step
        if stopped and done > start and not _due(spec.checkpoint.every, done):
            last_ckpt = _checkpoint(run, sink, done)  # keep the work done before the stop
    except StopRequested:
        # Stopped inside a phase of a step: that step is abandoned, not saved half-done.
        stopped = True
    return TrainResult(steps_completed=done, stopped=stopped, last_eval=last_eval, last_checkpoint=last_ckpt)


def _step(run: Run, sink: MetricsSink, step: int, start: int,
          on_step: Callable[[int, dict], None] | None) -> tuple[dict | None, Path | None]:
    """Step `step` (counted from 1) and what follows it; returns (its eval, its checkpoint)."""
    spec, done = run.spec, step - 1
    plan = stage_for_step(run.plans, done)  # the schedule counts steps from 0
    if done == plan.first_step or done == start:
        sink.event(EventType.stage_started, {"step": step, **dataclasses.asdict(plan)})
        if done == plan.first_step and (warning := stage_warning(run.plans, plan)):
            sink.event(EventType.warning, {"step": step, "message": warning})
            log.warning(warning)
    run.state.stage = plan.index
    values = run_step(run, plan, done, on_samples=lambda rows: sink.samples(step, rows))
    evaluated = None
    if _due(spec.eval.every, step) or step == spec.total_steps:
        evaluated = _evaluate(run, sink, step)
        values.update(evaluated)
    sink.metrics(step, values)
    run.grader_watch.check(step, spec.task.grader_error_fraction, spec.task.grader_error_steps)
    _check_stall(run, sink, step, values)
    _check_gaming(run, sink, step, values, evaluated)
    if evaluated is not None:
        _maybe_broaden(run, sink, step, values)
    if on_step:
        on_step(step, values)
    # Reset the reference before checkpointing so that a checkpoint holds the state after
    # the whole step (a resume then never has to replay the reset).
    if run.ref is not None and _due(spec.algo.ref_reset_every or 0, step):
        distributed.copy_weights(run.ref, run.policy)  # shard by shard on ranks
        run.state.ref_step = step
    saved = _checkpoint(run, sink, step) if _due(spec.checkpoint.every, step) or step == spec.total_steps else None
    return evaluated, saved
