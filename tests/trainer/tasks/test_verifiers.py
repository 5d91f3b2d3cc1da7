"""The JSONL verifiers: exact, numeric, math and regex, with their edge cases."""
from __future__ import annotations

import pytest

from trainer.tasks.verifiers import ANSWER_CHECKS, VERIFIERS, exact, math_equal, numeric, parse_number, regex


def test_registry_names():
    assert set(VERIFIERS) == {"exact", "numeric", "math", "regex"}


@pytest.mark.parametrize("fn", list(VERIFIERS.values()))
def test_missing_answer_scores_zero(fn):
    assert fn(None, "1") == 0.0


def test_exact_strips_but_is_case_sensitive():
    assert exact("  Paris \n", "Paris") == 1.0
    assert exact("paris", "Paris") == 0.0
    assert exact("3.0", "3") == 0.0
    assert exact("", "x") == 0.0


@pytest.mark.parametrize("text, value", [
    ("42", 42.0), ("-3/4", -0.75), (" 3 / 4 ", 0.75), ("1,234.5", 1234.5), ("1e-3", 0.001),
    ("+7", 7.0), (".5", 0.5), ("5.", 5.0),
])
def test_parse_number_accepts(text, value):
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "abc", "nan", "inf", "1_000", "3/0", "1/2/3", "1e400", "12abc", "0x10"])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_numeric_relative_tolerance():
    assert numeric("100.00005", "100", numeric_tolerance=1e-6) == 1.0
    assert numeric("100.001", "100", numeric_tolerance=1e-6) == 0.0
    assert numeric("101", "100", numeric_tolerance=0.01) == 1.0
    assert numeric("0.75", "3/4") == 1.0
    assert numeric("1,000", "1000") == 1.0
    assert numeric("seven", "7") == 0.0


def test_numeric_zero_uses_absolute_tolerance():
    assert numeric("1e-7", "0", numeric_tolerance=1e-6) == 1.0
    assert numeric("1e-5", "0", numeric_tolerance=1e-6) == 0.0
    assert numeric("0", "0", numeric_tolerance=0.0) == 1.0


def test_numeric_bad_reference_raises():
    with pytest.raises(ValueError):
        numeric("1", "not a number")


@pytest.mark.parametrize("pred, gold, want", [
    ("\\frac{1}{2}", "0.5", 1.0),
    ("x^2+1", "1+x^2", 1.0),
    ("\\sqrt{4}", "2", 1.0),
    ("$\\frac{6}{8}$", "3/4", 0.0),  # not reduced: arithmetic left to do
    ("3", "4", 0.0),
    ("1", "1+x^2", 0.0),
    ("", "1", 0.0),
])
def test_math_verify(pred, gold, want):
    assert math_equal(pred, gold) == want


def test_regex_fullmatch():
    assert regex("abc123", r"abc\d+") == 1.0
    assert regex("xabc123", r"abc\d+") == 0.0  # fullmatch, not search
    assert regex("ABC1", r"abc\d") == 0.0  # no flags
    assert regex("yes", r"yes|y") == 1.0


def test_answer_checks():
    ANSWER_CHECKS["numeric"]("3/4")
    ANSWER_CHECKS["regex"](r"\d+")
    with pytest.raises(ValueError):
        ANSWER_CHECKS["numeric"]("three")
    with pytest.raises(ValueError):
        ANSWER_CHECKS["regex"]("(unclosed")
