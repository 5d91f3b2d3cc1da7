"""The `local` launcher: `torchrun --standalone` starts a job's G ranks on this node.

torchrun runs in a session of its own (a terminal's Ctrl-C reaches only the worker, which then
asks the ranks to stop through the control folder) and writes its and the ranks' output to
`torchrun.log` there. After a death, torchrun's failure report in that log names the rank.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from trainer.distributed.launchers import RANK_MODULE, Launcher, Ranks
from trainer.distributed.protocol import ControlFolder
from trainer.spec import JobSpec

log = logging.getLogger(__name__)

KILL_WAIT_S = 10.0


def _rank_pids(control: Path) -> list[int]:
    """Live processes running `trainer.distributed.rank_main <control>` (read from /proc)."""
    want = f"{RANK_MODULE}\0{control}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and want in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


class LocalRanks(Ranks):
    """The torchrun process and the ranks it started."""

    def __init__(self, proc: subprocess.Popen, control: Path) -> None:
        self.proc, self.control = proc, control

    def poll(self) -> int | None:
        return self.proc.poll()

    def _signal(self, sig: int, every_rank: bool = False) -> None:
        """`sig` to torchrun's process group and, with `every_rank`, to every rank of this job
        (torchrun starts each rank in a session of its own, out of reach of its group)."""
        try:
            os.killpg(self.proc.pid, sig)  # torchrun: its own session (start_new_session)
        except ProcessLookupError:
            pass
        for pid in _rank_pids(self.control) if every_rank else []:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)  # torchrun passes it on to its ranks
        try:
            self.proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL torchrun and every rank, and return once none is left: a killed process keeps
        its command line until the kernel has torn it down, and a rank's forked helpers carry the
        same one, so the search repeats until it comes back empty (or KILL_WAIT_S passes)."""
        self._signal(signal.SIGKILL, every_rank=True)
        self.proc.wait()
        deadline = time.monotonic() + KILL_WAIT_S
        while _rank_pids(self.control) and time.monotonic() < deadline:
            time.sleep(0.05)
            self._signal(signal.SIGKILL, every_rank=True)


_FAILURE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_ROOT_CAUSE = re.compile(r"Root Cause.*?" + _FAILURE.pattern, re.S)


def _dead_rank(log_text: str, raised: set[int] = frozenset()) -> tuple[int | None, int | None]:
    """(rank, exit code) of the rank that died, from torchrun's failure report: one killed by a
    signal and not among `raised` (the ranks that wrote an error) first; else the root cause.
    torchrun's "first observed failure" is often a survivor whose collective broke."""
    report = log_text[log_text.rfind("Failures:"):] if "Failures:" in log_text else log_text
    signalled = [(int(m.group(1)), int(m.group(2))) for m in _FAILURE.finditer(report)
                 if int(m.group(2)) < 0 and int(m.group(1)) not in raised]
    if signalled:  # SIGTERM last: it is what torchrun sends the survivors
        return min(signalled, key=lambda f: f[1] == -signal.SIGTERM)
    m = _ROOT_CAUSE.search(report)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _command(control: Path, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", RANK_MODULE, str(control)]


class LocalLauncher(Launcher):
    name = "local"
    log_name = "torchrun.log"

    def start(self, control: ControlFolder, spec: JobSpec, event: Callable[[str, dict], None]) -> LocalRanks:
        if spec.resources.nodes != 1:  # the API refuses it; a library caller gets told why
            raise ValueError(f"resources.nodes={spec.resources.nodes}: the local launcher runs one node")
        nproc = spec.resources.gpus_per_node
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        with open(control.file(self.log_name), "wb") as out:
            proc = subprocess.Popen(_command(control.path, nproc), stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # a terminal's Ctrl-C reaches only us
        log.info("started %d ranks (torchrun pid %d), control folder %s", nproc, proc.pid, control.path)
        return LocalRanks(proc, control.path)

    def dead_rank(self, control: ControlFolder, raised: set[int]) -> tuple[int | None, int | None]:
        return _dead_rank(control.text(self.log_name), raised)
