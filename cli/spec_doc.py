"""docs/jobspec.md, generated: the job spec's reference written from its JSON Schema.

The schema (`trainer.spec.json_schema`, pydantic's) already holds every field's type, bounds,
default and description, so the reference is a walk over it: one table per object, in the
order a spec file reads (`model`, `task`, `task.reasoning_gym`, ...). Defaults made by a
default factory (lists, nested objects) are not in pydantic's schema; they are read from the
model classes. `brorl schema --markdown` prints the result and `make docs` writes it; a test
fails when the committed file differs.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined, to_jsonable_python

REGENERATE = "brorl schema --markdown -o docs/jobspec.md"  # or: make docs

_INTRO = f"""\
# The job spec reference

<!-- Generated from trainer/spec.py by `{REGENERATE}` (or `make docs`); do not edit. -->

A job is one YAML or JSON document, validated by one pydantic model (`trainer/spec.py`): the
API's request body, the JSON stored with the job, the worker's input and the trainer's config.
Unknown fields are errors, as are NaN and Infinity anywhere; each violation is a 422 (or, in
`brorl train`, an error line) naming the field by its dotted path, such as
`rollout.schedule.0.n`. Only `name` and `task` are required. The machine-readable form of
this page is [`jobspec.schema.json`](jobspec.schema.json) (`brorl schema`); examples are in
[`examples/`](../examples/). Ranges read `a .. b` (both included); `>` and `<` exclude the bound.
"""


def _ref_name(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None


def _non_null(node: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the node without its `null` alternative, whether null is allowed)."""
    options = node.get("anyOf")
    if not options:
        return node, False
    rest = [o for o in options if o.get("type") != "null"]
    nullable = len(rest) < len(options)
    if len(rest) == 1:
        return {**rest[0], **{k: v for k, v in node.items() if k != "anyOf"}}, nullable
    return {**node, "anyOf": rest}, nullable


def _code(value: Any) -> str:
    return f"`{json.dumps(value, separators=(', ', ': '))}`"


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else f"{value:g}"


def _bounds(node: dict[str, Any]) -> list[str]:
    """The bounds of one node: `1 .. 32`, `> 0, .. 2`, `one of a, b`, `1 .. 16 items`, ..."""
    out = []
    if "const" in node:
        out.append(f"only {_code(node['const'])}")
    if "enum" in node:
        out.append("one of " + ", ".join(_code(v) for v in node["enum"]))
    low = ("", node["minimum"]) if "minimum" in node else (">", node.get("exclusiveMinimum"))
    high = ("", node["maximum"]) if "maximum" in node else ("<", node.get("exclusiveMaximum"))
    if low[1] is not None and high[1] is not None and not low[0] and not high[0]:
        out.append(f"{_number(low[1])} .. {_number(high[1])}")
    else:
        if low[1] is not None:
            out.append(f"{low[0] or '≥'} {_number(low[1])}")
        if high[1] is not None:
            out.append(f"{high[0] or '≤'} {_number(high[1])}")
    for kind, unit in (("Length", "characters"), ("Items", "items")):
        lo, hi = node.get(f"min{kind}"), node.get(f"max{kind}")
        if lo is not None and hi is not None and lo == hi:
            out.append(f"exactly {lo} {unit}")
        elif hi is not None:
            out.append(f"{lo or 0} .. {_number(hi)} {unit}")
        elif lo:
            out.append(f"at least {lo} {unit}")
    if "pattern" in node:
        out.append(f"matches `{node['pattern']}`")
    return out


