"""Grader semantics against reference values: each grader type, each metric, formulas,
templates and validation errors (the sandboxed types run through the real sandbox)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainer.graders import grade_batch, run_grader, validate_grader
from trainer.graders import formula, similarity, templates
from trainer.graders.schemas import MAX_PYTHON_SOURCE_BYTES, parse_grader
from tests.support.services import bubblewrap_missing, needs_service, wordnet_missing

needs_wordnet = needs_service("WordNet", wordnet_missing())
needs_sandbox = needs_service("bubblewrap", bubblewrap_missing())


def sc(op, input="{{ sample.output_text }}", reference="{{ item.answer }}"):
    return {"type": "string_check", "name": "s", "input": input, "reference": reference,
            "operation": op}


def ts(metric, threshold=0.5):
    return {"type": "text_similarity", "name": "t", "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}", "evaluation_metric": metric,
            "pass_threshold": threshold}


def rewards(grader, texts, items):
    return [r.reward for r in grade_batch(grader, texts, items)]


@pytest.mark.parametrize("op,expected", [
    ("eq", [1, 0, 0]), ("ne", [0, 1, 1]), ("like", [1, 1, 0]), ("ilike", [1, 1, 1])])
def test_string_check_operations(op, expected):
    texts = ["Paris", "It is Paris.", "PARIS"]
    assert rewards(sc(op), texts, [{"answer": "Paris"}] * 3) == expected


@pytest.mark.parametrize("metric,text,reference,expected", [
    # hyp "the cat sat" vs ref "the cat sat on the mat": unigrams P=1 R=1/2 -> F=2/3;
    # bigrams P=1 R=2/5 -> F=4/7; LCS 3 -> P=1 R=1/2 -> F=2/3.
    ("rouge_1", "the cat sat", "the cat sat on the mat", 2 / 3),
    ("rouge_2", "the cat sat", "the cat sat on the mat", 4 / 7),
    ("rouge_3", "the cat sat", "the cat sat on the mat", 2 / 5),  # P=1, R=1/4
    ("rouge_4", "the cat sat", "the cat sat on the mat", 0.0),
    ("rouge_5", "a b c d e", "a b c d e", 1.0),
    ("rouge_l", "the cat sat", "the cat sat on the mat", 2 / 3),
    # GLEU = min(n-gram precision, recall) over 1..4-grams: 6 matches / 18 ref n-grams.
    ("gleu", "the cat sat", "the cat sat on the mat", 1 / 3),
    ("gleu", "a b c d", "a b c d", 1.0),
    ("bleu", "the quick brown fox jumps", "the quick brown fox jumps", 1.0),
    ("fuzzy_match", "hello world", "hello world", 1.0),
    ("fuzzy_match", "abcd", "wxyz", 0.0),
    # METEOR: 3 of 3 words in one chunk -> (1 - 0.5 * (1/3)^3) = 0.98148; "auto" is a
    # WordNet synonym of "car": 2 matches, 1 chunk -> 1 - 0.5 * (1/2)^3 = 0.9375; "bus" is
    # not: P = R = 1/2, penalty 0.5 * 1^3 -> 0.25.
    pytest.param("meteor", "the cat sat", "the cat sat", 1 - 0.5 / 27, marks=needs_wordnet),
    pytest.param("meteor", "my car", "my auto", 0.9375, marks=needs_wordnet),
    pytest.param("meteor", "my car", "my bus", 0.25, marks=needs_wordnet),
])
def test_text_similarity_reference_values(metric, text, reference, expected):
    assert rewards(ts(metric), [text], [{"answer": reference}])[0] == pytest.approx(expected)


def test_bleu_and_fuzzy_rank_closer_texts_higher():
    ref = {"answer": "the quick brown fox jumps over the lazy dog"}
    for metric in ("bleu", "fuzzy_match"):
        close, far = rewards(ts(metric), ["the quick brown fox jumped over the lazy dog",
                                          "an entirely different sentence"], [ref, ref])
        assert 0.0 <= far < close < 1.0


@pytest.mark.parametrize("metric,no_wordnet", [("cosine", False), ("meteor", True)])
def test_unsupported_metrics_are_refused_by_name(metric, no_wordnet, monkeypatch):
    if no_wordnet:
        monkeypatch.setattr(similarity, "wordnet_dir", lambda: None)
    with pytest.raises(ValueError, match=f"evaluation_metric: .*'{metric}'"):
        validate_grader(ts(metric))
    result = grade_batch(ts(metric), ["x"], [{"answer": "x"}])[0]
    assert result.reward == 0.0 and result.errors["other_error"]


@pytest.mark.parametrize("text,expected", [
    ("a + b * 2", 0.5 + 0.25 * 2), ("(a + b) / 2", 0.375), ("a ^ 2", 0.25),
    ("2 ^ 3 ^ 2", 512.0), ("a + b ^ 2", 0.5625), ("-a ^ 2", -0.25), ("-a + max(a, b, 0.1)", 0.0), ("min(a, b)", 0.25),
    ("abs(b - a)", 0.25), ("floor(a + 1.7) + ceil(b)", 3.0), ("exp(0) + sqrt(4)", 3.0),
    ("log(exp(2))", 2.0), ("log(8, 2)", 3.0),
])
def test_formula_values(text, expected):
    assert formula.evaluate(text, {"a": 0.5, "b": 0.25}) == pytest.approx(expected)


@pytest.mark.parametrize("text,error", [
    ("__import__('os')", "unknown function"), ("a.real", "Attribute"),
    ("(lambda: 1)()", "unknown function"), ("a if b else 1", "IfExp"), ("'x'", "numbers"),
    ("a +", "does not parse"), ("a ^^ 2", "does not parse"), ("log(0)", "failed"), ("9 ^ 9 ^ 9", "failed"),
    ("a ** 2 ** 2 ** 2 ** 2 ** 2", "failed"), ("c + 1", "not a grader key"),
])
def test_formula_errors(text, error):
    with pytest.raises(formula.FormulaError, match=error):
        formula.evaluate(text, {"a": 0.5, "b": 0.25})


def test_templates_render_paths_and_refuse_anything_else():
    item = {"a": {"b": [10, {"c": "deep"}]}, "answer": 3}
    sample = {"output_text": "hi", "output_json": {"x": [1, 2]}}
    assert templates.render("{{ item.a.b[1].c }}/{{ item.answer }}", item, sample) == "deep/3"
    assert templates.render("{{ sample.output_json.x }}", item, sample) == "[1, 2]"
    assert templates.render("{{ item.missing }}|{{ sample.output_text }}", item, sample) == "|hi"
    for bad in ("{{ os.environ }}", "{% for x in item %}{% endfor %}", "{{ item.a | upper }}",
                "{{ item.a() }}", "{{ item.__class__ }}x{{ cycler }}", "{{ item.a"):
        with pytest.raises(templates.TemplateError):
            templates.template_paths(bad)
    assert templates.item_fields("{{ item.a.b }} {{ sample.output_text }} {{ item.q }}") == \
        {"a", "q"}


def test_validation_errors_name_the_field():
    with pytest.raises(ValidationError, match=r"(?s)string_check\.input"):
        parse_grader(sc("eq", input="{{ secrets.x }}"))
    with pytest.raises(ValidationError, match=r"(?s)string_check\.operation"):
        parse_grader(sc("contains"))
    with pytest.raises(ValidationError, match=r"(?s)python\.source.*bytes"):
        parse_grader({"type": "python", "name": "p",
                      "source": "def grade(s, i): return 1\n#" + "x" * MAX_PYTHON_SOURCE_BYTES})
    with pytest.raises(ValidationError, match=r"(?s)python\.source.*grade"):
        parse_grader({"type": "python", "name": "p", "source": "def score(s, i): return 1"})
    with pytest.raises(ValidationError, match="(?s)calculate_output.*zz"):
        parse_grader({"type": "multi", "name": "m", "graders": {"a": sc("eq")},
                      "calculate_output": "a + zz"})
    with pytest.raises(ValidationError, match="type"):
        parse_grader({"type": "endpoint", "name": "e"})


def test_sample_parse_error_when_output_json_is_read_but_absent():
    grader = sc("eq", input="{{ sample.output_json.answer }}")
    ok, bad = grade_batch(grader, ['{"answer": "4"}', "four"], [{"answer": "4"}] * 2)
    assert ok.reward == 1.0 and not ok.failed
    assert bad.reward == 0.0 and bad.errors["sample_parse_error"]


@needs_sandbox
def test_python_grader_values_and_errors():
    source = ("import math\n"
              "def grade(sample, item):\n"
              "    t = sample['output_text']\n"
              "    if t == 'raise': raise ValueError('bad sample')\n"
              "    if t == 'str': return 'one'\n"
              "    if isinstance(sample['output_json'], dict):\n"
              "        return float(sample['output_json']['v'])\n"
              "    return 1 - abs(float(t) - item['answer']) / 10\n")
    grader = {"type": "python", "name": "p", "source": source}
    results = grade_batch(grader, ["7", "raise", "str", '{"v": 0.25}'], [{"answer": 5}] * 4)
    assert results[0].reward == pytest.approx(0.8) and not results[0].failed
    assert results[1].errors["python_grader_runtime_error"]
    assert "ValueError: bad sample" in results[1].details
    assert results[2].errors["python_grader_runtime_error"] and "not a number" in \
        results[2].details
    assert results[3].reward == 0.25


@needs_sandbox
def test_code_grader_stdio_and_asserts():
    adder = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    off_by_one = "```python\na, b = map(int, input().split())\nprint(a + b + (a > 5))\n```"
    stdio = {"tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "7 1", "stdout": "8"}]}
    fn = "Here:\n```py\ndef is_even(n):\n    return n % 2 == 0\ndef half(n):\n    return n / 2\n```"
    asserts = {"tests": ["assert is_even(4)", "assert not is_even(3)", "assert half(3) == 1.5",
                         {"assert": "assert half(2) == 1"}]}
    grader = {"type": "code", "name": "c"}
    out = rewards(grader, [adder, off_by_one, fn, "def is_even(n): return True"],
                  [stdio, stdio, asserts, asserts])
    assert out == [1.0, 0.5, 1.0, 0.25]
    bad = grade_batch(grader, [adder], [{"tests": ["print(1)"]}])[0]
    assert bad.errors["other_error"] and "tests[0]" in bad.details


@needs_sandbox
def test_multi_and_run_response_shape():
    grader = {"type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * py",
              "graders": {"exact": sc("eq"), "py": {"type": "python", "name": "p",
                          "source": "def grade(sample, item):\n    return 0.5\n"}}}
    response = run_grader(grader, "42", {"answer": "42"})
    assert response["reward"] == pytest.approx(0.75)
    assert response["sub_rewards"] == {"exact": 1.0, "py": 0.5}
    meta = response["metadata"]
    assert (meta["name"], meta["type"]) == ("m", "multi") and meta["execution_time"] > 0
    # Every flag openai-python declares, and nothing else (tests/trainer/graders/test_graders_openai_shapes.py
    # validates whole responses with the SDK's own type).
    from openai.types.fine_tuning.alpha.grader_run_response import MetadataErrors
    assert set(meta["errors"]) == {f.alias or n for n, f in MetadataErrors.model_fields.items()}
    assert not any(v for k, v in meta["errors"].items())
    failing = dict(grader, calculate_output="log(exact - 1)")
    result = run_grader(failing, "42", {"answer": "42"})
    assert result["reward"] == 0.0 and result["metadata"]["errors"]["formula_parse_error"]
