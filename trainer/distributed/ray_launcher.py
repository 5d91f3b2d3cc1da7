"""The `ray` launcher: a job's `nodes x gpus_per_node` ranks on the nodes of a Ray cluster.

Placement: one placement group of `nodes` bundles, each `gpus_per_node` units of
`BRORL_RAY_GPU_RESOURCE` ("GPU"; a custom resource on CPU-only clusters, e.g. the tests'),
`gpus_per_node x BRORL_RAY_CPUS_PER_RANK` CPUs and `gpus_per_node x BRORL_RAY_MEMORY_PER_RANK_GB`
GiB of Ray's `memory` (`bundle`), strategy STRICT_SPREAD: one bundle per node, all reserved at
once or none. While the group is pending, the ranks poll as running
(a cancel reaches the wait) and the job gets a `progress` event (phase `launch`) saying what
it waits for and its place among the pending jobs; the group holds nothing until it is whole.
A cancel during the wait (the `stop` file), a fenced attempt or `BRORL_RAY_PLACEMENT_TIMEOUT_S`
removes the group.

Start: one `NodeAgent` actor per bundle (it holds the bundle's resources, so Ray sets
CUDA_VISIBLE_DEVICES to the node's GPUs). Node 0's agent picks the rendezvous address; each
agent then starts its node's ranks as plain processes with torch.distributed's environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT): no torchrun, because Ray already does its
agent's work (placing, watching nodes), and each rank's own exit code reaches us without
parsing a log. The ranks run `trainer.distributed.rank_main` unchanged and talk to the worker
only through the control folder, so every node must see the job's folders (the data dir, the
model cache) at the same path: each agent checks it sees `job.json` and leaves a mark the
worker must see back, or the attempt fails naming the node (`SharedStorageError`).

End: every poll asks each agent for its ranks' exit codes. All 0: done. A rank that exits
non-zero, or a node whose agent is gone (a Ray node lost), ends the attempt: the exit codes
and lost nodes go to `exits.json` for `dead_rank`, every rank left is killed, the actors and
the group released. Each rank gets SIGKILL when its agent dies (PR_SET_PDEATHSIG), so a lost
actor leaves no rank behind. Logs: ours in `ray.log`, node i's ranks' output in
`ray-node-<i>.log` (its tail copied into `ray.log` after a death).
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trainer.distributed.launchers import RANK_MODULE, Launcher, Ranks
from trainer.distributed.protocol import ControlFolder
from trainer.events import EventType
from trainer.spec import JobSpec

log = logging.getLogger(__name__)

GROUP_PREFIX = "brorl-"
KILL_WAIT_S = 10.0
AGENT_TIMEOUT_S = 30.0   # an agent that does not answer a poll for this long: its node is lost
FIRST_WAIT_EVENT_S = 2.0  # a job placed within this says nothing of a wait
WAIT_EVENT_S = 30.0      # how often a waiting job is told again what it waits for
EXITS = "exits.json"
# What the ranks take from the worker's environment (the node's own is kept otherwise): the
# trainer's settings and the library switches that make a rank behave as on the worker.
FORWARDED_ENV = ("BRORL_", "OMP_NUM_THREADS", "HF_", "TRANSFORMERS_", "TOKENIZERS_PARALLELISM")


class SharedStorageError(RuntimeError):
    """A node does not see the job's control folder: the data dir is not shared. Not retryable:
    another attempt would meet the same deployment."""


class PlacementTimeout(RuntimeError):
    """The job's nodes could not be reserved within BRORL_RAY_PLACEMENT_TIMEOUT_S."""


def connect(address: str) -> None:
    """Join the deployment's Ray cluster once per process (a test's driver may already have)."""
    if ray.is_initialized():
        return
    if not address:
        raise RuntimeError("BRORL_LAUNCHER=ray needs BRORL_RAY_ADDRESS (the Ray cluster's address, "
                           "e.g. ray://head:10001 or head:6379)")
    # Celery's worker replaces sys.stdout/stderr with proxies that have no fileno(), which
    # ray.init needs: it gets the process's real streams for the call.
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = sys.__stdout__ or sys.stdout, sys.__stderr__ or sys.stderr
    try:
        ray.init(address=address, namespace="brorl", log_to_driver=False, logging_level=logging.WARNING)
    finally:
        sys.stdout, sys.stderr = streams