class _Walk:
    """Collects one section per object of the schema, depth first in field order."""

    def __init__(self, schema: dict[str, Any], defaults: dict[str, dict[str, Any]]):
        self.defs = schema.get("$defs", {})
        self.defaults = defaults
        self.sections: list[str] = []

    def _type(self, node: dict[str, Any], path: str, children: list[tuple[str, str]]) -> str:
        """A short type name for `node`; objects it refers to are queued in `children`."""
        node, nullable = _non_null(node)
        if name := _ref_name(node):
            children.append((path, name))
            text = f"object ([`{path}`](#{_anchor(path)}))"
        elif "anyOf" in node:
            text = " or ".join(_code(o["const"]) if "const" in o else self._type(o, path, children)
                               for o in node["anyOf"])
        elif node.get("type") == "array" and "prefixItems" in node:
            text = "[" + ", ".join(self._type(i, path, children) for i in node["prefixItems"]) + "]"
        elif node.get("type") == "array":
            item = node.get("items", {})
            item_path = f"{path}[]" if _ref_name(item) else path
            text = f"list of {self._type(item, item_path, children)}"
        else:
            text = {"integer": "int", "number": "number", "string": "string", "boolean": "bool",
                    "object": "object"}.get(node.get("type", ""), node.get("type", "any"))
        return f"{text} or null" if nullable else text

    def _allowed(self, node: dict[str, Any]) -> str:
        node, _ = _non_null(node)
        parts = _bounds(node)
        for option in node.get("anyOf", []):
            parts += [b for b in _bounds(option) if not b.startswith("only")]
        parts = [", ".join(parts)] if parts else []
        if node.get("type") == "array":
            for i, item in enumerate(node.get("prefixItems", [])):
                if bounds := _bounds(item):
                    parts.append(f"item {i + 1}: {', '.join(bounds)}")
            if "items" in node and not _ref_name(node["items"]) and (bounds := _bounds(node["items"])):
                parts.append(f"each {', '.join(bounds)}")
        return "; ".join(parts) or "-"

    def _default(self, def_name: str | None, field: str, node: dict[str, Any], required: bool) -> str:
        if required:
            return "**required**"
        value = node.get("default", self.defaults.get(def_name or "", {}).get(field, PydanticUndefined))
        if value is PydanticUndefined:
            return "-"
        target, _ = _non_null(node)
        if isinstance(value, dict) and _ref_name(target):
            return "(its defaults)"
        return _code(value)

    def section(self, path: str, obj: dict[str, Any], def_name: str | None) -> None:
        children: list[tuple[str, str]] = []
        rows = ["| field | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
        required = set(obj.get("required", []))
        for field, node in obj.get("properties", {}).items():
            child = f"{path}.{field}" if path else field
            rows.append("| " + " | ".join([
                f"`{field}`", self._type(node, child, children),
                self._default(def_name, field, node, field in required), self._allowed(node),
                _cell(node.get("description", "")),
            ]) + " |")
        heading = f"## `{path}`" if path else "## The top level"
        about = obj.get("description", "") if path else ""
        self.sections.append("\n".join([heading, "", *([_paragraph(about), ""] if about else []), *rows]))
        for child_path, name in children:
            self.section(child_path, self.defs[name], name)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _paragraph(text: str) -> str:
    return " ".join(text.split())


def _anchor(path: str) -> str:
    """GitHub's anchor of the heading "## `path`"."""
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def factory_defaults(root: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """{class name: {field: JSON default}} for the fields whose default comes from a factory."""
    out: dict[str, dict[str, Any]] = {}
    seen: set[type] = set()

    def visit(cls: type[BaseModel]) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for name, field in cls.model_fields.items():
            if field.default_factory is not None:
                out.setdefault(cls.__name__, {})[name] = to_jsonable_python(
                    field.get_default(call_default_factory=True))
            for sub in _models_in(field.annotation):
                visit(sub)

    visit(root)
    return out


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


def spec_markdown() -> str:
    """docs/jobspec.md's text for the current JobSpec."""
    from trainer.spec import JobSpec, json_schema

    schema = json_schema()
    walk = _Walk(schema, factory_defaults(JobSpec))
    walk.section("", schema, schema.get("title"))
    about = _paragraph(schema.get("description", ""))
    return "\n\n".join([_INTRO.rstrip("\n"), about, *walk.sections]) + "\n"
