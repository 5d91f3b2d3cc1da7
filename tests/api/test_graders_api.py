"""/v1/graders: validate and run in OpenAI's shapes, tenant-authenticated and rate limited,
python graders run in the sandbox (the route's process never runs the source)."""
from __future__ import annotations


import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.support.services import bubblewrap_missing, needs_service

SC = {"type": "string_check", "name": "s", "input": "{{ sample.output_text }}",
      "reference": "{{ item.answer }}", "operation": "eq"}
# Writes a marker next to the API's data when run in-process; the sandbox cannot see it.
PY = {"type": "python", "name": "pid",
      "source": "import os\ndef grade(sample, item):\n"
                "    open(item['probe'], 'w').write('ran here')\n"
                "    return 1.0\n"}


@pytest.fixture
def graders_client(app):
    with TestClient(app) as c:
        yield c
    verifiers = getattr(app.state, "grader_verifiers", None)
    if verifiers is not None:
        verifiers.close()


def test_validate_returns_the_grader_or_names_the_field(graders_client, auth):
    ok = graders_client.post("/v1/graders/validate", json={"grader": SC}, headers=auth)
    assert ok.status_code == 200 and ok.json() == {"grader": SC}
    bad = graders_client.post("/v1/graders/validate", headers=auth,
                              json={"grader": {**SC, "operation": "contains"}})
    assert bad.status_code == 422 and "operation" in bad.json()["error"]["field"]
    cosine = {"type": "text_similarity", "name": "t", "input": "a", "reference": "b",
              "evaluation_metric": "cosine", "pass_threshold": 0.5}
    refused = graders_client.post("/v1/graders/validate", json={"grader": cosine}, headers=auth)
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "grader.evaluation_metric"


