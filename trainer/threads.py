"""torch's CPU thread count for a training run, from the cores this process may actually use.

torch defaults to one OpenMP thread per *physical* core of the machine, ignoring the CPU
affinity mask and the container's cgroup quota. More threads than usable cores spin-wait
against each other: on this project's 2 shared cores, 2 threads under load made steps 6-10x
slower than 1 (docs/results.md). So the trainer sets the count itself, once, at the start of a run:
the fewest of the affinity mask's CPUs and the cgroup `cpu.max` quota (rounded up), divided
among the job's ranks on this node (torchrun's LOCAL_WORLD_SIZE), unless `BRORL_TORCH_THREADS`
(threads per process) says otherwise.
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch

from trainer.settings import trainer_settings

log = logging.getLogger(__name__)

ENV = "BRORL_TORCH_THREADS"
CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def cgroup_cpus(v2: Path = CGROUP_V2, v1: tuple[Path, Path] = CGROUP_V1) -> int | None:
    """CPUs the cgroup quota allows (rounded up), or None when there is no quota."""
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
        if v1[0].is_file() and v1[1].is_file():
            quota_us, period_us = int(v1[0].read_text()), int(v1[1].read_text())
            return None if quota_us <= 0 else max(1, math.ceil(quota_us / period_us))
    except (OSError, ValueError):  # unreadable or odd: no quota known
        return None
    return None


def usable_cpus(cgroup: int | None = None) -> int:
    """min(CPUs in this process's affinity mask, the cgroup quota)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup if cgroup is not None else cgroup_cpus()
    return max(1, min(cpus, quota) if quota else cpus)


def threads_setting(env: dict[str, str] | None = None) -> int | None:
    """`BRORL_TORCH_THREADS` as a positive int, None when unset or empty; else a clear error."""
    return trainer_settings(env).torch_threads


def ranks_on_this_node(env: dict[str, str] | None = None) -> int:
    """The processes sharing this machine's CPUs for one job: torchrun's LOCAL_WORLD_SIZE, 1 outside it."""
    value = (os.environ if env is None else env).get("LOCAL_WORLD_SIZE", "1")
    return max(1, int(value)) if value.isdigit() else 1


def configure_threads(env: dict[str, str] | None = None) -> int:
    """Set torch's intra-op thread count (the setting, else the usable CPUs shared out among the
    job's ranks on this node); log and return it.

    Each rank is a process of its own: 2 ranks on 2 cores with 2 threads each spun against each
    other and made a 2-rank LoRA step 10-20x slower (5-10 s against 0.4 s with 1 thread each)."""
    setting = threads_setting(env)
    ranks = ranks_on_this_node(env)
    n = setting or max(1, usable_cpus() // ranks)
    torch.set_num_threads(n)
    log.info("torch threads: %d (%s)", n, f"{ENV}" if setting else
             "usable CPUs: affinity and cgroup quota" + (f", shared by {ranks} ranks" if ranks > 1 else ""))
    return n
