"""How a job's ranks are started: the `Launcher` interface and the launchers there are.

`trainer.distributed.launch` supervises a many-rank attempt the same way whoever starts the
ranks: it writes the job into the control folder (`trainer.distributed.protocol`), asks the
deployment's launcher to start `spec.resources.nodes x gpus_per_node` ranks running
`python -m trainer.distributed.rank_main <control folder>`, relays rank 0's reports, and
through the returned `Ranks` handle polls, stops and kills them. A launcher only places and
starts processes; it never reads the job's messages, and the ranks never know which launcher
started them.

A second launcher (Ray, across nodes) is a subclass of `Launcher` and `Ranks` in a module of its
own, registered in `trainer.settings.LAUNCHERS`, and chosen with `BRORL_LAUNCHER`.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Callable, ClassVar

from trainer.distributed.protocol import ControlFolder
from trainer.settings import LAUNCHERS, trainer_settings
from trainer.spec import JobSpec

RANK_MODULE = "trainer.distributed.rank_main"


class Ranks(ABC):
    """One start of a job's ranks, wherever they run."""

    @abstractmethod
    def poll(self) -> int | None:
        """None while any rank may still run; then the attempt's exit code (0: all exited 0)."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask every rank to exit now (they have had the stop file and its grace period); kill
        those still there after a short wait. Returns once all are gone."""

    @abstractmethod
    def kill(self) -> None:
        """Kill every rank at once, on every node (a fenced attempt, or the worker going away).
        Returns once all are gone: nothing of the attempt may keep running."""


class Launcher(ABC):
    """Starts a job's ranks and says, after a death, which rank died and how."""

    name: ClassVar[str]
    log_name: ClassVar[str]  # its log in the control folder: its own and the ranks' output

    @abstractmethod
    def start(self, control: ControlFolder, spec: JobSpec, event: Callable[[str, dict], None]) -> Ranks:
        """Start the job's ranks on `control` (its job.json is written). Returns at once: a
        launcher that must first wait for machines (all of a job's nodes or none) returns ranks
        that poll as running meanwhile, so a cancel reaches the wait, and says what it waits
        for through `event(type, data)` (the job's event stream): a `trainer.events.EventType`,
        `progress` with phase `launch` for a wait (any other type raises)."""

    @abstractmethod
    def dead_rank(self, control: ControlFolder, raised: set[int]) -> tuple[int | None, int | None]:
        """(rank, exit code or -signal) of the rank whose death ended the attempt, from what
        this launcher recorded in `control`; `raised`: ranks that reported an error (they did
        not die silently). (None, None) when unknown."""


def launcher_named(name: str) -> Launcher:
    """The launcher called `name`; a ValueError naming BRORL_LAUNCHER and the choices otherwise."""
    if name not in LAUNCHERS:
        raise ValueError(f"BRORL_LAUNCHER={name!r}: no such launcher; choose one of {', '.join(sorted(LAUNCHERS))}")
    module, cls = LAUNCHERS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def configured_launcher() -> Launcher:
    """The deployment's launcher (`BRORL_LAUNCHER`, default `local`)."""
    return launcher_named(trainer_settings().launcher)
