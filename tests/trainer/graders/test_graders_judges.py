"""LLM judges (score_model, label_model) against a real OpenAI-compatible endpoint: vLLM's
server on the CPU with a tiny untrained model, its answers held to the JSON schema by
guided decoding. Judges are named by the operator (BRORL_JUDGES); a tenant cannot give a
URL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from pydantic import ValidationError

from tests.support.upstack import free_port, wait_healthy
from trainer.graders import grade_batch, run_grader, validate_grader
from trainer.graders.judges import ALIASES_ENV, JUDGES_ENV, JudgeError, get_judge, parse_answer
from tests.support.services import require_module

LABEL = {"type": "label_model", "name": "polite", "model": "tiny",
         "input": [{"role": "system", "content": "Is the answer polite?"},
                   {"role": "user", "content": "{{ item.question }} -> {{ sample.output_text }}"}],
         "labels": ["yes", "no"], "passing_labels": ["yes"],
         "sampling_params": {"temperature": 1.0, "seed": 1, "max_completions_tokens": 32}}
SCORE = {"type": "score_model", "name": "quality", "model": "tiny",
         "input": [{"role": "user", "content": "Rate 0..1: {{ sample.output_text }}"}],
         "range": [0, 1],
         "sampling_params": {"temperature": 1.0, "seed": 0, "max_completions_tokens": 48}}


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory):
    require_module("vllm")
    from trainer.models.tiny import build_untrained, save_folder

    root = tmp_path_factory.mktemp("judge")
    # 8192 positions: OpenAI's RFT-guide grader prompt is 5.5k characters (one token each).
    model, tokenizer = build_untrained(0, max_position_embeddings=8192)
    save_folder(model, tokenizer, root / "model")
    (root / "chat.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    port = free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
         str(root / "model"), "--served-model-name", "tiny", "--dtype", "float32",
         "--enforce-eager", "--max-model-len", "8192", "--max-num-seqs", "8", "--port", str(port),
         "--chat-template", str(root / "chat.jinja"), "--structured-outputs-config",
         '{"backend": "xgrammar", "disable_any_whitespace": true}'],
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, stdout=log, stderr=log,
        start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", 600,
                     lambda: (root / "server.log").read_text()[-3000:], interval=2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture
def judges(judge_url, monkeypatch):
    monkeypatch.setenv(JUDGES_ENV, json.dumps({"tiny": {"base_url": judge_url, "model": "tiny"}}))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_label_model_against_a_real_endpoint(judges):
    items = [{"question": f"q{n}"} for n in range(6)]
    results = grade_batch(LABEL, [f"answer {n}" for n in range(6)], items)
    assert not any(r.failed for r in results), [r.details for r in results]
    assert {r.reward for r in results} <= {0.0, 1.0}
    response = run_grader(LABEL, "thanks!", {"question": "q"})
    assert response["metadata"]["type"] == "label_model"
    assert not any(v for k, v in response["metadata"]["errors"].items())
    usage = response["model_grader_token_usage_per_model"]["tiny"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert response["metadata"]["sampled_model_name"] == "tiny"
    assert response["metadata"]["token_usage"] == usage["total_tokens"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_score_model_against_a_real_endpoint(judges):
    # The schema's minimum/maximum keep even an untrained judge's number within the range.
    results = grade_batch(SCORE, [f"answer {n}" for n in range(8)], [{}] * 8)
    assert not any(r.failed for r in results), [r.details for r in results]
    assert all(0.0 <= r.reward <= 1.0 for r in results)
    wide = grade_batch({**SCORE, "range": [2, 7]}, ["x"] * 4, [{}] * 4)
    assert all(2.0 <= r.reward <= 7.0 and not r.failed for r in wide), [r.details for r in wide]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_openais_published_judge_graders_run_unchanged(judge_url, monkeypatch):
    # The operator maps OpenAI's model ids onto its own judge (here the tiny vLLM server).
    from openai.types.fine_tuning.alpha.grader_run_response import GraderRunResponse

    from tests.trainer.graders.test_openai_published import FIXTURES, load, openai_judges

    openai_judges(monkeypatch, judge_url)
    # OpenAI's examples ask up to 32768 tokens; the operator caps them below the context.
    monkeypatch.setenv(JUDGES_ENV, json.dumps({"judge": {"base_url": judge_url, "model": "tiny",
                                                         "max_tokens": 48}}))
    ran = 0
    for path in FIXTURES:
        grader, meta = load(path)
        for case in (c for c in meta["cases"] if c.get("judged")):
            response = run_grader(grader, case["model_sample"], case["item"])
            errors = response["metadata"]["errors"]
            assert not any(v for k, v in errors.items() if isinstance(v, bool)), \
                (path.name, errors)
            low, high = case["reward_in"]
            assert low <= response["reward"] <= high, (path.name, response)
            # The judge's own usage, under the model id the grader named.
            usage = response["model_grader_token_usage_per_model"]
            models = {m for m in json.dumps(grader).split('"') if m in usage}
            assert models and all(usage[m]["prompt_tokens"] > 0 for m in models), usage
            assert response["metadata"]["token_usage"] == sum(
                u["total_tokens"] for u in usage.values())
            GraderRunResponse.model_validate(response, strict=True)
            ran += 1
    assert ran >= 5


def test_a_judge_must_be_configured_by_the_operator(monkeypatch):
    monkeypatch.setenv(JUDGES_ENV, json.dumps({"tiny": {"base_url": "http://127.0.0.1:9"}}))
    for model in ("gpt-4o", "http://169.254.169.254/latest"):
        with pytest.raises(JudgeError, match=f"model: no judge named '{model}'"):
            validate_grader({**LABEL, "model": model})
        result = grade_batch({**LABEL, "model": model}, ["x"], [{"question": "q"}])[0]
        assert result.errors["other_error"] and "configured: tiny" in result.details
    down = grade_batch(LABEL, ["x"], [{"question": "q"}])[0]  # configured, nothing listening
    assert down.reward == 0.0 and down.errors["model_grader_server_error"]
    assert "unreachable" in down.openai_errors()["model_grader_server_error_details"]


def test_openai_model_ids_name_a_judge_through_the_operators_mapping(monkeypatch):
    monkeypatch.setenv(JUDGES_ENV, json.dumps({"tiny": {"base_url": "http://127.0.0.1:9"}}))
    monkeypatch.setenv(ALIASES_ENV, json.dumps({"gpt-4o-2024-08-06": "tiny"}))
    grader = validate_grader({**SCORE, "model": "gpt-4o-2024-08-06"})
    assert get_judge(grader.model).name == "tiny"
    with pytest.raises(JudgeError, match="no judge named 'o4-mini-2025-04-16'"):
        validate_grader({**SCORE, "model": "o4-mini-2025-04-16"})  # mapped nowhere
    monkeypatch.setenv(ALIASES_ENV, json.dumps({"o4-mini-2025-04-16": "big"}))
    with pytest.raises(JudgeError, match="maps 'o4-mini-2025-04-16' to 'big'"):
        validate_grader({**SCORE, "model": "o4-mini-2025-04-16"})
    monkeypatch.setenv(ALIASES_ENV, "[1]")
    with pytest.raises(JudgeError, match=ALIASES_ENV):
        validate_grader({**SCORE, "model": "o4-mini-2025-04-16"})


def test_judge_answers_parse_in_openais_shape():
    assert parse_answer('{"result": 0.5, "steps": [{"description": "d", "conclusion": "c"}]}') \
        == 0.5
    assert parse_answer('```json\n{"result": "yes", "steps": []}\n```') == "yes"
    assert parse_answer('Here: {"result": 1}') == 1
    for bad in ('{"steps": []}', '{"result": 1, "steps": 3}', "nothing", None, "[1]"):
        with pytest.raises((KeyError, ValueError)):
            parse_answer(bad)


def test_judge_grader_validation_names_the_field():
    with pytest.raises(ValidationError, match="(?s)passing_labels"):
        validate_grader({**LABEL, "passing_labels": ["maybe"]})
    with pytest.raises(ValidationError, match="(?s)range"):
        validate_grader({**SCORE, "range": [1, 0]})
    with pytest.raises(ValidationError, match="(?s)input.0.content"):
        validate_grader({**SCORE, "input": [{"role": "user", "content": "{{ env.KEY }}"}]})
