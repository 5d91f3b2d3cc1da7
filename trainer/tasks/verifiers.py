"""Verifiers for uploaded JSONL datasets: exact, numeric, math (math-verify) and regex.

Each is `(extracted, answer, **opts) -> float` in [0, 1], where `extracted` is the model's
answer taken from its last <answer> tag (None when there was none: always 0) and `answer`
is the dataset row's answer as text. Options not meant for a verifier are ignored, so the
scorer can pass the dataset spec's options to any of them. They raise on bad *reference*
data (e.g. an invalid regex); the scorer counts that as an error and scores 0.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable

# A plain decimal or scientific number in ASCII digits. Stricter than float(), which would
# also take "nan", "infinity", "1_000" and other scripts' digits ("١٥").
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Thousands separators only in proper groups: "1,234,567.5", never "1,2" or "12,34".
_GROUPED = re.compile(r"[+-]?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]*)?")
_FRACTION = re.compile(r"\s*([^/]+?)\s*/\s*([^/]+?)\s*")
_INTEGER = re.compile(r"[+-]?[0-9]+")
# Arithmetic between two numbers: an expression for the verifier to evaluate, not a value.
# ("37*41" for 1517 would teach the policy to echo the question.) A lone a/b is handled apart.
_OP = r"(?:[-+*/^×÷·−]|\\times|\\cdot|\\div|\\pm)"
# A plain number: not an exponent, subscript or command argument ("x^2+1" is a value).
_PLAIN = r"(?<![\w^_{}\\.])[0-9]+(?:\.[0-9]+)?"
_ARITHMETIC = re.compile(
    rf"{_PLAIN}\s*{_OP}\s*\(?\s*[0-9]"                      # 37*41, 1500+17, 2^10
    rf"|{_PLAIN}\s*\^\s*\{{\s*[0-9]"                        # 2^{{10}}
    r"|\)\s*\(\s*[0-9]"                                        # (37)(41)
    rf"|\\[dt]?frac\{{[^}}]*\}}\{{[^}}]*\}}\s*{_OP}\s*(?:[0-9(]|\\[dt]?frac)")  # \frac12+\frac12
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([+-]?[0-9]+)\s*\}\s*\{\s*([+-]?[0-9]+)\s*\}")
# Longer answers are refused unread: an enormous output must not cost a parse (or a reward).
MAX_ANSWER_CHARS = 1000


def exact(extracted: str | None, answer: str, **_: Any) -> float:
    """1 when both sides are equal after stripping surrounding whitespace.

    Case-sensitive and otherwise literal on purpose: "Paris" and "paris" differ, as do "3"
    and "3.0" (use `numeric` for numbers).
    """
    if extracted is None:
        return 0.0
    return float(extracted.strip() == answer.strip())  # a long output simply differs


def ascii_digits_only(text: str) -> bool:
    return not any(ch.isdigit() and ch not in "0123456789" for ch in text)


def parse_number(text: str, strict: bool = False) -> float | None:
    """A finite float from "1,234.5", "-3/4", "1e-3", "+7"; None when it is not one.

    Commas are accepted only as thousands separators in groups of three ("1,2" is not 12).
    `strict` (a model's answer, not a reference): a fraction must be of integers and reduced
    ("2/4" and "1.5/3" are arithmetic left to do, not a value).
    """
    s = text.strip()
    if len(s) > MAX_ANSWER_CHARS or not ascii_digits_only(s):
        return None
    if "," in s:
        if not _GROUPED.fullmatch(s):
            return None
        s = s.replace(",", "")
    frac = _FRACTION.fullmatch(s)
    if frac:
        num, den = _plain_number(frac.group(1)), _plain_number(frac.group(2))
        if num is None or not den:  # a missing or zero denominator is not a number
            return None
        if strict and not _reduced_fraction(frac.group(1), frac.group(2)):
            return None
        value = num / den
    else:
        value = _plain_number(s)
    return value if value is not None and math.isfinite(value) else None


def _reduced_fraction(num: str, den: str) -> bool:
    if not (_INTEGER.fullmatch(num.strip()) and _INTEGER.fullmatch(den.strip())):
        return False
    n, d = int(num), int(den)
    return d > 1 and math.gcd(n, d) == 1


def _plain_number(s: str) -> float | None:
    if not _NUMBER.fullmatch(s):
        return None
    value = float(s)
    return value if math.isfinite(value) else None


def numeric(extracted: str | None, answer: str, numeric_tolerance: float = 1e-6, **_: Any) -> float:
    """1 when |x - gold| <= tol * |gold|, or |x| <= tol when gold is 0 (relative to gold)."""
    if extracted is None:
        return 0.0
    gold = parse_number(answer)
    if gold is None:
        raise ValueError(f"reference answer {answer!r} is not a number")
    value = parse_number(extracted, strict=True)
    if value is None:
        return 0.0
    bound = numeric_tolerance * abs(gold) if gold != 0 else numeric_tolerance
    return float(abs(value - gold) <= bound)


def _math_parse(text: str) -> list:
    """math-verify's parse of a bare answer, read as LaTeX math first.

    The text is already the extracted answer, so it is wrapped in $...$: unwrapped,
    math-verify hunts for a number inside it and reads "1+x^2" as 1. Text that carries its
    own $ delimiters is parsed as is. math-verify's own signal-based timeout is switched
    off: the scorer times every sample itself, and math-verify's alarm would cancel the
    scorer's timer (a process has one SIGALRM).
    """
    from math_verify import parse

    candidates = [text] if "$" in text else [f"${text}$", text]
    for candidate in candidates:
        parsed = parse(candidate, parsing_timeout=None)
        if parsed:
            return parsed
    return []


@functools.lru_cache(maxsize=4096)
def _math_gold(answer: str) -> list:
    # The same reference is scored N times per prompt: parse it once.
    return _math_parse(answer)


def is_math_value(text: str, answer: str = "") -> bool:
    """Whether `text` states a value rather than arithmetic for the verifier to do.

    A value: a number, a reduced fraction (a/b or \\frac{a}{b}), or a LaTeX value (\\sqrt{2},
    \\pi, 1+\\sqrt{3}, x^2+1). Not one: "37*41", "1500+17", "2^{10}", "3034/2",
    "\\frac{6}{4}", a list ("12, 13") unless the reference is one, other scripts' digits.
    """
    t = text.strip()
    if not t or len(t) > MAX_ANSWER_CHARS or not ascii_digits_only(t):
        return False
    frac = _FRACTION.fullmatch(t.strip("$ "))
    if frac and _INTEGER.fullmatch(frac.group(1).strip()) and _INTEGER.fullmatch(frac.group(2).strip()):
        return _reduced_fraction(frac.group(1), frac.group(2))
    for m in _LATEX_FRAC.finditer(t):
        if not _reduced_fraction(m.group(1), m.group(2)):
            return False
    if _ARITHMETIC.search(t):
        return False
    if ("," in t or ";" in t) and not _GROUPED.fullmatch(t) and "," not in answer and ";" not in answer:
        return False
    return True


def math_equal(extracted: str | None, answer: str, **_: Any) -> float:
    """math-verify: symbolic/numeric equivalence of the parsed answer and the parsed gold.

    The answer must be a value (`is_math_value`): math-verify would happily evaluate
    "37*41" and call it equal to 1517.
    """
    from math_verify import verify

    if extracted is None or not is_math_value(extracted, answer):
        return 0.0
    gold = _math_gold(answer)
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {answer!r}")
    pred = _math_parse(extracted)
    if not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=None))


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def regex(extracted: str | None, answer: str, **_: Any) -> float:
    """1 when the answer (a Python regular expression, no flags) fullmatches the extraction.

    The extraction is already stripped. Catastrophic patterns are contained by the scorer's
    per-sample timeout.
    """
    if extracted is None or len(extracted) > MAX_ANSWER_CHARS:
        return 0.0
    return float(_compiled(answer).fullmatch(extracted) is not None)


VERIFIERS: dict[str, Callable[..., float]] = {
    "exact": exact,
    "numeric": numeric,
    "math": math_equal,
    "regex": regex,
}


def _check_numeric(answer: str) -> None:
    if parse_number(answer) is None:
        raise ValueError(f"answer {answer!r} is not a number (numeric verifier)")


def _check_regex(answer: str) -> None:
    try:
        _compiled(answer)
    except re.error as exc:
        raise ValueError(f"answer {answer!r} is not a valid regular expression: {exc}") from None


# Cheap checks of reference answers at dataset build time, so bad data fails the job early
# instead of silently scoring 0. (math is left to scoring: parsing every gold is slow.)
ANSWER_CHECKS: dict[str, Callable[[str], None]] = {
    "numeric": _check_numeric,
    "regex": _check_regex,
}
