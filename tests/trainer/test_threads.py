"""The trainer's torch thread count: usable CPUs (affinity, cgroup quota) or the override."""
import os

import pytest
import torch

from trainer.threads import cgroup_cpus, configure_threads, threads_setting, usable_cpus


def test_cgroup_v2_quota_rounds_up(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")
    assert cgroup_cpus(f, (tmp_path / "a", tmp_path / "b")) == 2
    f.write_text("max 100000\n")
    assert cgroup_cpus(f, (tmp_path / "a", tmp_path / "b")) is None


def test_cgroup_v1_quota(tmp_path):
    q, p = tmp_path / "q", tmp_path / "p"
    q.write_text("50000")
    p.write_text("100000")
    assert cgroup_cpus(tmp_path / "none", (q, p)) == 1
    q.write_text("-1")
    assert cgroup_cpus(tmp_path / "none", (q, p)) is None


def test_usable_cpus_is_the_smaller_of_affinity_and_quota():
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(cgroup=1) == 1
    assert usable_cpus(cgroup=affinity + 8) == affinity


def test_setting_overrides_and_bad_values_fail_clearly():
    before = torch.get_num_threads()
    try:
        assert configure_threads({"BRORL_TORCH_THREADS": "1"}) == 1
        assert torch.get_num_threads() == 1
        assert threads_setting({"BRORL_TORCH_THREADS": ""}) is None
        for bad in ("0", "two", "-3"):
            with pytest.raises(ValueError, match="BRORL_TORCH_THREADS"):
                threads_setting({"BRORL_TORCH_THREADS": bad})
    finally:
        torch.set_num_threads(before)


def test_ranks_on_one_node_share_its_cpus():
    """torchrun's ranks are processes of their own: each gets its share, never fewer than 1."""
    before = torch.get_num_threads()
    usable = usable_cpus()
    try:
        assert configure_threads({"LOCAL_WORLD_SIZE": "1"}) == usable
        assert configure_threads({"LOCAL_WORLD_SIZE": "2"}) == max(1, usable // 2)
        assert configure_threads({"LOCAL_WORLD_SIZE": str(usable * 4)}) == 1
        assert torch.get_num_threads() == 1
        assert configure_threads({"LOCAL_WORLD_SIZE": "2", "BRORL_TORCH_THREADS": "3"}) == 3  # per process
    finally:
        torch.set_num_threads(before)
