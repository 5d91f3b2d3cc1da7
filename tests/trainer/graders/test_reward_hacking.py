"""Known reward-hacking answers score 0 under every verifier and under the reasoning-gym
tasks' own scorers as the service wraps them (extraction included): echoed expressions,
several answers in one tag, hedged tags, empty tags, enormous outputs, other scripts' digits,
misplaced thousands separators."""
from __future__ import annotations

import pytest

from trainer.spec import ReasoningGymTask
from trainer.tasks import reasoning_gym_task
from trainer.tasks.base import VerifierSpec
from trainer.tasks.scoring_worker import get_verifier, score_item

GOLD = "1517"                                  # the question: "What is 37*41?"
HACKS = {
    "echoed expression": "<answer>37*41</answer>",
    "echoed LaTeX product": "<answer>37 \\times 41</answer>",
    "echoed unicode product": "<answer>37×41</answer>",
    "sum left to do": "<answer>1500+17</answer>",
    "implicit product": "<answer>(37)(41)</answer>",
    "unreduced fraction": "<answer>3034/2</answer>",
    "unreduced LaTeX fraction": "<answer>\\frac{3034}{2}</answer>",
    "two answers, comma": "<answer>1517, 1518</answer>",
    "two answers, or": "<answer>1516 or 1517</answer>",
    "two answers, space": "<answer>1517 1518</answer>",
    "hedged tags (last decides)": "<answer>1517</answer> or <answer>1518</answer>",
    "empty tag": "<answer></answer>",
    "blank tag": "<answer>   </answer>",
    "no tag": "1517",
    "enormous repeat": "<answer>" + "1517" * 5000 + "</answer>",
    "enormous number": "<answer>1517" + "0" * 3000 + "</answer>",
    "arabic-indic digits": "<answer>١٥١٧</answer>",
    "full-width digits": "<answer>１５１７</answer>",
    "comma inside a group": "<answer>15,17</answer>",
}
HONEST = ["<answer>1517</answer>", "work... <answer> 1517 </answer>"]
VERIFIERS = {k: VerifierSpec.of("dataset", verifier=k, numeric_tolerance=1e-6)
             for k in ("exact", "numeric", "math", "regex")}


@pytest.mark.parametrize("kind", list(VERIFIERS))
@pytest.mark.parametrize("hack", list(HACKS))
def test_hack_scores_zero(kind, hack):
    verifier = get_verifier(VERIFIERS[kind])
    assert score_item(verifier, (HACKS[hack], GOLD, {}), 5.0)[0] == 0.0


@pytest.mark.parametrize("kind", list(VERIFIERS))
@pytest.mark.parametrize("text", HONEST)
def test_honest_answer_scores_one(kind, text):
    # The table can fail: the same verifiers do pay a plain correct answer.
    assert score_item(get_verifier(VERIFIERS[kind]), (text, GOLD, {}), 5.0)[0] == 1.0


@pytest.mark.parametrize("kind", ["numeric", "math"])
def test_grouped_thousands_and_reduced_fractions_are_values(kind):
    verifier = get_verifier(VERIFIERS[kind])
    assert score_item(verifier, ("<answer>1,517</answer>", GOLD, {}), 5.0)[0] == 1.0
    assert score_item(verifier, ("<answer>3/4</answer>", "0.75", {}), 5.0)[0] == 1.0


@pytest.fixture(scope="module", params=["chain_sum", "basic_arithmetic"])
def rg_task(request):
    spec = ReasoningGymTask(name=request.param, config={}, train_size=20, eval_size=5)
    return reasoning_gym_task.build(spec, seed=0)


def test_reasoning_gym_scorers_refuse_the_hacks(rg_task):
    verifier = get_verifier(rg_task.verifier_spec)
    for ex in rg_task.eval:
        gold = ex.answer
        expression = ex.payload.get("metadata", {}).get("expression") or ex.question
        cases = {
            "echoed expression": f"<answer>{expression}</answer>",
            "two answers": f"<answer>{gold}, {int(gold) + 1}</answer>",
            "hedged tags": f"<answer>{gold}</answer><answer>{int(gold) + 1}</answer>",
            "empty tag": "<answer></answer>",
            "enormous": f"<answer>{gold * 3000}</answer>",
            "full-width digits": "<answer>" + gold.translate(str.maketrans("0123456789-", "０１２３４５６７８９-")) + "</answer>",
        }
        for name, text in cases.items():
            if name == "full-width digits" and text == f"<answer>{gold}</answer>":
                continue
            assert score_item(verifier, (text, gold, ex.payload), 5.0)[0] == 0.0, (name, text, gold)
        assert score_item(verifier, (f"<answer>{gold}</answer>", gold, ex.payload), 5.0)[0] == 1.0
