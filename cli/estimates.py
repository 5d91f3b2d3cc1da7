"""Plain-text forms of an estimate (`brorl submit --dry-run`) and of a job's queue place or ETA
(`brorl jobs show`), from the API's JSON (docs/api.md, "Estimates")."""
from __future__ import annotations

from typing import Any


def duration(seconds: float) -> str:
    """4 s, 3 min 20 s, 2 h 05 min."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def estimate_text(est: dict[str, Any]) -> str:
    lines = [f"{est['model']} on {est['gpus']} GPU(s): {est['steps']} steps"]
    for st in est["stages"]:
        lines.append(f"  stage {st['stage']}: {st['steps']} steps x {st['prompts_per_step']} prompts "
                     f"x n={st['n']} = {st['samples']:,} samples, <= {st['response_tokens_max']:,} tokens")
    ev = est["evaluation"]
    lines.append(f"  evaluation: {ev['count']} x {ev['prompts']} prompts x {ev['samples_per_prompt']} "
                 f"= {ev['samples']:,} samples, <= {ev['response_tokens_max']:,} tokens")
    lines.append(f"  in all: {est['samples']:,} samples, <= {est['response_tokens_max']:,} tokens "
                 f"({est['tokens_note']})")
    wall = est["wall_time"]
    lines.append(f"wall time: about {duration(wall['seconds'])} "
                 f"(start-up {duration(wall['parts']['startup'])}, steps {duration(wall['parts']['steps'])}, "
                 f"evaluation {duration(wall['parts']['evaluation'])})")
    lines.append(f"  how: {wall['derivation']}")
    acc = wall["past_accuracy"]
    if acc.get("jobs"):
        lines.append(f"  past jobs: actual / estimate, median {acc['median_actual_over_estimate']} "
                     f"over {acc['jobs']} job(s)")
    else:
        lines.append("  past jobs: none to compare with yet")
    mem = est["memory"]
    if mem.get("total_gb") is not None:
        fit = {True: "fits", False: "DOES NOT FIT", None: "not checked"}[est["fits"]]
        against = f" of {mem['worker_gb']} GiB" if mem.get("worker_gb") else ""
        lines.append(f"memory: {mem['total_gb']} GiB per rank{against}: {fit} "
                     f"({mem['params']:,} parameters, from {mem['params_from']})")
    lines.append(f"  {mem['note']}")
    lines.append(f"queue: {est['queued_ahead']} job(s) queued on {queue_name(est)} now")
    return "\n".join(lines)


def queue_name(place: dict[str, Any]) -> str:
    """The queue a job waits on, in words (an estimate's or a queued job's `queue`)."""
    return "the multi-node queue" if place.get("multi_node") else f"the {place['gpus']}-GPU queue"


def progress_line(job: dict[str, Any]) -> str | None:
    """A queued job's place or a running job's ETA, in one line; None for other jobs."""
    queue = job.get("queue")
    if queue:
        return (f"queued: position {queue['position']} on {queue_name(queue)} "
                f"({len(queue['yours_ahead'])} of yours and {queue['others_ahead']} other(s) ahead, "
                f"{queue['running']} running)")
    if job.get("eta_seconds") is not None:
        return (f"running: step {job['step']}/{job['total_steps']}, about "
                f"{duration(job['eta_seconds'])} left (ETA {job['eta_at']})")
    return None
