"""The Ray launcher's judgments that need no cluster: what one node's bundle reserves, which rank
a death is blamed on, and the check that every node sees the job's control folder."""
from __future__ import annotations

import json

from tests.support.services import require_module

require_module("ray")  # skipped here without ray, a failure in CI

from trainer.distributed.protocol import ControlFolder  # noqa: E402
from trainer.distributed.ray_launcher import EXITS, RayLauncher, bundle, storage_problem  # noqa: E402
from trainer.settings import TrainerSettings  # noqa: E402


def _exits(tmp_path, exits: dict, lost_nodes=(), lost_ranks=()) -> ControlFolder:
    control = ControlFolder.fresh(tmp_path)
    control.file(EXITS).write_text(json.dumps({"exits": exits, "lost_nodes": list(lost_nodes),
                                               "lost_ranks": list(lost_ranks)}))
    return control


def test_a_lost_node_s_rank_is_blamed_before_any_exit(tmp_path):
    control = _exits(tmp_path, {"0": 1}, lost_nodes=[1], lost_ranks=[2, 3])
    assert RayLauncher().dead_rank(control, raised={0}) == (2, None)


def test_a_killed_rank_is_blamed_before_one_that_raised_or_exited_with_a_code(tmp_path):
    control = _exits(tmp_path, {"0": 1, "1": 3, "2": -9})
    assert RayLauncher().dead_rank(control, raised={0}) == (2, -9)
    assert RayLauncher().dead_rank(_exits(tmp_path, {"0": 1, "1": 3}), raised={0}) == (1, 3)
    assert RayLauncher().dead_rank(_exits(tmp_path, {"0": 1}), raised={0}) == (None, None)
    assert RayLauncher().dead_rank(ControlFolder.fresh(tmp_path), raised=set()) == (None, None)


def test_a_node_that_does_not_see_the_control_folder_is_named(tmp_path):
    control = ControlFolder.fresh(tmp_path)
    problem = storage_problem(control.path, 1, "10.0.0.7")
    assert "node 1 (10.0.0.7) does not see the job's control folder" in problem and "BRORL_DATA_DIR" in problem
    (control.path / "job.json").write_text("{}")
    assert storage_problem(control.path, 1, "10.0.0.7") is None
    assert control.text("node-1.seen") == "10.0.0.7"  # the mark the worker looks for


def test_a_bundle_reserves_each_node_s_gpus_cpus_and_memory(monkeypatch):
    monkeypatch.delenv("BRORL_RAY_MEMORY_PER_RANK_GB", raising=False)
    monkeypatch.delenv("BRORL_RAY_CPUS_PER_RANK", raising=False)
    monkeypatch.setenv("BRORL_RAY_GPU_RESOURCE", "GPU")
    assert bundle(TrainerSettings(), 8) == {"CPU": 8.0, "GPU": 8, "memory": 8 * 8 * 2**30}  # defaults
    monkeypatch.setenv("BRORL_RAY_MEMORY_PER_RANK_GB", "1.5")
    monkeypatch.setenv("BRORL_RAY_CPUS_PER_RANK", "2")
    monkeypatch.setenv("BRORL_RAY_GPU_RESOURCE", "brorl_gpu")
    shape = bundle(TrainerSettings(), 2)
    assert shape == {"CPU": 4.0, "brorl_gpu": 2, "memory": 3 * 2**30} and isinstance(shape["memory"], int)
    monkeypatch.setenv("BRORL_RAY_MEMORY_PER_RANK_GB", "0")  # 0: no memory reserved at all
    assert bundle(TrainerSettings(), 2) == {"CPU": 4.0, "brorl_gpu": 2}