def test_unconfigured_judge_is_a_422_naming_model(graders_client, auth, monkeypatch):
    monkeypatch.delenv("BRORL_JUDGES", raising=False)
    judge = {"type": "label_model", "name": "j", "model": "http://10.0.0.1/v1",
             "input": [{"role": "user", "content": "{{ sample.output_text }}"}],
             "labels": ["a", "b"], "passing_labels": ["a"]}
    r = graders_client.post("/v1/graders/run", headers=auth,
                            json={"grader": judge, "model_sample": "x"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "grader.model"


def test_needs_a_key(graders_client):
    assert graders_client.post("/v1/graders/validate", json={"grader": SC}).status_code == 401
    assert graders_client.post("/v1/graders/run", json={"grader": SC,
                                                        "model_sample": "x"}).status_code == 401


def test_run_string_check_in_openai_shape(graders_client, auth):
    r = graders_client.post("/v1/graders/run", headers=auth,
                            json={"grader": SC, "model_sample": "42", "item": {"answer": "42"}})
    assert r.status_code == 200
    body = r.json()
    assert body["reward"] == 1.0 and body["metadata"]["type"] == "string_check"
    assert body["metadata"]["errors"]["other_error"] is False


@needs_service("bubblewrap", bubblewrap_missing())
def test_run_python_grader_in_the_sandbox(graders_client, auth, tmp_path):
    probe = tmp_path / "probe"
    r = graders_client.post("/v1/graders/run", headers=auth,
                            json={"grader": PY, "model_sample": "x", "item": {"probe": str(probe)}})
    assert r.status_code == 200
    body = r.json()
    # The source ran, but in the sandbox: it could not write to the host's folder.
    assert body["reward"] == 0.0 and body["metadata"]["errors"]["python_grader_runtime_error"]
    assert "FileNotFoundError" in body["metadata"]["errors"]["python_grader_runtime_error_details"]
    assert not probe.exists()


def test_rate_limited_per_key(settings, enqueued, auth):
    app = create_app(settings.model_copy(update={"rate_limit_per_s": 0.01,
                                                 "rate_limit_burst": 2}), enqueue=enqueued)
    with TestClient(app) as c:
        codes = [c.post("/v1/graders/validate", json={"grader": SC}, headers=auth).status_code
                 for _ in range(4)]
    assert codes[:2] == [200, 200] and codes[-1] == 429


def test_packages_lists_what_graders_can_import(graders_client, auth):
    r = graders_client.get("/v1/graders/packages", headers=auth)
    names = {p["name"] for p in r.json()["packages"]}
    assert {"numpy", "sympy", "rapidfuzz", "nltk"} <= names


def test_cli_graders_validate_and_run(app, auth, key, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cli.main import app as cli
    from tests.api.live import serve

    grader = tmp_path / "g.json"
    grader.write_text(__import__("json").dumps(SC))
    bad = tmp_path / "bad.json"
    bad.write_text(__import__("json").dumps({**SC, "operation": "contains"}))
    runner = CliRunner()
    with serve(app) as url:
        monkeypatch.setenv("BRORL_URL", url)
        monkeypatch.setenv("BRORL_API_KEY", key)
        ok = runner.invoke(cli, ["graders", "validate", str(grader)])
        assert ok.exit_code == 0 and '"string_check"' in ok.output
        refused = runner.invoke(cli, ["graders", "validate", str(bad)])
        assert refused.exit_code == 1 and "operation" in refused.output
        ran = runner.invoke(cli, ["graders", "run", str(grader), "--sample", "7",
                                  "--item", '{"answer": "7"}'])
        assert ran.exit_code == 0 and '"reward": 1.0' in ran.output, ran.output


def test_openai_published_graders_validate_unchanged_over_http(graders_client, auth, monkeypatch):
    import json
    from pathlib import Path

    from openai.types.fine_tuning.alpha.grader_run_response import GraderRunResponse

    folder = Path(__file__).parents[1] / "trainer" / "graders" / "openai_published"
    monkeypatch.setenv("BRORL_JUDGES", '{"judge": {"base_url": "http://127.0.0.1:9/v1"}}')
    monkeypatch.setenv("BRORL_JUDGE_ALIASES", '{"gpt-4o-2024-08-06": "judge"}')
    label = json.loads((folder / "api_label_model.json").read_text())  # input_text parts
    ok = graders_client.post("/v1/graders/validate", json={"grader": label}, headers=auth)
    assert ok.status_code == 200, ok.text
    multi = json.loads((folder / "guide_multi_name_email.json").read_text())  # no name
    ok = graders_client.post("/v1/graders/validate", json={"grader": multi}, headers=auth)
    assert ok.status_code == 200 and ok.json()["grader"]["name"] == "multi"
    ran = graders_client.post("/v1/graders/run", headers=auth, json={
        "grader": multi, "model_sample": '{"name": "John Doe", "email": "j@d.e"}',
        "item": {"name": "John Doe", "email": "j@d.e"}})
    assert ran.status_code == 200 and ran.json()["reward"] == 1.0
    GraderRunResponse.model_validate(ran.json(), strict=True)
    unmapped = json.loads((folder / "guide_score_model.json").read_text())  # o4-mini
    refused = graders_client.post("/v1/graders/validate", json={"grader": unmapped},
                                  headers=auth)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "grader.model"


def test_image_content_is_refused_naming_the_field(graders_client, auth, monkeypatch):
    monkeypatch.setenv("BRORL_JUDGES", '{"judge": {"base_url": "http://127.0.0.1:9/v1"}}')
    grader = {"type": "score_model", "model": "judge", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Rate {{ sample.output_text }}"},
        {"type": "input_image", "image_url": "http://169.254.169.254/x.png"}]}]}
    r = graders_client.post("/v1/graders/validate", json={"grader": grader}, headers=auth)
    assert r.status_code == 422
    body = r.json()["error"]
    assert "input.0.content" in body["field"] and "input_image" in r.text, body


def test_packages_list_openai_grader_images_packages(graders_client, auth):
    body = graders_client.get("/v1/graders/packages", headers=auth).json()
    names = {p["name"] for p in body["packages"]}
    assert {"scipy", "pandas", "scikit-learn", "deepdiff", "sqlparse", "jsonschema", "rdkit",
            "scikit-bio", "ast-grep-py"} <= names
    assert isinstance(body["nltk_corpora"], list)
