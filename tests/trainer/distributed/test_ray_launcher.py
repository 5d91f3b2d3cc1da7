"""The Ray launcher on a Ray cluster of simulated nodes on this machine (`ray.cluster_utils.Cluster`:
a head that runs nothing of ours and worker nodes with one `brorl_gpu` each, the custom
resource that stands for a GPU here), gloo ranks, builtin:tiny:
- one step on 2 nodes x 1 rank gives the parameters of 2 local ranks (torchrun) on the same job;
- a job asking for more nodes than are free waits with an event and holds nothing while a
  smaller job runs, and a cancel ends the wait; a rank's memory (BRORL_RAY_MEMORY_PER_RANK_GB)
  counts in placement: a node with less does not take it;
- a rank's process SIGKILLed mid-job (its node left alone) fails the attempt as a machine fault
  (`RankDied` naming the rank and the signal);
- a node removed mid-job fails the attempt as a machine fault (`RankDied`), and the next
  attempt, on the nodes that are left, resumes from the checkpoint; a cancel mid-step stops
  every rank at a step boundary; a fenced attempt kills them at once;
- after each test no rank and no node agent is left, and the cluster's resources are all free.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.services import require_module

ray = require_module("ray")  # skipped here without ray, a failure in CI

from ray.cluster_utils import Cluster  # noqa: E402

from store.errors import Fenced  # noqa: E402
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task  # noqa: E402
from trainer.distributed import launch, ray_launcher  # noqa: E402
from trainer.distributed.protocol import ControlFolder  # noqa: E402
from trainer.sink import ListSink  # noqa: E402
from trainer.spec import JobSpec  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

GPU = "brorl_gpu"  # BRORL_RAY_GPU_RESOURCE here: a CPU-only cluster's stand-in for a GPU
RANK_GB = 1  # BRORL_RAY_MEMORY_PER_RANK_GB here: each bundle reserves 1 GiB of Ray's `memory`
NODE = {"num_cpus": 1, "resources": {GPU: 1}, "memory": 2 * 2**30}  # room for one rank's bundle

SPEC = {
    "name": "ray", "seed": SHARED_SEED, "task": shared_task(),
    "rollout": {"engine": "hf", "max_new_tokens": 24, "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 4}]},
    "optim": {"lr": 1e-4},
    "algo": {"mini_batches": 1, "micro_batch_tokens": 256},
    "eval": {"every": 100, "samples_per_prompt": 2, "k": [1]},
    "checkpoint": {"every": 1, "keep_last": 2},
}


def spec(nodes: int, gpus: int = 1, steps: int = 4, min_nodes: int | None = None) -> JobSpec:
    schedule = [{**SPEC["rollout"]["schedule"][0], "steps": steps}]
    return JobSpec.model_validate({**SPEC, "rollout": {**SPEC["rollout"], "schedule": schedule},
                                   "resources": {"nodes": nodes, "gpus_per_node": gpus, "min_nodes": min_nodes}})


@pytest.fixture(scope="module")
def cluster():
    prebuild(spec(1))  # the model every node's ranks load, built once in the shared cache
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(**NODE) for _ in range(2)]
    ray.init(address=c.address, namespace="brorl-tests", log_to_driver=False)
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


@pytest.fixture()
def ray_env(cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("BRORL_RAY_GPU_RESOURCE", GPU)
    monkeypatch.setenv("BRORL_RAY_MEMORY_PER_RANK_GB", str(RANK_GB))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield cluster
    _assert_nothing_left(tmp_path)


def _agents_alive() -> list[int]:
    """Processes of our node agents (Ray names an actor's worker process after its class)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"ray::NodeAgent"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _ranks_alive(under: Path) -> list[int]:
    """Rank processes of the test's jobs, on any simulated node (all are this machine)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
            if b"trainer.distributed.rank_main\0" + str(under).encode() in cmdline:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _assert_nothing_left(under: Path, timeout: float = 30.0) -> None:
    """No rank, no agent, no placement group of ours, every resource free again (a killed actor's
    process and a removed group take a moment to go)."""
    deadline = time.monotonic() + timeout
    while True:
        groups = [v for v in ray.util.placement_group_table().values()
                  if v["name"].startswith(ray_launcher.GROUP_PREFIX) and v["state"] != "REMOVED"]
        free = all(ray.available_resources().get(r, 0) == ray.cluster_resources().get(r, 0) for r in (GPU, "memory"))
        left = (_ranks_alive(under), _agents_alive(), groups, free)
        if left[:3] == ([], [], []) and free:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left running: ranks {left[0]}, agents {left[1]}, groups {left[2]}, "
                                 f"resources free: {free}")
        time.sleep(0.2)


def _train(job: JobSpec, out: Path, should_stop=lambda sink: False, resume=None):
    sink = ListSink()
    result = launch.train_on_ranks(job, sink, lambda: should_stop(sink), resume, out_dir=out,
                                   launcher=ray_launcher.RayLauncher())
    return sink, result


def _last_step(sink: ListSink) -> int:
    return max((r["step"] for r in sink.steps), default=-1)


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def test_two_nodes_train_like_two_local_ranks(ray_env, tmp_path):
    import torch

    from trainer import train

    local_sink = ListSink()
    local = train(spec(1, gpus=2, steps=1), local_sink, lambda: False, out_dir=tmp_path / "local")
    sink, result = _train(spec(2, steps=1), tmp_path / "ray")
    assert (result.steps_completed, result.stopped) == (1, False)
    assert [r["step"] for r in sink.steps] == [0, 1]  # rank 0's figures, relayed once
    ray_weights, local_weights = _weights(result.last_checkpoint), _weights(local.last_checkpoint)
    assert ray_weights.keys() == local_weights.keys() and ray_weights
    for name, value in local_weights.items():
        torch.testing.assert_close(ray_weights[name], value, rtol=0, atol=0, msg=name)
    assert sink.steps[1]["loss"] == local_sink.steps[1]["loss"]
    control = ControlFolder.of(tmp_path / "ray")
    assert {"node-0.seen", "node-1.seen", "ray-node-0.log", "ray-node-1.log"} <= {p.name for p in control.path.iterdir()}
    launched = [d for t, d in sink.events if t == "progress" and d.get("phase") == "launch"]
    assert launched[-1]["finished"] and launched[-1]["message"] == "2 ranks started on 2 nodes"


def test_a_job_too_big_waits_holding_nothing_while_a_small_one_runs(ray_env, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_launcher, "WAIT_EVENT_S", 0.0)  # an event at every poll
    monkeypatch.setattr(ray_launcher, "FIRST_WAIT_EVENT_S", 0.0)
    events: list[tuple[str, dict]] = []
    waiting = []
    for name in ("big", "bigger"):  # 3 nodes and 4 nodes, on a cluster of 2
        control = ControlFolder.fresh(tmp_path / name)
        ranks = ray_launcher.RayLauncher().start(control, spec(3 if name == "big" else 4),
                                                 lambda t, d: events.append((t, d)))
        assert ranks.poll() is None
        waiting.append((control, ranks))
    said = [d for t, d in events if t == "progress" and d["phase"] == "launch"]
    assert [d["queue_position"] for d in said] == [1, 2] and all(d["total"] in (3, 4) for d in said)
    assert said[0]["message"].startswith(f"waiting for 3 nodes with 1 {GPU}, 1.0 CPUs and 1 GiB of memory "
                                         "each, all at once")
    assert ray.available_resources().get(GPU) == 2  # a pending group holds nothing
    assert ray.available_resources().get("memory") == ray.cluster_resources().get("memory")

    sink, result = _train(spec(1, steps=1), tmp_path / "small")  # one node: placed and run meanwhile
    assert (result.steps_completed, result.stopped) == (1, False)
    assert all(ranks.poll() is None for _, ranks in waiting)  # still waiting, still whole or nothing

    for control, ranks in waiting:  # a cancel ends the wait: the group goes, nothing ran
        control.request_stop()
        assert ranks.poll() == 0
        assert not list(control.path.glob("node-*.seen"))
    assert "stopped while waiting for placement" in waiting[0][0].text("ray.log")


def test_a_node_without_the_memory_a_rank_reserves_is_not_used(ray_env, tmp_path, monkeypatch):
    """The bundle's memory counts in placement: 3 GiB per rank fits no node of 2 GiB, so even a
    1-node job waits (holding nothing) instead of landing on a node short of RAM."""
    monkeypatch.setenv("BRORL_RAY_MEMORY_PER_RANK_GB", "3")
    monkeypatch.setattr(ray_launcher, "FIRST_WAIT_EVENT_S", 0.0)
    events: list[tuple[str, dict]] = []
    control = ControlFolder.fresh(tmp_path / "big-memory")
    ranks = ray_launcher.RayLauncher().start(control, spec(1), lambda t, d: events.append((t, d)))
    assert ranks.bundle["memory"] == 3 * 2**30
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert ranks.poll() is None
        time.sleep(0.5)
    said = [d for t, d in events if t == "progress" and d["phase"] == "launch"]
    assert said and "3 GiB of memory each" in said[0]["message"]
    assert ray.available_resources().get("memory") == ray.cluster_resources().get("memory")
    control.request_stop()
    assert ranks.poll() == 0 and not list(control.path.glob("node-*.seen"))

def test_cancel_mid_step_stops_every_rank_at_a_step_boundary(ray_env, tmp_path):
    sink, result = _train(spec(2), tmp_path, should_stop=lambda s: _last_step(s) >= 1)
    assert result.stopped and 1 <= result.steps_completed < 4
    assert [r["step"] for r in sink.steps] == list(range(result.steps_completed + 1))
    assert result.last_checkpoint.name.endswith(str(result.steps_completed))  # saved at the boundary


def test_a_fenced_attempt_kills_every_node_s_ranks_at_once(ray_env, tmp_path):
    def fenced(sink):
        if _last_step(sink) >= 1:
            raise Fenced("job", 1)
        return False

    with pytest.raises(Fenced):
        _train(spec(2), tmp_path, should_stop=fenced)
    # (the fixture then checks that no rank, agent or group is left)


def _rank_pid(under: Path, rank: int) -> int:
    """The process of rank `rank` of the test's job (RANK in its environment), on whichever node."""
    for pid in _ranks_alive(under):
        try:
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no rank {rank} running under {under}")


def test_a_rank_killed_mid_job_is_a_machine_fault_and_nothing_is_left(ray_env, tmp_path):
    """One rank's process SIGKILLed (the OOM killer, say) while its node stays: the attempt fails
    as RankDied naming that rank and the signal, retryable, and the other node's rank is killed
    too (the fixture checks no rank, agent or group is left)."""
    import os
    import signal

    sink = ListSink()
    killed: list[int] = []

    def kill_rank_1() -> bool:
        if not killed and sink.steps:  # mid-job: after rank 0's first figures
            killed.append(_rank_pid(tmp_path, 1))
            os.kill(killed[0], signal.SIGKILL)
        return False

    with pytest.raises(launch.RankDied) as died:
        launch.train_on_ranks(spec(2, steps=30), sink, kill_rank_1, out_dir=tmp_path / "job",
                              launcher=ray_launcher.RayLauncher())
    assert killed and died.value.retryable
    assert (died.value.rank, died.value.exitcode) == (1, -9), str(died.value)
    exits = ControlFolder.of(tmp_path / "job").text(ray_launcher.EXITS)
    assert '"1": -9' in exits and '"lost_nodes": []' in exits, exits
    assert _last_step(sink) < 30

def test_a_lost_node_is_a_machine_fault_and_the_retry_resumes_on_fewer_nodes(ray_env, tmp_path, monkeypatch):
    cluster, nodes = ray_env
    sink = ListSink()
    lost = []

    def lose_a_node() -> bool:
        if not lost and sink.checkpoints:  # after the first checkpoint: a Ray node goes away
            cluster.remove_node(nodes[1], allow_graceful=False)
            lost.append(time.monotonic())
        return False

    try:
        with pytest.raises(launch.RankDied) as died:
            launch.train_on_ranks(spec(2, steps=30), sink, lose_a_node, out_dir=tmp_path / "a",
                                  launcher=ray_launcher.RayLauncher())
        # The rank on the removed node is blamed by name (Ray picks which bundle lands where).
        control = ControlFolder.of(tmp_path / "a")
        gone = next(i for i in range(2) if nodes[1].node_id[:12] in control.text(f"node-{i}.seen"))
        assert died.value.retryable and died.value.rank == gone
        assert time.monotonic() - lost[0] < 60  # noticed quickly, not at a collective's timeout
        ckpt_step, ckpt = sink.checkpoints[-1][:2]
        assert f'"lost_nodes": [{gone}]' in control.text(ray_launcher.EXITS)

        # The retry comes once Ray has seen the node die (before, it may still place a bundle there).
        deadline = time.monotonic() + 120
        while any(n["NodeID"] == nodes[1].node_id and n["Alive"] for n in ray.nodes()):
            assert time.monotonic() < deadline, "Ray never saw the removed node die"
            time.sleep(0.5)
        # The retry asks for the same 2 nodes; with min_nodes 1 it runs on the one node left (a
        # smaller world) once BRORL_RAY_SHRINK_AFTER_S has passed, says so, and resumes the checkpoint.
        monkeypatch.setenv("BRORL_RAY_SHRINK_AFTER_S", "1")
        again, result = _train(spec(2, steps=ckpt_step + 1, min_nodes=1), tmp_path / "b", resume=ckpt)
        assert [r["step"] for r in again.steps] == [ckpt_step + 1] and not result.stopped
        warned = [data["message"] for kind, data in again.events if kind == "warning"]
        assert warned and warned[0].startswith("running on 1 nodes instead of 2"), again.events
    finally:
        nodes[1] = cluster.add_node(**NODE)  # the next test's cluster is whole
        cluster.wait_for_nodes()
