"""A 2-node job through the whole service: `brorl up` whose worker sends it to a Ray cluster of
two simulated nodes on this machine (`ray.cluster_utils.Cluster`, one `brorl_gpu` each, gloo).
The API accepts `nodes: 2` because the deployment names the cluster (BRORL_RAY_ADDRESS,
BRORL_RAY_MAX_NODES); the job succeeds with every metric step once, says in its events that
its ranks started on 2 nodes, and leaves every resource of the cluster free."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from cli.client import BrorlClient  # noqa: E402
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task  # noqa: E402
from tests.support.upstack import Stack, running_stack  # noqa: E402
from trainer.spec import JobSpec  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

GPU = "brorl_gpu"


def spec(steps: int) -> dict:
    return {"name": "two-nodes", "seed": SHARED_SEED, "task": shared_task(),
            "rollout": {"engine": "hf", "max_new_tokens": 24,
                        "schedule": [{"n": 4, "prompts_per_step": 2, "steps": steps}]},
            "optim": {"lr": 1e-4}, "algo": {"mini_batches": 1, "micro_batch_tokens": 256},
            "eval": {"every": 100, "samples_per_prompt": 2, "k": [1]},
            "checkpoint": {"every": 1, "keep_last": 2}, "resources": {"nodes": 2, "gpus_per_node": 1}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    prebuild(JobSpec.model_validate(spec(2)))  # every node's ranks find builtin:tiny in BRORL_CACHE_DIR
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, resources={GPU: 1})
    ray.init(address=c.address, log_to_driver=False)  # this test's own view of the cluster
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tmp_path_factory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("ray"), {
            "BRORL_RAY_ADDRESS": cluster.address, "BRORL_RAY_MAX_NODES": "2", "BRORL_RAY_GPU_RESOURCE": GPU,
            "BRORL_HEARTBEAT_SECONDS": "1", "BRORL_TRAINER_ENTRYPOINT": None}) as stack:
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
    deadline = time.monotonic() + 30  # the agents' actors and the group are released
    while ray.available_resources().get(GPU) != 2:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)
