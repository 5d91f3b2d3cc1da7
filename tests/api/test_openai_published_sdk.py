"""OpenAI's published graders (tests/trainer/graders/openai_published/), unchanged, through the
official `openai` SDK with only `base_url` and `api_key` changed:
`client.fine_tuning.alpha.graders.validate` accepts every one (the judged ones once the
operator maps OpenAI's model ids to a judge), and `...graders.run` scores each judge-free case
as OpenAI's semantics give (python graders in the sandbox). The SDK parses every answer with
its own types. The scoring itself is tested in tests/trainer/graders/test_openai_published.py; this
checks the routes a migrating script calls."""
from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from trainer.graders import sandbox_layer, validate_grader
from trainer.graders.schemas import needs_sandbox
from tests.api.live import serve
from tests.trainer.graders.test_openai_published import FIXTURES, expected_reward, load, openai_judges

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def sdk(app, key: str, monkeypatch) -> Iterator[openai.OpenAI]:
    openai_judges(monkeypatch)
    with serve(app) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    verifiers = getattr(app.state, "grader_verifiers", None)
    if verifiers is not None:
        verifiers.close()


def test_published_graders_validate_and_run_through_the_sdk(sdk) -> None:
    ran = 0
    for path in FIXTURES:
        grader, meta = load(path)
        validated = sdk.fine_tuning.alpha.graders.validate(grader=grader).grader
        assert validated.type == grader["type"], path.name
        sandboxed = needs_sandbox(validate_grader(grader))
        for case in meta["cases"]:
            if case.get("judged") or (sandboxed and sandbox_layer() != "bubblewrap"):
                continue
            run = sdk.fine_tuning.alpha.graders.run(grader=grader, model_sample=case["model_sample"],
                                                    item=case["item"])
            assert run.reward == pytest.approx(expected_reward(case), abs=1e-9), (path.name, run)
            assert run.metadata.type == grader["type"]
            ran += 1
    assert ran >= 10


def test_an_unmapped_judge_is_a_bad_request_naming_model(sdk, monkeypatch) -> None:
    monkeypatch.delenv("BRORL_JUDGE_ALIASES", raising=False)
    grader, _ = load(next(p for p in FIXTURES if load(p)[0]["type"] == "score_model"))
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.fine_tuning.alpha.graders.validate(grader=grader)
    assert exc.value.param == "grader.model" and "no judge named" in exc.value.message