def _die_with_parent() -> None:
    """In a rank, before exec: SIGKILL when the agent that started it dies (a lost node's raylet
    takes its workers down; their ranks must not outlive them)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def storage_problem(control: Path, node: int, where: str) -> str | None:
    """Why node `node` (at `where`) cannot serve the job from `control`, or None: it must read
    the job there and write its mark (`node-<i>.seen`), which the worker then looks for."""
    if not (control / "job.json").is_file():
        return (f"node {node} ({where}) does not see the job's control folder {control}: the Ray "
                "launcher needs BRORL_DATA_DIR (and BRORL_CACHE_DIR) on a filesystem every node "
                "mounts at the same path (docs/many-gpus.md, Ray launcher)")
    try:
        (control / f"node-{node}.seen").write_text(where)
    except OSError as exc:
        return f"node {node} ({where}) cannot write to the job's control folder {control}: {exc}"
    return None


class NodeAgent:
    """On one node (one bundle): starts that node's ranks, reports their exit codes, signals them.
    A Ray actor with one thread: each call is short, and the ranks are forked from that thread
    (PR_SET_PDEATHSIG follows the thread that forked)."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}

    def rendezvous(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), _free_port()

    def start(self, control: str, node: int, nproc: int, world: int, master: tuple[str, int],
              env: dict[str, str]) -> str | None:
        """Start ranks node*nproc .. node*nproc+nproc-1; a storage problem instead, as text."""
        where = f"{ray.util.get_node_ip_address()}, Ray node {ray.get_runtime_context().get_node_id()[:12]}"
        if (problem := storage_problem(Path(control), node, where)) is not None:
            return problem
        base = {**os.environ, **env, "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]),
                "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node),
                "NODE_RANK": str(node)}
        with open(Path(control) / f"ray-node-{node}.log", "ab") as out:
            for local in range(nproc):
                rank = node * nproc + local
                self.procs[rank] = subprocess.Popen(
                    [sys.executable, "-m", RANK_MODULE, control], stdout=out, stderr=subprocess.STDOUT,
                    env={**base, "RANK": str(rank), "LOCAL_RANK": str(local)},
                    start_new_session=True, preexec_fn=_die_with_parent)
        return None

    def poll(self) -> dict[int, int | None]:
        return {rank: p.poll() for rank, p in self.procs.items()}

    def stop(self, sig: int, wait_s: float) -> dict[int, int | None]:
        """`sig` to every rank still running (and its session: what it forked), SIGKILL after
        `wait_s`; returns once each is gone, with the exit codes."""
        for p in self.procs.values():
            if p.poll() is None:
                _signal_session(p.pid, sig)
        deadline = time.monotonic() + wait_s
        while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in self.procs.values():
            if p.poll() is None:
                _signal_session(p.pid, signal.SIGKILL)
                p.wait()
        return self.poll()


def _signal_session(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # each rank leads a session of its own (start_new_session)
    except ProcessLookupError:
        pass


_Agent = ray.remote(max_restarts=0, max_concurrency=1)(NodeAgent)


def bundle(settings, nproc: int) -> dict[str, float]:
    """One node's share of a job of `nproc` ranks per node: its GPUs, CPUs and host memory (Ray's
    `memory` resource, in bytes; left out at BRORL_RAY_MEMORY_PER_RANK_GB=0). Reserving the
    memory keeps Ray from packing other work onto a node whose RAM the ranks need (loading a
    model, a distributed checkpoint's buffers); it is a reservation, not a limit."""
    shape = {"CPU": settings.ray_cpus_per_rank * nproc, settings.ray_gpu_resource: nproc}
    if settings.ray_memory_per_rank_gb > 0:
        shape["memory"] = int(settings.ray_memory_per_rank_gb * nproc * 2**30)
    return shape


def _forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}


