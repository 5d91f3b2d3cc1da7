"""OpenAI's published graders, unchanged (tests/trainer/graders/openai_published/*.json, each with its
source page in the `.source.json` beside it: the graders guide, API reference, RFT guide, RFT
use-case page and the RFT cookbook notebook): every one validates here as it is, and the ones
that need no judge run with the scores OpenAI's semantics give, their responses checked with
the official `openai` SDK's own GraderRunResponse type. Python graders run in the real
bubblewrap sandbox, with the packages and nltk corpora of OpenAI's grader image. The judged
ones run against a real OpenAI-compatible judge in test_graders_judges.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.types.fine_tuning.alpha.grader_run_response import GraderRunResponse

from trainer.graders import GraderRuntime, run_grader, validate_grader
from trainer.graders.judges import ALIASES_ENV, JUDGES_ENV
from trainer.graders.schemas import needs_sandbox
from tests.support.services import bubblewrap_missing, needs_service, require_service, wordnet_missing

HERE = Path(__file__).parent / "openai_published"
FIXTURES = sorted(p for p in HERE.glob("*.json") if not p.name.endswith(".source.json"))
bubblewrap = needs_service("bubblewrap", bubblewrap_missing())


# The models OpenAI's graders guide lists for model graders.
OPENAI_GRADER_MODELS = (
    "gpt-4o-2024-08-06", "gpt-4o-mini-2024-07-18", "gpt-4.1-2025-04-14",
    "gpt-4.1-mini-2025-04-14", "gpt-4.1-nano-2025-04-14", "o1-2024-12-17", "o3-mini-2025-01-31",
    "o3-2025-04-16", "o4-mini-2025-04-16")


def load(path: Path) -> tuple[dict, dict]:
    return json.loads(path.read_text()), json.loads(path.with_suffix(".source.json").read_text())


def openai_judges(monkeypatch, base_url: str = "http://127.0.0.1:9/v1") -> None:
    """An operator's set-up: one judge, named by the OpenAI model ids the graders use."""
    monkeypatch.setenv(JUDGES_ENV, json.dumps({"judge": {"base_url": base_url}}))
    monkeypatch.setenv(ALIASES_ENV, json.dumps(dict.fromkeys(OPENAI_GRADER_MODELS, "judge")))


def expected_reward(case: dict) -> float:
    if "reward_python" in case:  # the library OpenAI's grader uses, computed here
        imports, expression = case["reward_python"].split("; ", 1)
        scope: dict = {}
        exec(imports, scope)  # noqa: S102 - the fixture's own reference computation
        return eval(expression, scope)  # noqa: S307
    return case["reward"]


def test_there_are_published_graders_of_every_openai_type():
    types = {load(p)[0]["type"] for p in FIXTURES}
    assert len(FIXTURES) >= 17
    assert {"string_check", "text_similarity", "python", "score_model", "label_model",
            "multi"} <= types
    for path in FIXTURES:
        assert load(path)[1]["url"].startswith((
            "https://developers.openai.com/", "https://github.com/openai/")), path.name


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_published_grader_validates_unchanged(path, monkeypatch):
    openai_judges(monkeypatch)
    grader, _ = load(path)
    parsed = validate_grader(grader)
    # What is stored (the dump) validates again to the same grader.
    assert validate_grader(parsed.model_dump(mode="json", exclude_none=True)) == parsed
    if "name" not in grader:
        assert parsed.name == grader["type"]


def test_an_unmapped_openai_model_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(JUDGES_ENV, json.dumps({"judge": {"base_url": "http://127.0.0.1:9/v1"}}))
    monkeypatch.delenv(ALIASES_ENV, raising=False)
    grader, _ = load(HERE / "guide_score_model.json")
    with pytest.raises(ValueError, match="model: no judge named 'o4-mini-2025-04-16'"):
        validate_grader(grader)


CASES = [(p, n) for p in FIXTURES for n, c in enumerate(load(p)[1]["cases"])
         if not c.get("judged")]


