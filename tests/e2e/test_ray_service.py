"""2-node jobs through the whole service: `brorl up` whose worker sends them to a Ray cluster of
two simulated nodes on this machine (`ray.cluster_utils.Cluster`, one `brorl_gpu` each, gloo).
The API accepts `nodes: 2` because the deployment names the cluster (BRORL_RAY_ADDRESS,
BRORL_RAY_MAX_NODES). A job succeeds with every metric step once and says in its events that
its ranks started on 2 nodes; a cancel mid-job ends it; a node lost mid-job fails the attempt
as a machine fault and the retry, on the one node left (`resources.min_nodes: 1`), resumes the
checkpoint and succeeds; a 3-node job, too big for the cluster, waits on `brorl up`'s Ray driver
worker (queue `ray`) while a 1-node job submitted after it runs on its GPU worker, and a cancel
ends the wait. After each, no rank is left and every resource of the cluster is free."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import require_module

ray = require_module("ray")  # skipped here without ray, a failure in CI

from ray.cluster_utils import Cluster  # noqa: E402

from cli.client import BrorlClient  # noqa: E402
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task  # noqa: E402
from tests.support.upstack import Stack, running_stack  # noqa: E402
from trainer.spec import JobSpec  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

GPU = "brorl_gpu"
NODE = {"num_cpus": 1, "resources": {GPU: 1}, "memory": 2 * 2**30}  # a bundle reserves 1 GiB (below)


def spec(steps: int, min_nodes: int | None = None) -> dict:
    return {"name": "two-nodes", "seed": SHARED_SEED, "task": shared_task(),
            "rollout": {"engine": "hf", "max_new_tokens": 24,
                        "schedule": [{"n": 4, "prompts_per_step": 2, "steps": steps}]},
            "optim": {"lr": 1e-4}, "algo": {"mini_batches": 1, "micro_batch_tokens": 256},
            "eval": {"every": 100, "samples_per_prompt": 2, "k": [1]},
            "checkpoint": {"every": 1, "keep_last": 2}, "resources": {"nodes": 2, "gpus_per_node": 1, "min_nodes": min_nodes}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    prebuild(JobSpec.model_validate(spec(2)))  # every node's ranks find builtin:tiny in BRORL_CACHE_DIR
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    c.brorl_nodes = [c.add_node(**NODE) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)  # this test's own view of the cluster
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tmp_path_factory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("ray"), {
            # 3 nodes accepted on a cluster of 2: a job that cannot be placed (the wait test).
            "BRORL_RAY_ADDRESS": cluster.address, "BRORL_RAY_MAX_NODES": "3", "BRORL_RAY_GPU_RESOURCE": GPU,
            "BRORL_RAY_MEMORY_PER_RANK_GB": "1",
            "BRORL_HEARTBEAT_SECONDS": "1", "BRORL_RAY_SHRINK_AFTER_S": "1",
            "BRORL_TRAINER_ENTRYPOINT": None}) as stack:
        yield stack


def test_a_two_node_job_trains_through_the_service(stack: Stack):
    client = BrorlClient(stack.url, stack.key, timeout=30)
    job = client.submit(spec(2))
    try:
        done = client.wait(job["id"], poll=1, timeout=600)
    except TimeoutError:
        pytest.fail(f"job {job['id']} did not finish\n{stack.output()[-6000:]}")
    assert done["status"] == "succeeded", (done.get("error"), stack.output()[-6000:])
    assert [r["step"] for r in client.metrics(job["id"])["data"]] == [0, 1, 2]  # rank 0's rows, once
    messages = [e["data"].get("message") for e in client.events(job["id"])["data"] if e["type"] == "progress"]
    assert "2 ranks started on 2 nodes" in messages
    _assert_all_free(stack)


def test_a_cancel_mid_job_stops_every_node_s_ranks(stack: Stack):
    client = BrorlClient(stack.url, stack.key, timeout=30)
    job = client.submit(spec(40))
    _wait_for(lambda: client.metrics(job["id"])["data"], "a first step", stack)
    client.cancel(job["id"])
    done = client.wait(job["id"], poll=1, timeout=300)
    assert done["status"] == "cancelled", (done.get("error"), stack.output()[-6000:])
    assert len(client.metrics(job["id"])["data"]) < 40
    _assert_all_free(stack)


def test_a_lost_node_fails_the_attempt_and_the_retry_resumes_on_the_node_left(cluster: Cluster, stack: Stack):
    client = BrorlClient(stack.url, stack.key, timeout=30)
    job = client.submit(spec(8, min_nodes=1))
    try:
        _wait_for(lambda: client.list_checkpoints(job["id"])["data"], "a first checkpoint", stack)
        cluster.remove_node(cluster.brorl_nodes[1], allow_graceful=False)
        done = client.wait(job["id"], poll=1, timeout=600)
        assert done["status"] == "succeeded", (done.get("error"), stack.output()[-6000:])
        assert done["attempt"] == 2
        assert [r["step"] for r in client.metrics(job["id"])["data"]] == list(range(9))  # each step once
        events = client.events(job["id"])["data"]
        assert any(e["type"] == "retried" for e in events)
        warned = [e["data"].get("message", "") for e in events if e["type"] == "warning"]
        assert any(m.startswith("running on 1 nodes instead of 2") for m in warned), events
        _assert_all_free(stack)
    finally:
        cluster.brorl_nodes[1] = cluster.add_node(**NODE)
        cluster.wait_for_nodes()


def test_a_job_too_big_to_place_waits_while_a_one_node_job_runs_then_is_cancelled(stack: Stack):
    client = BrorlClient(stack.url, stack.key, timeout=30)
    big = client.submit({**spec(2), "name": "too-big", "resources": {"nodes": 3, "gpus_per_node": 1}})

    def waiting() -> list[dict]:
        return [e["data"] for e in client.events(big["id"])["data"]
                if e["type"] == "progress" and e["data"].get("phase") == "launch"]

    try:
        _wait_for(waiting, "launch wait event of the 3-node job", stack)
        said = waiting()[0]
        assert said["queue_position"] == 1 and not said["finished"], said
        assert said["message"].startswith("waiting for 3 nodes"), said
        # Submitted after it: a 1-node job runs on brorl up's own worker, which the waiting job
        # does not hold (it sits on the Ray driver worker's queue).
        small = client.submit({**spec(1), "name": "one-node", "resources": {"nodes": 1, "gpus_per_node": 1}})
        done = client.wait(small["id"], poll=1, timeout=600)
        assert done["status"] == "succeeded", (done.get("error"), stack.output()[-6000:])
        assert client.get_job(big["id"])["status"] == "running"  # still waiting, its nodes never reserved
        assert ray.available_resources().get(GPU) == ray.cluster_resources().get(GPU)
    finally:
        client.cancel(big["id"])
    done = client.wait(big["id"], poll=1, timeout=300)
    assert done["status"] == "cancelled", (done.get("error"), stack.output()[-6000:])
    assert not client.metrics(big["id"])["data"]  # no step ran
    _assert_all_free(stack)


def _wait_for(ready, what: str, stack: Stack, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s\n{stack.output()[-6000:]}"
        time.sleep(0.5)


def _assert_all_free(stack: Stack) -> None:
    """The agents' actors and the placement groups are released (none pending either) and no rank
    of the stack's jobs is left (a removed node's resources no longer count)."""
    deadline = time.monotonic() + 30
    while True:
        free = all(ray.available_resources().get(r) == ray.cluster_resources().get(r) for r in (GPU, "memory"))
        ranks = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_rank_of(p, stack)]
        groups = [g["name"] for g in ray.util.placement_group_table().values()
                  if g["name"].startswith("brorl-") and g["state"] != "REMOVED"]
        if free and not ranks and not groups:
            return
        assert time.monotonic() < deadline, (ray.available_resources(), ranks, groups)
        time.sleep(0.2)


def _is_rank_of(proc: Path, stack: Stack) -> bool:
    try:
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    return b"trainer.distributed.rank_main\0" + str(stack.data_dir).encode() in cmdline
