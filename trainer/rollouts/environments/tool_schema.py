"""Tool schemas from a tenant's Python source, read with `ast` (the source is never run here).

A `type: tools` environment's `tools` text defines plain functions; every public top-level
function (no leading underscore) is a tool. Its OpenAI function schema comes from

- the signature: each parameter is a property; one without a default is required, one with
  a literal default (`3`, `"x"`, `None`, `[]`) is optional and its default is shown;
- the type hints, which every parameter must have: `str`, `int`, `float`, `bool`, `list[X]`
  (`List[X]`, `tuple[X, ...]`, `set[X]`), `dict[str, X]` (`Dict`), `X | None` (`Optional[X]`),
  `X | Y` (`Union`), `Literal["a", "b"]` and `Any`; anything else (a class of the tenant's
  own, `*args`, `**kwargs`, a keyword-only marker is fine) is refused with its name;
- the docstring: its first paragraph is the tool's description, and an `Args:` (Google) or
  `:param x:` (Sphinx) section describes the parameters.

`schemas(source)` returns them or raises `ToolSourceError` naming the problem (a syntax error
with its line, no public function, a parameter without a hint or of an unsupported type, a
name the code interpreter takes). `validate_arguments(schema, arguments)` checks a call's
arguments against its schema in the trainer process, so a malformed call never costs a
sandbox trip: the error text is what the model reads.
"""
from __future__ import annotations

import ast
import keyword
import re
from typing import Any

MAX_SOURCE_BYTES = 256 * 1024   # OpenAI's limit on a python grader's source
MAX_TOOLS = 64
PYTHON_TOOL = "python"          # the code interpreter's tool name

_SCALARS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
_LISTS = {"list", "List", "tuple", "Tuple", "set", "Set", "frozenset", "FrozenSet",
          "Sequence", "Iterable"}
_DICTS = {"dict", "Dict", "Mapping"}


class ToolSourceError(ValueError):
    """The tools source cannot make tools; the message names the problem."""


PYTHON_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PYTHON_TOOL,
        "description": ("Run Python code and return what it prints (stdout, then stderr). "
                        "Variables, functions and imports persist between calls of this "
                        "conversation. The value of a final expression is printed."),
        "parameters": {"type": "object",
                       "properties": {"code": {"type": "string",
                                               "description": "the Python code to run"}},
                       "required": ["code"], "additionalProperties": False},
    },
}


