"""The CLI's one-line queue place: which queue a job waits on, in words."""
from cli.estimates import progress_line

PLACE = {"position": 2, "gpus": 1, "yours_ahead": ["job_a"], "others_ahead": 0, "running": 1}


def test_a_one_node_job_waits_on_its_gpu_count_s_queue():
    line = progress_line({"queue": {**PLACE, "gpus": 2, "multi_node": False}})
    assert line == "queued: position 2 on the 2-GPU queue (1 of yours and 0 other(s) ahead, 1 running)"


def test_a_multi_node_job_waits_on_the_multi_node_queue():
    line = progress_line({"queue": {**PLACE, "multi_node": True}})
    assert line.startswith("queued: position 2 on the multi-node queue (")
