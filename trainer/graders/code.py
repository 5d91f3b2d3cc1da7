"""The `code` grader's trusted half: extract the program, split the tests, judge the outputs.

A test is either `{"stdin": ..., "stdout": ...}` or an assert against a function the
program defines: `"assert add(1, 2) == 3"`, `"assert is_prime(7)"`, `"assert not f(4)"`
(also given as `{"assert": ...}`). The split is the point: only the program and the test's
*input* (the stdin text, or the call expression `add(1, 2)`) go into the sandbox; the
expected value stays here, and the comparison happens here, in the caller. So a program can
print, patch, exit or crash however it likes inside its sandbox: it cannot see the expected
answers or write its own verdict.
"""
from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)
MAX_TESTS = 64
MAX_PROGRAM_CHARS = 64 * 1024


class TestSpecError(ValueError):
    """A dataset row's tests are not in a form the code grader understands."""


@dataclass(frozen=True)
class Test:
    sandbox: dict  # what the program sees: {"stdin": s} or {"call": expr, "truth": bool}
    expected: Any  # stdout text, the expected value, or True/False for a truth test
    kind: str      # "stdio" | "value" | "truth"


def extract_program(text: str) -> str:
    """The last ```python (or unlabelled) fenced block, else the whole text."""
    blocks = [(lang.lower(), body) for lang, body in FENCE.findall(text)]
    for lang, body in reversed(blocks):
        if lang in ("", "python", "py", "python3"):
            return body
    return text


def _parse_assert(source: str) -> Test:
    try:
        tree = ast.parse(source.strip())
    except SyntaxError as exc:
        raise TestSpecError(f"test {source!r} does not parse: {exc.msg}") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise TestSpecError(f"test {source!r} must be a single assert statement")
    expr = tree.body[0].test
    if (isinstance(expr, ast.Compare) and len(expr.ops) == 1
            and isinstance(expr.ops[0], ast.Eq)):
        try:
            expected = ast.literal_eval(expr.comparators[0])
        except (ValueError, TypeError, SyntaxError, RecursionError):
            raise TestSpecError(f"test {source!r}: the right side of == must be a literal") \
                from None
        return Test({"call": ast.unparse(expr.left), "truth": False}, _jsonable(expected),
                    "value")
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return Test({"call": ast.unparse(expr.operand), "truth": True}, False, "truth")
    return Test({"call": ast.unparse(expr), "truth": True}, True, "truth")


def parse_tests(tests: Any, field: str = "tests") -> list[Test]:
    """The tests of one dataset row; TestSpecError naming the field if malformed."""
    if not isinstance(tests, list) or not tests:
        raise TestSpecError(f"item.{field} must be a non-empty list of tests")
    if len(tests) > MAX_TESTS:
        raise TestSpecError(f"item.{field} has {len(tests)} tests; at most {MAX_TESTS}")
    out = []
    for i, test in enumerate(tests):
        if isinstance(test, str):
            test = {"assert": test}
        if not isinstance(test, dict):
            raise TestSpecError(f"item.{field}[{i}] must be an assert string or an object")
        if "assert" in test and isinstance(test["assert"], str):
            try:
                out.append(_parse_assert(test["assert"]))
            except TestSpecError as exc:
                raise TestSpecError(f"item.{field}[{i}]: {exc}") from None
        elif isinstance(test.get("stdin", ""), str) and isinstance(test.get("stdout"), str):
            out.append(Test({"stdin": test.get("stdin", "")}, test["stdout"], "stdio"))
        else:
            raise TestSpecError(f"item.{field}[{i}] needs 'stdout' (and 'stdin') strings, "
                                f"or an 'assert'")
    return out


def _jsonable(value: Any) -> Any:
    """A literal as it looks after a JSON round trip (tuples -> lists), to compare with."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        raise TestSpecError(f"expected value {value!r} is not JSON-representable") from None


def _normal_text(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _equal(got: Any, expected: Any) -> bool:
    if isinstance(expected, float) or isinstance(got, float):
        if isinstance(got, bool) or isinstance(expected, bool):
            return got is expected
        if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
            return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
        return False
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(map(_equal, got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(_equal(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected


def passed(test: Test, result: Any) -> bool:
    """Whether one raw result from the sandbox passes `test` (judged here, outside it)."""
    if not isinstance(result, dict) or result.get("error") is not None:
        return False
    if test.kind == "stdio":
        out = result.get("stdout")
        return isinstance(out, str) and _normal_text(out) == _normal_text(test.expected)
    if "value" not in result:
        return False
    if test.kind == "truth":
        return result["value"] is test.expected
    return _equal(result["value"], test.expected)
