"""`multi` graders' `calculate_output`: a formula over sub-scores, parsed and walked safely.

OpenAI allows `+ - * / ^`, parentheses, numbers, the sub-graders' keys and the functions
`min max abs floor ceil exp sqrt log`. The formula is parsed by Python's own `ast` parser
(mode "eval") and then evaluated by walking the tree with a whitelist of node types: there
is no `eval`, no attribute access and no name outside the keys and those functions. `^` is
power, as in OpenAI's formulas (Python's parser reads it as XOR, the walker maps it).
Arithmetic is in floats, so `9^9^9` overflows into a FormulaError instead of a huge integer.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Callable, Iterable, Mapping

MAX_FORMULA_CHARS = 4096


class FormulaError(ValueError):
    """The formula does not parse or uses something outside the allowed grammar."""


class VariableError(FormulaError):
    """The formula names a key that is not a sub-grader."""


def _pow(a: float, b: float) -> float:
    return math.pow(a, b)


_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: _pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min, "max": max, "abs": abs, "floor": math.floor, "ceil": math.ceil,
    "exp": math.exp, "sqrt": math.sqrt, "log": math.log,
}
_ARITY = {"min": None, "max": None, "abs": 1, "floor": 1, "ceil": 1, "exp": 1, "sqrt": 1,
          "log": (1, 2)}


def parse(formula: str) -> ast.Expression:
    """The parsed formula; FormulaError if it is not in the grammar (checked without names)."""
    if not isinstance(formula, str) or not formula.strip():
        raise FormulaError("calculate_output is empty")
    if len(formula) > MAX_FORMULA_CHARS:
        raise FormulaError(f"calculate_output is longer than {MAX_FORMULA_CHARS} characters")
    try:
        tree = ast.parse(formula.strip().replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise FormulaError(f"calculate_output does not parse: {exc}") from None
    _check(tree.body)
    return tree


def _check(node: ast.AST) -> None:
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check(node.left), _check(node.right)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check(node.operand)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise FormulaError(f"only numbers are allowed as constants, not {node.value!r}")
    elif isinstance(node, ast.Name):
        pass
    elif isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in FUNCTIONS or node.keywords:
            raise FormulaError(f"unknown function in calculate_output; allowed: "
                               f"{', '.join(FUNCTIONS)}")
        arity = _ARITY[name]
        count = len(node.args)
        ok = (count >= 1 if arity is None else
              count in arity if isinstance(arity, tuple) else count == arity)
        if not ok:
            raise FormulaError(f"{name}() called with {count} arguments")
        for arg in node.args:
            _check(arg)
    else:
        raise FormulaError(f"calculate_output may use numbers, grader keys, + - * / ^, "
                           f"parentheses and {', '.join(FUNCTIONS)}; found "
                           f"{type(node).__name__}")


def names(tree: ast.Expression) -> set[str]:
    """The variable names a parsed formula reads (function names excluded)."""
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in calls}


def check_names(formula: str, keys: Iterable[str]) -> None:
    """FormulaError / VariableError unless `formula` parses and names only `keys`."""
    unknown = sorted(names(parse(formula)) - set(keys))
    if unknown:
        raise VariableError(f"calculate_output names {', '.join(unknown)}, which "
                            f"{'is not a grader key' if len(unknown) == 1 else 'are not grader keys'}"
                            f" (keys: {', '.join(sorted(keys))})")


def evaluate(formula: str, values: Mapping[str, float]) -> float:
    """The formula's value over `values`; FormulaError on a math error (log(0), overflow)."""
    tree = parse(formula)
    try:
        result = float(_eval(tree.body, values))
    except VariableError:
        raise
    except (ArithmeticError, ValueError) as exc:
        raise FormulaError(f"calculate_output failed: {exc}") from None
    if not math.isfinite(result):
        raise FormulaError("calculate_output is not a finite number")
    return result


def _eval(node: ast.AST, values: Mapping[str, float]) -> float:
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise VariableError(f"calculate_output names {node.id!r}, which is not a grader key")
        return float(values[node.id])
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    return float(FUNCTIONS[node.func.id](*(_eval(a, values) for a in node.args)))
