"""Bad job specs are 422s in the one error shape, naming the field; nothing is queued."""

from __future__ import annotations

import pytest

from tests.api.helpers import assert_error, make_spec

STAGE = {"n": 4, "prompts_per_step": 2, "steps": 3}

CASES = {
    "unknown top-level field": (make_spec(colour="blue"), "colour", "Extra inputs"),
    "unknown nested field": (make_spec(optim={"lr": 1e-6, "momentum": 0.9}), "optim.momentum",
                             "Extra inputs"),
    "n below 2": (make_spec(rollout={"schedule": [{**STAGE, "n": 1}]}), "rollout.schedule.0.n",
                  "greater than or equal to 2"),
    "stage over 1,048,576 samples": (
        make_spec(rollout={"schedule": [STAGE, {"n": 4096, "prompts_per_step": 512, "steps": 1}]}),
        "rollout.schedule.1", "1048576"),
    "negative lr": (make_spec(optim={"lr": -1}), "optim.lr", "greater than 0"),
    "seed not an int": (make_spec(seed="abc"), "seed", "valid integer"),
    "schedule not a list": (make_spec(rollout={"schedule": "big"}), "rollout.schedule",
                            "valid list"),
    "cross-field rule": (make_spec(algo={"mini_batches": 9}), "algo.mini_batches",
                         "smallest stage"),
    "missing name": ({k: v for k, v in make_spec().items() if k != "name"}, "name", "required"),
    "no task": (make_spec(task={}), "task", "exactly one"),
    "builtin:tiny cannot finish its answer": (
        make_spec(rollout={"schedule": [STAGE], "max_new_tokens": 16}), "rollout.max_new_tokens",
        "too short for builtin:tiny"),
    "broaden factor below 2": (make_spec(rollout={"schedule": [STAGE], "broaden": {"factor": 1}}),
                               "rollout.broaden.factor", "greater than or equal to 2"),
    "broaden patience not an int": (
        make_spec(rollout={"schedule": [STAGE], "broaden": {"patience": 1.5}}),
        "rollout.broaden.patience", "valid integer"),
    "broaden min_delta above 1": (
        make_spec(rollout={"schedule": [STAGE], "broaden": {"min_delta": 2}}),
        "rollout.broaden.min_delta", "less than or equal to 1"),
    "broaden with two stages": (make_spec(rollout={"schedule": [STAGE, STAGE], "broaden": {}}),
                                "rollout.broaden", "exactly one stage"),
    "broaden max_n not above n": (
        make_spec(rollout={"schedule": [STAGE], "broaden": {"max_n": 4}}),
        "rollout.broaden.max_n", "no room above"),
    "k1 as a KL loss": (make_spec(algo={"kl_estimator": "k1"}), "algo.kl_estimator",
                        "averages to zero"),
    "LoRA rank 0": (make_spec(model={"lora": {"rank": 0}}), "model.lora.rank",
                    "greater than or equal to 1"),
    "LoRA module builtin:tiny lacks": (make_spec(model={"lora": {"target_modules": ["q_proj", "c_attn"]}}),
                                       "model.lora.target_modules", "['c_attn'] are not linear layers"),
    "LoRA rank vLLM cannot serve": (make_spec(model={"lora": {"rank": 1024}}, rollout={"schedule": [STAGE], "engine": "vllm"}),
                                    "model.lora.rank", "exceeds vLLM's largest"),
    "LoRA with an offloaded optimizer": (make_spec(model={"lora": {}}, optim={"optimizer_state": "cpu_offload"}),
                                         "model.lora", "use fp32"),
    "broaden metric not evaluated": (
        make_spec(rollout={"schedule": [STAGE], "broaden": {"metric": "eval/pass@8"}}),
        "rollout.broaden.metric", "add 8 to eval.k"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_spec_is_422_naming_the_field(client, auth, enqueued, case):
    body, field, text = CASES[case]
    err = assert_error(client.post("/v1/jobs", json=body, headers=auth), 422,
                       "validation_error", field=field)
    assert err["message"].startswith(f"{field}: ") and text in err["message"], err
    assert enqueued == []
    assert client.get("/v1/jobs", headers=auth).json()["data"] == []


def test_every_error_is_listed_in_the_message(client, auth):
    body = make_spec(seed="abc", optim={"lr": -1})
    err = assert_error(client.post("/v1/jobs", json=body, headers=auth), 422)
    assert "seed: " in err["message"] and "optim.lr: " in err["message"]


def test_unknown_reasoning_gym_task_lists_close_matches(client, auth):
    body = make_spec(task={"reasoning_gym": {"name": "chain_summ"}})
    err = assert_error(client.post("/v1/jobs", json=body, headers=auth), 422,
                       field="task.reasoning_gym.name")
    assert "close matches" in err["message"] and "chain_sum" in err["message"]


def test_dataset_must_belong_to_the_caller(client, auth, other_auth):
    upload = client.post("/v1/datasets", headers=other_auth,
                         files={"file": ("d.jsonl", b'{"prompt": "1+1", "answer": "2"}\n')})
    assert upload.status_code == 201, upload.text
    theirs = upload.json()["id"]
    for dataset_id in (theirs, "ds_does_not_exist"):
        body = make_spec(task={"dataset": {"id": dataset_id}})
        err = assert_error(client.post("/v1/jobs", json=body, headers=auth), 422,
                           field="task.dataset.id")
        assert dataset_id in err["message"]
    # The owner can use it.
    body = make_spec(task={"dataset": {"id": theirs}})
    assert client.post("/v1/jobs", json=body, headers=other_auth).status_code == 201


def test_malformed_json_body(client, auth):
    resp = client.post("/v1/jobs", content=b"{not json",
                       headers={**auth, "Content-Type": "application/json"})
    assert_error(resp, 422, "validation_error")


def test_openapi_documents_the_spec(client):
    schema = client.get("/openapi.json").json()
    assert "JobSpec" in schema["components"]["schemas"]
    assert "/v1/jobs/{job_id}/checkpoints/{step}/download" in schema["paths"]
    assert "multipart/form-data" in schema["paths"]["/v1/datasets"]["post"]["requestBody"]["content"]
    assert client.get("/docs").status_code == 200
