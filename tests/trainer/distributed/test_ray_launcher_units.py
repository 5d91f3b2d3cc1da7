"""The Ray launcher's judgments that need no cluster: which rank a death is blamed on, and the
check that every node sees the job's control folder."""
from __future__ import annotations

import json

from tests.support.services import require_module

require_module("ray")  # skipped here without ray, a failure in CI

from trainer.distributed.protocol import ControlFolder  # noqa: E402
from trainer.distributed.ray_launcher import EXITS, RayLauncher, storage_problem  # noqa: E402


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