class RayRanks(Ranks):
    """One attempt's placement group, node agents and ranks, driven from `poll`."""

    def __init__(self, control: ControlFolder, spec: JobSpec, event: Callable[[str, dict], None],
                 settings) -> None:
        self.control, self.event, self.settings = control, event, settings
        self.nodes, self.nproc = spec.resources.nodes, spec.resources.gpus_per_node
        self.min_nodes = spec.resources.min_nodes or self.nodes
        self.bundle = bundle(settings, self.nproc)
        self.name = f"{GROUP_PREFIX}{time.time_ns()}-{uuid.uuid4().hex[:8]}"  # sorts by creation
        self.agents: list = []
        self.rc: int | None = None
        self.t0 = self.asked_at = time.monotonic()
        self.last_event = float("-inf")
        self._ask(self.nodes)

    def _ask(self, nodes: int) -> None:
        """One placement group of `nodes` bundles, one per node (all or none)."""
        self.nodes, self.asked_at = nodes, time.monotonic()
        self.group = placement_group([dict(self.bundle)] * nodes, strategy="STRICT_SPREAD", name=self.name)
        self.ready = self.group.ready()
        self._log(f"placement group {self.name}: {nodes} x {self.bundle}, STRICT_SPREAD")

    # --- what the launcher's caller sees
    def poll(self) -> int | None:
        if self.rc is not None:
            return self.rc
        if not self.agents:
            return self._wait_for_placement()
        codes, lost = self._poll_agents(AGENT_TIMEOUT_S)
        if not lost and all(c == 0 for per in codes.values() for c in per.values()):
            self._release()
            return self._end(0)
        if lost or any(c not in (None, 0) for per in codes.values() for c in per.values()):
            self._record_exits(codes, lost)
            self._stop_all(signal.SIGKILL, 0.0)
            return self._end(1)
        return None

    def terminate(self) -> None:
        self._stop_all(signal.SIGTERM, KILL_WAIT_S)
        self._end(self.rc if self.rc is not None else 1)

    def kill(self) -> None:
        self._stop_all(signal.SIGKILL, 0.0)
        self._end(self.rc if self.rc is not None else 1)

    # --- placement
    def _wait_for_placement(self) -> int | None:
        if self.control.stop_requested():  # cancelled while waiting: nothing ran, nothing held
            self._log("stopped while waiting for placement")
            self._release()
            return self._end(0)
        done, _ = ray.wait([self.ready], timeout=0)
        if not done:
            waited = time.monotonic() - self.t0
            timeout = self.settings.ray_placement_timeout_s
            if timeout and waited > timeout:
                self._release()
                raise PlacementTimeout(
                    f"{self.nodes} nodes of {self.bundle} were not free within {timeout:.0f} s "
                    "(BRORL_RAY_PLACEMENT_TIMEOUT_S); nothing was held")
            if self.min_nodes < self.nodes and time.monotonic() - self.asked_at >= self.settings.ray_shrink_after_s:
                self._shrink()
            if waited >= FIRST_WAIT_EVENT_S and time.monotonic() - self.last_event >= WAIT_EVENT_S:
                self._wait_event(waited)
            return None
        self._log(f"placed after {time.monotonic() - self.t0:.1f} s")
        self._start_agents()
        return self.rc

    def _shrink(self) -> None:
        """Fewer nodes than the job asks for can hold one of its bundles (one was lost, say): ask
        for the nodes there are, down to `resources.min_nodes`. Nodes that exist but are busy are
        waited for, as before: shrinking is for capacity that is gone, not for a queue."""
        exist = sum(1 for n in ray.nodes() if n.get("Alive")
                    and all(n.get("Resources", {}).get(k, 0) >= v for k, v in self.bundle.items()))
        fewer = max(self.min_nodes, min(exist, self.nodes))
        if fewer >= self.nodes:
            self.asked_at = time.monotonic()  # look again after another BRORL_RAY_SHRINK_AFTER_S
            return
        asked = self.nodes
        try:
            remove_placement_group(self.group)
        except Exception:  # noqa: BLE001 - gone already
            log.debug("placement group %s already gone", self.name, exc_info=True)
        self._ask(fewer)
        message = (f"running on {fewer} nodes instead of {asked}: only {exist} nodes of the cluster can hold "
                   f"one of its bundles (resources.min_nodes is {self.min_nodes}); the job resumes its "
                   "checkpoint on the smaller world")
        self._log(message)
        self.event(EventType.warning, {"message": message, "nodes": fewer, "asked": asked})

    def _wait_event(self, waited: float) -> None:
        table = placement_group_table()
        pending = sorted(v["name"] for v in table.values()
                         if v["state"] == "PENDING" and str(v.get("name", "")).startswith(GROUP_PREFIX))
        ours = table.get(self.group.id.hex(), {})
        position = pending.index(self.name) + 1 if self.name in pending else 1
        infeasible = ours.get("stats", {}).get("scheduling_state") == "INFEASIBLE"
        why = ("no set of nodes in the Ray cluster can hold it (until nodes are added)" if infeasible
               else "the nodes are busy")
        gpus = f"{self.nproc} {self.settings.ray_gpu_resource}"
        memory = f" and {self.bundle['memory'] / 2**30:g} GiB of memory" if "memory" in self.bundle else ""
        message = (f"waiting for {self.nodes} nodes with {gpus}, {self.bundle['CPU']} CPUs{memory} each, all "
                   f"at once: {why}; job {position} of {len(pending) or 1} waiting; nothing is held meanwhile")
        self.event(EventType.progress, {"phase": "launch", "message": message, "done": 0, "total": self.nodes,
                                "finished": False, "queue_position": position, "infeasible": infeasible,
                                "waited_s": round(waited, 1)})
        self._log(message)
        self.last_event = time.monotonic()

    def _start_agents(self) -> None:
        gpu_res = self.settings.ray_gpu_resource
        need = {"num_gpus": self.nproc} if gpu_res == "GPU" else {"resources": {gpu_res: self.nproc}}
        if "memory" in self.bundle:  # the agent holds the whole bundle, its memory too
            need["memory"] = self.bundle["memory"]
        self.agents = [_Agent.options(
            num_cpus=self.bundle["CPU"], **need, name=f"{self.name}-node-{i}",
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i),
        ).remote() for i in range(self.nodes)]
        world = self.nodes * self.nproc
        try:
            master = ray.get(self.agents[0].rendezvous.remote(), timeout=AGENT_TIMEOUT_S)
            problems = ray.get([a.start.remote(str(self.control.path), i, self.nproc, world, master, _forwarded_env())
                                for i, a in enumerate(self.agents)], timeout=AGENT_TIMEOUT_S)
        except (RayActorError, GetTimeoutError) as exc:  # a node lost while starting: a machine fault
            self._log(f"a node was lost while starting the ranks: {exc}")
            self._record_exits({}, list(range(self.nodes)))
            self._stop_all(signal.SIGKILL, 0.0)
            self._end(1)
            return
        problems = [p for p in problems if p] + [
            f"the worker does not see node {i}'s mark in {self.control.path}: the Ray launcher needs the "
            "data dir on a filesystem every node mounts at the same path (docs/many-gpus.md, Ray launcher)"
            for i in range(self.nodes) if not self.control.file(f"node-{i}.seen").is_file()]
        if problems:
            self._stop_all(signal.SIGKILL, 0.0)
            self._end(1)
            raise SharedStorageError(problems[0])
        self._log(f"{world} ranks started on {self.nodes} nodes, rendezvous at {master[0]}:{master[1]}")
        self.event(EventType.progress, {"phase": "launch", "message": f"{world} ranks started on {self.nodes} nodes",
                                "done": self.nodes, "total": self.nodes, "finished": True,
                                "seconds": round(time.monotonic() - self.t0, 3)})

    # --- the running ranks
    def _poll_agents(self, timeout: float) -> tuple[dict[int, dict[int, int | None]], list[int]]:
        """Each node's {rank: exit code or None}, and the nodes whose agent is gone or silent."""
        refs = {i: a.poll.remote() for i, a in enumerate(self.agents)}
        codes, lost = {}, []
        deadline = time.monotonic() + timeout
        for i, ref in refs.items():
            try:
                codes[i] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (RayActorError, GetTimeoutError):
                lost.append(i)
        return codes, lost

    def _record_exits(self, codes: dict[int, dict[int, int | None]], lost: list[int]) -> None:
        exits = {str(r): c for per in codes.values() for r, c in per.items() if c is not None}
        lost_ranks = [i * self.nproc + k for i in lost for k in range(self.nproc)]
        (self.control.path / EXITS).write_text(json.dumps({"exits": exits, "lost_nodes": lost,
                                                           "lost_ranks": lost_ranks}))
        self._log(f"attempt ended: rank exits {exits}, lost nodes {lost}")
        for i in range(self.nodes):
            tail = self.control.text(f"ray-node-{i}.log")[-2000:]
            if tail:
                self._log(f"--- ray-node-{i}.log ends:\n{tail}")

    def _stop_all(self, sig: int, wait_s: float) -> None:
        """Signal every node's ranks, wait until they are gone, then release the actors and group.
        A node that does not answer is lost: its ranks died with its agent."""
        refs = [a.stop.remote(int(sig), wait_s) for a in self.agents]
        for ref in refs:
            try:
                ray.get(ref, timeout=wait_s + AGENT_TIMEOUT_S)
            except (RayActorError, GetTimeoutError):
                pass
        self._release()

    def _release(self) -> None:
        for agent in self.agents:
            ray.kill(agent, no_restart=True)
        try:
            remove_placement_group(self.group)
        except Exception:  # noqa: BLE001 - already removed (a second stop), or the cluster went away
            log.debug("placement group %s already gone", self.name, exc_info=True)

    def _end(self, rc: int) -> int:
        self.rc = rc
        return rc

    def _log(self, line: str) -> None:
        log.info("%s", line)
        with open(self.control.file(RayLauncher.log_name), "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")


class RayLauncher(Launcher):
    name = "ray"
    log_name = "ray.log"

    def start(self, control: ControlFolder, spec: JobSpec, event: Callable[[str, dict], None]) -> RayRanks:
        from trainer.settings import trainer_settings

        settings = trainer_settings()
        connect(settings.ray_address)
        return RayRanks(control, spec, event, settings)

    def dead_rank(self, control: ControlFolder, raised: set[int]) -> tuple[int | None, int | None]:
        """A rank of a lost node first (its exit code unknown); else one that exited without an
        error of its own, a signal before a code; else (None, None)."""
        text = control.text(EXITS)
        if not text:
            return None, None
        data = json.loads(text)
        if data["lost_ranks"]:
            return data["lost_ranks"][0], None
        silent = [(int(r), c) for r, c in data["exits"].items() if c != 0 and int(r) not in raised]
        return min(silent, key=lambda f: (f[1] >= 0, f[0])) if silent else (None, None)