@pytest.mark.parametrize("path,n", CASES, ids=[f"{p.stem}-{n}" for p, n in CASES])
def test_published_grader_scores_as_openai_does(path, n, runtime, monkeypatch):
    grader, meta = load(path)
    if needs_sandbox(validate_grader(grader)):
        require_service("bubblewrap", bubblewrap_missing())
    case = meta["cases"][n]
    response = run_grader(grader, case["model_sample"], case["item"], runtime)
    errors = response["metadata"]["errors"]
    if "error" in case:
        assert errors[case["error"]], errors
    else:
        assert not any(v for k, v in errors.items() if not k.endswith(("_details", "_type"))), \
            errors
    assert response["reward"] == pytest.approx(expected_reward(case), abs=1e-9)
    for key, value in case.get("sub_rewards", {}).items():
        assert response["sub_rewards"][key] == pytest.approx(value)
    checked = GraderRunResponse.model_validate(response, strict=True)
    assert checked.metadata.type == grader["type"]
    assert checked.metadata.name == grader.get("name", grader["type"])


@pytest.fixture(scope="module")
def runtime():
    with GraderRuntime(pool_size=1) as shared:
        yield shared


# Two graders, not one: all of these at once pass the sandbox's 2 GB address-space limit
# (RLIMIT_AS counts virtual memory; nltk's WordNet alone maps several hundred MB).
OPENAI_IMAGE_PACKAGES = """
import numpy, scipy, sympy, pandas, rapidfuzz, sklearn, rouge_score, deepdiff, jsonschema
import pydantic, yaml, sqlparse, rdkit, skbio, ast_grep_py
from rdkit import Chem
from ast_grep_py import SgRoot

def grade(sample, item):
    atoms = Chem.MolFromSmiles(item["smiles"]).GetNumAtoms()
    calls = SgRoot("f(1); g(2)", "javascript").root().find_all(pattern="$F($A)")
    assert sqlparse.parse("select 1")[0].get_type() == "SELECT"
    return atoms / 10 + len(calls) / 100
"""
NLTK_CORPORA = """
from nltk.corpus import stopwords, wordnet
from nltk.translate.meteor_score import meteor_score

def grade(sample, item):
    kept = [w for w in sample["output_text"].split() if w not in stopwords.words("english")]
    assert kept == ["cat", "sat", "mat"], kept
    assert wordnet.synsets("dog")[0].name() == "dog.n.01"
    return meteor_score([["the", "cat", "sat"]], ["the", "cats", "sat"])
"""


@bubblewrap
@pytest.mark.timeout(300)
def test_the_sandbox_has_openai_grader_images_packages_and_corpora(runtime):
    from trainer.graders import corpora

    if not {"stopwords", "wordnet"} <= set(corpora.available()):
        corpora.build()  # what `make install` does; idempotent
    for source, reward in ((OPENAI_IMAGE_PACKAGES, 0.3 + 0.02),  # 3 atoms, 2 calls
                           (NLTK_CORPORA, 0.9814814814814815)):  # "cats" stems to "cat"
        response = run_grader({"type": "python", "source": source}, "the cat sat on the mat",
                              {"smiles": "CCO"}, runtime)
        errors = response["metadata"]["errors"]
        assert not errors["python_grader_runtime_error"], \
            errors["python_grader_runtime_error_details"]
        assert response["reward"] == pytest.approx(reward)


def test_meteor_is_accepted_when_wordnet_is_there():
    require_service("WordNet", wordnet_missing())
    grader = {"type": "text_similarity", "input": "{{ sample.output_text }}",
              "reference": "{{ item.answer }}", "evaluation_metric": "meteor"}
    response = run_grader(grader, "the cats sat", {"answer": "the cat sat"})
    assert response["reward"] == pytest.approx(0.9814814814814815)
    GraderRunResponse.model_validate(response, strict=True)


@bubblewrap
def test_this_services_own_types_answer_in_openais_shape_too(runtime):
    for grader, sample, item in (
            ({"type": "verifier", "name": "exact"}, "<answer>4</answer>", {"answer": "4"}),
            ({"type": "code"}, "```python\nprint(int(input()) * 2)\n```",
             {"tests": [{"stdin": "2\n", "stdout": "4\n"}]})):
        response = run_grader(grader, sample, item, runtime)
        assert response["reward"] == 1.0, response
        checked = GraderRunResponse.model_validate(response, strict=True)
        assert checked.metadata.name == grader.get("name", grader["type"])