def _name(node: ast.AST) -> str | None:
    """`str` or `typing.List` -> the last name; anything else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id in ("typing", "t", "collections", "abc"):
        return node.attr
    return None


def _type(node: ast.AST | None, where: str) -> dict[str, Any]:
    """The JSON schema of one annotation."""
    if node is None:
        raise ToolSourceError(f"{where} has no type hint (str, int, float, bool, list[...], "
                              "dict[str, ...], Literal[...], or X | None)")
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:  # a string annotation ("list[int]")
            return _type(ast.parse(node.value, mode="eval").body, where)
        except SyntaxError:
            raise ToolSourceError(f"{where}: cannot read the type hint {node.value!r}") from None
    if isinstance(node, ast.Constant) and node.value is None:
        return {"type": "null"}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([node.left, node.right], where)
    name = _name(node)
    if name is not None:
        if name in _SCALARS:
            return {"type": _SCALARS[name]}
        if name in _LISTS:
            return {"type": "array"}
        if name in _DICTS:
            return {"type": "object"}
        if name == "Any":
            return {}
        raise ToolSourceError(f"{where} has the unsupported type {name!r} (use str, int, "
                              "float, bool, list[...], dict[str, ...], Literal[...], "
                              "X | None or Any)")
    if isinstance(node, ast.Subscript):
        base = _name(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base in _LISTS:
            items = [a for a in args if not (isinstance(a, ast.Constant) and a.value is ...)]
            if base in ("tuple", "Tuple") and len(items) > 1:
                return {"type": "array", "prefixItems": [_type(a, where) for a in items],
                        "minItems": len(items), "maxItems": len(items)}
            return {"type": "array", **({"items": _type(items[0], where)} if items else {})}
        if base in _DICTS:
            if len(args) != 2:
                raise ToolSourceError(f"{where}: dict needs two type arguments")
            key = _type(args[0], where)
            if key.get("type") != "string":
                raise ToolSourceError(f"{where}: a dict's keys must be str (JSON objects)")
            return {"type": "object", "additionalProperties": _type(args[1], where)}
        if base == "Optional":
            return _union([args[0], ast.Constant(None)], where)
        if base == "Union":
            return _union(args, where)
        if base == "Literal":
            values = []
            for a in args:
                if not isinstance(a, ast.Constant) or not isinstance(
                        a.value, (str, int, float, bool)):
                    raise ToolSourceError(f"{where}: Literal takes str, int, float or bool "
                                          "values")
                values.append(a.value)
            return {"enum": values}
        if base == "Annotated" and args:
            return _type(args[0], where)
    raise ToolSourceError(f"{where} has an unsupported type hint {ast.unparse(node)!r}")


def _union(nodes: list[ast.AST], where: str) -> dict[str, Any]:
    options: list[dict[str, Any]] = []
    for node in nodes:
        schema = _type(node, where)
        for one in schema.get("anyOf", [schema]):
            if one not in options:
                options.append(one)
    if any(o == {} for o in options):
        return {}
    types = [o.get("type") for o in options]
    if all(isinstance(t, str) and len(o) == 1 for t, o in zip(types, options)):
        return {"type": types if len(types) > 1 else types[0]}
    return {"anyOf": options}


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:\s*$")
_SECTION = re.compile(r"^\s*(Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_SPHINX = re.compile(r"^\s*:param\s+(?:\w+\s+)?(\w+)\s*:\s*(.*)$")


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) of a docstring."""
    lines = doc.splitlines()
    params: dict[str, str] = {}
    body: list[str] = []
    in_args, current, indent = False, None, None
    for line in lines:
        sphinx = _SPHINX.match(line)
        if sphinx:
            current, in_args = sphinx.group(1), False
            params[current] = sphinx.group(2).strip()
            continue
        if _ARGS_HEADER.match(line):
            in_args, current, indent = True, None, None
            continue
        if _SECTION.match(line) or line.strip().startswith((":return", ":raises", ":rtype")):
            in_args, current = False, None
            continue
        if in_args:
            if not line.strip():
                continue
            level = len(line) - len(line.lstrip())
            entry = re.match(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
            if entry and (indent is None or level <= indent):
                indent, current = level, entry.group(1)
                params[current] = entry.group(3).strip()
            elif current is not None:
                params[current] = (params[current] + " " + line.strip()).strip()
            continue
        if current is not None and line.strip() and not in_args:
            if line.startswith((" ", "\t")):
                params[current] = (params[current] + " " + line.strip()).strip()
                continue
            current = None
        if current is None:
            body.append(line)
    paragraphs = "\n".join(body).strip().split("\n\n")
    description = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""
    return description, params


def _default(node: ast.AST, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise ToolSourceError(f"{where}: its default must be a literal "
                              f"(not {ast.unparse(node)!r})") from None


def _function_schema(fn: ast.FunctionDef) -> dict[str, Any]:
    where = f"tool {fn.name}()"
    a = fn.args
    if a.vararg is not None or a.kwarg is not None:
        star = f"*{a.vararg.arg}" if a.vararg is not None else f"**{a.kwarg.arg}"
        raise ToolSourceError(f"{where} takes {star}: a tool's parameters must be named")
    if a.posonlyargs:
        raise ToolSourceError(f"{where} has positional-only parameters: the model passes "
                              "arguments by name")
    description, docs = _docstring(ast.get_docstring(fn) or "")
    positional = list(a.args)
    defaults: dict[str, ast.AST] = dict(zip([p.arg for p in positional[len(positional)
                                                                       - len(a.defaults):]],
                                            a.defaults))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        if d is not None:
            defaults[p.arg] = d
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in positional + list(a.kwonlyargs):
        pwhere = f"parameter {p.arg!r} of {where}"
        schema = dict(_type(p.annotation, pwhere))
        if p.arg in docs and docs[p.arg]:
            schema["description"] = docs[p.arg]
        if p.arg in defaults:
            value = _default(defaults[p.arg], pwhere)
            if value is None or isinstance(value, (str, int, float, bool, list, dict)):
                schema["default"] = value
        else:
            required.append(p.arg)
        properties[p.arg] = schema
    return {"type": "function",
            "function": {"name": fn.name, "description": description,
                         "parameters": {"type": "object", "properties": properties,
                                        "required": required,
                                        "additionalProperties": False}}}


def schemas(source: str | None, code_interpreter: bool = False) -> list[dict[str, Any]]:
    """The OpenAI function schemas of `source`'s public functions (and the `python` tool
    when `code_interpreter`), in source order; ToolSourceError names what is wrong."""
    out: list[dict[str, Any]] = []
    if source is not None:
        if not isinstance(source, str):
            raise ToolSourceError("tools must be Python source text")
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > MAX_SOURCE_BYTES:
            raise ToolSourceError(f"tools source is {size} bytes; at most {MAX_SOURCE_BYTES}")
        try:
            # Parsing, not running: the tenant's code only ever runs in the sandbox.
            tree = ast.parse(source, "tools.py")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            line = getattr(exc, "lineno", None)
            raise ToolSourceError(f"tools source does not compile"
                                  f"{f' (line {line})' if line else ''}: "
                                  f"{getattr(exc, 'msg', exc)}") from None
        seen: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.AsyncFunctionDef) and not node.name.startswith("_"):
                raise ToolSourceError(f"tool {node.name}() is async: tools are plain functions")
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            if node.name in seen:
                raise ToolSourceError(f"tool {node.name}() is defined twice")
            if code_interpreter and node.name == PYTHON_TOOL:
                raise ToolSourceError("a tool named python clashes with the code interpreter's "
                                      "tool (rename it, or set code_interpreter: false)")
            seen.add(node.name)
            out.append(_function_schema(node))
    if code_interpreter:
        out.append(PYTHON_TOOL_SCHEMA)
    if not out:
        raise ToolSourceError("no tools: the tools source defines no public function (a "
                              "top-level def whose name does not start with _) and "
                              "code_interpreter is off")
    if len(out) > MAX_TOOLS:
        raise ToolSourceError(f"{len(out)} tools; at most {MAX_TOOLS}")
    return out


# ------------------------------------------------------------------ checking a call

def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _matches(value: Any, schema: dict[str, Any], path: str) -> str | None:
    """Why `value` does not fit `schema` (None: it fits); only the subset `_type` writes."""
    if "anyOf" in schema:
        if any(_matches(value, s, path) is None for s in schema["anyOf"]):
            return None
        return f"{path} does not match any of its allowed types"
    if "enum" in schema:
        if any(value == v and type(value) is type(v) for v in schema["enum"]):
            return None
        return f"{path} must be one of {schema['enum']!r}, not {value!r}"[:300]
    want = schema.get("type")
    if want is None:
        return None
    wants = want if isinstance(want, list) else [want]
    kind = _kind(value)
    if kind not in wants and not (kind == "integer" and "number" in wants):
        return f"{path} must be {' or '.join(wants)}, not {kind}"
    if kind == "array":
        if "prefixItems" in schema:
            if len(value) != len(schema["prefixItems"]):
                return f"{path} must have {len(schema['prefixItems'])} items"
            for n, (v, s) in enumerate(zip(value, schema["prefixItems"])):
                why = _matches(v, s, f"{path}[{n}]")
                if why:
                    return why
        elif "items" in schema:
            for n, v in enumerate(value):
                why = _matches(v, schema["items"], f"{path}[{n}]")
                if why:
                    return why
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        for k, v in value.items():
            why = _matches(v, schema["additionalProperties"], f"{path}[{k!r}]")
            if why:
                return why
    return None


def validate_arguments(schema: dict[str, Any], arguments: Any) -> str | None:
    """Why `arguments` is not a valid call of the tool `schema` (None: it is)."""
    fn = schema["function"]
    params = fn["parameters"]
    if not isinstance(arguments, dict):
        return f"the arguments of {fn['name']} must be a JSON object, not {_kind(arguments)}"
    unknown = [k for k in arguments if k not in params["properties"]]
    if unknown:
        return (f"{fn['name']} has no parameter {unknown[0]!r} (its parameters: "
                f"{', '.join(params['properties']) or 'none'})")
    missing = [k for k in params["required"] if k not in arguments]
    if missing:
        return f"{fn['name']} is missing the required argument {missing[0]!r}"
    for key, value in arguments.items():
        why = _matches(value, params["properties"][key], key)
        if why:
            return f"bad argument for {fn['name']}: {why}"
    return None


def is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)
