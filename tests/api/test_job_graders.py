"""Jobs with `task.grader`: validated with the grader library (errors name `task.grader.<path>`)
and checked against the uploaded dataset's rows at submission."""

from __future__ import annotations

import json

from tests.api.helpers import assert_error, make_spec

STRING_CHECK = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
                "reference": "{{ item.answer }}", "operation": "eq"}
CODE = {"type": "code", "name": "tests"}


def _upload(client, auth, rows: list[dict]) -> str:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    resp = client.post("/v1/datasets", headers=auth, files={"file": ("d.jsonl", data)})
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def _submit(client, auth, task: dict):
    return client.post("/v1/jobs", json=make_spec(task=task), headers=auth)


def test_a_grader_job_is_stored_with_its_grader_unchanged(client, auth):
    ds = _upload(client, auth, [{"prompt": f"q{i}", "answer": str(i)} for i in range(4)])
    resp = _submit(client, auth, {"dataset": {"id": ds}, "grader": STRING_CHECK})
    assert resp.status_code == 201, resp.text
    assert resp.json()["spec"]["task"]["grader"] == STRING_CHECK


def test_reasoning_gym_tasks_take_a_grader_too(client, auth):
    task = {"reasoning_gym": {"name": "chain_sum", "train_size": 100, "eval_size": 10},
            "grader": {"type": "verifier", "name": "reasoning_gym", "task": "chain_sum"}}
    assert _submit(client, auth, task).status_code == 201


def test_a_bad_grader_names_its_field(client, auth):
    bad = {"type": "multi", "name": "m", "calculate_output": "a",
           "graders": {"a": {**STRING_CHECK, "operation": "contains"}}}
    task = {"reasoning_gym": {"name": "chain_sum"}, "grader": bad}
    assert_error(_submit(client, auth, task), 422, field="task.grader.graders.a.operation")
    python = {"type": "python", "name": "p", "source": "def grade(s, i):\n  return ("}
    err = assert_error(_submit(client, auth, {"reasoning_gym": {"name": "chain_sum"},
                                              "grader": python}), 422, field="task.grader.source")
    assert "line" in err["message"]


def test_grader_and_an_explicit_verifier_is_422(client, auth):
    ds = _upload(client, auth, [{"prompt": f"q{i}", "answer": str(i)} for i in range(4)])
    task = {"dataset": {"id": ds, "verifier": "numeric"}, "grader": STRING_CHECK}
    assert_error(_submit(client, auth, task), 422, field="task.dataset.verifier")


def test_a_field_the_rows_lack_is_422_naming_it(client, auth):
    ds = _upload(client, auth, [{"prompt": "q0", "answer": "1", "tests": ["assert True"]},
                                {"prompt": "q1", "answer": "2"}])
    err = assert_error(_submit(client, auth, {"dataset": {"id": ds}, "grader": CODE}), 422,
                       field="task.grader")
    assert "'tests'" in err["message"] and "row 1" in err["message"]
    multi = {"type": "multi", "name": "m", "calculate_output": "a + b", "graders": {
        "a": STRING_CHECK,
        "b": {**STRING_CHECK, "reference": "{{ item.meta.unit }}"}}}
    err = assert_error(_submit(client, auth, {"dataset": {"id": ds}, "grader": multi}), 422,
                       field="task.grader")
    assert "'meta'" in err["message"]


def test_rows_without_answer_serve_a_grader_but_not_a_verifier(client, auth):
    ds = _upload(client, auth, [{"prompt": f"q{i}", "tests": ["assert True"]} for i in range(3)])
    assert _submit(client, auth, {"dataset": {"id": ds}, "grader": CODE}).status_code == 201
    err = assert_error(_submit(client, auth, {"dataset": {"id": ds}}), 422,
                       field="task.dataset.id")
    assert "answer" in err["message"]
    err = assert_error(_submit(client, auth, {"dataset": {"id": ds}, "grader": STRING_CHECK}),
                       422, field="task.grader")
    assert "item.answer" in err["message"]


def test_a_metric_this_server_lacks_is_422(client, auth):
    cosine = {"type": "text_similarity", "name": "c", "input": "{{ sample.output_text }}",
              "reference": "x", "evaluation_metric": "cosine", "pass_threshold": 0.5}
    assert_error(_submit(client, auth, {"reasoning_gym": {"name": "chain_sum"},
                                        "grader": cosine}), 422,
                 field="task.grader.evaluation_metric")
