"""Reasoning-gym task configs from a tenant: bounded, built in a child process, never a 500.

Each case below was accepted (201) or crashed the API (500) before the bounds and the
submission check existed; a worker that claimed the first one stopped for every tenant.
"""

from __future__ import annotations

import pytest

from tests.api.helpers import assert_error, make_spec

CONFIG = "task.reasoning_gym.config"


def _task(name: str, config: dict, **extra) -> dict:
    return make_spec(task={"reasoning_gym": {"name": name, "config": config, "train_size": 100,
                                             "eval_size": 10, **extra}})


REFUSED = {
    "2**63 digits": (("chain_sum", {"min_terms": 2, "max_terms": 2,
                                    "max_digits": 9223372036854775808}), f"{CONFIG}.max_digits",
                     "at most 100"),
    "a million terms": (("chain_sum", {"max_terms": 1_000_000}), f"{CONFIG}.max_terms",
                        "at most 100"),
    "negative huge": (("chain_sum", {"min_digits": -10**30}), f"{CONFIG}.min_digits", "at most"),
    "exponential disks": (("tower_of_hanoi", {"max_disks": 40}), f"{CONFIG}.max_disks",
                          "at most 12"),
    "AttributeError inside reasoning-gym": (("calendar_arithmetic", {"tasks": [1]}), CONFIG,
                                            "invalid for calendar_arithmetic"),
    "composite of strings": (("composite", {"datasets": ["x"]}), CONFIG, "invalid for composite"),
    "a file outside the package": (("spell_backward", {"data_file": "/etc/passwd"}),
                                   f"{CONFIG}.data_file", "shipped with reasoning-gym"),
    "a relative escape": (("spell_backward", {"data_file": "../../../../etc/passwd"}),
                          f"{CONFIG}.data_file", "shipped with reasoning-gym"),
    "size set in the config": (("chain_sum", {"size": 5}), f"{CONFIG}.size", "train_size"),
    "seed set in the config": (("chain_sum", {"seed": 5}), f"{CONFIG}.seed", "job's seed"),
    "unknown key": (("chain_sum", {"colour": 1}), CONFIG, "colour"),
    "long list": (("basic_arithmetic", {"operators": ["+"] * 100}), f"{CONFIG}.operators",
                  "at most 40"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_out_of_bounds_config_is_422_naming_the_field(client, auth, enqueued, case):
    (name, config), field, text = REFUSED[case]
    err = assert_error(client.post("/v1/jobs", json=_task(name, config), headers=auth), 422,
                       "validation_error", field=field)
    assert text in err["message"], err
    assert enqueued == []


def test_config_within_bounds_but_too_slow_is_refused_by_the_submission_check(app, client, auth, enqueued):
    # Inside the bounds (at most 90), but one 12x12 futoshiki takes far longer than the check's
    # limit: the child is killed and the answer is a 422, not a hang.
    app.state.task_check.timeout_s = 2
    body = _task("futoshiki", {"min_board_size": 12, "max_board_size": 12})
    err = assert_error(client.post("/v1/jobs", json=body, headers=auth), 422,
                       "validation_error", field=CONFIG)
    assert "took longer than" in err["message"], err
    assert enqueued == []


def test_config_within_bounds_is_accepted(client, auth, enqueued):
    body = _task("chain_sum", {"min_terms": 2, "max_terms": 50, "max_digits": 40})
    resp = client.post("/v1/jobs", json=body, headers=auth)
    assert resp.status_code == 201, resp.text
    assert enqueued == [resp.json()["id"]]


def test_the_check_reads_its_variables_and_their_former_names(monkeypatch):
    """The submission check's limits were once BRORL_*TASK_PROBE*; both names are read, the
    current one first, so a deployment's old environment keeps its limits."""
    from store.settings import Settings

    monkeypatch.setenv("BRORL_TASK_PROBE_TIMEOUT_S", "3")
    monkeypatch.setenv("BRORL_MAX_CONCURRENT_TASK_PROBES", "5")
    assert (Settings().task_check_timeout_s, Settings().max_concurrent_task_checks) == (3, 5)
    monkeypatch.setenv("BRORL_TASK_CHECK_TIMEOUT_S", "4")
    assert Settings().task_check_timeout_s == 4
    assert Settings(task_check_memory_mb=512).task_check_memory_mb == 512
