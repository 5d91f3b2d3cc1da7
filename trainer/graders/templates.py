"""Grader templates: `{{ item.answer }}`, `{{ item.a.b }}`, `{{ sample.output_json.x }}`.

OpenAI's graders fill their `input` / `reference` strings from two namespaces, `item` (the
dataset row) and `sample` (the model's output). Templates are parsed by jinja2's
SandboxedEnvironment and then checked node by node: only plain text and `{{ ... }}` outputs
of a dotted or subscripted path rooted at `item` or `sample` are allowed. No loops, filters,
calls or other names, so a template can neither run code nor burn CPU, and the fields it
reads are known before anything runs (a job whose dataset rows lack one is refused at
submission, naming the field).
"""
from __future__ import annotations

import functools
import json
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment

NAMESPACES = ("item", "sample")
MAX_TEMPLATE_CHARS = 64 * 1024


class TemplateError(ValueError):
    """A template that does not parse, or that uses more than `{{ item.x }}` paths."""


_ENV = SandboxedEnvironment(autoescape=False, keep_trailing_newline=True)


def _path(node: nodes.Node) -> tuple[str, ...]:
    """('item', 'a', 'b') for `item.a.b` / `item['a'].b`; TemplateError for anything else."""
    if isinstance(node, nodes.Name):
        if node.name not in NAMESPACES:
            raise TemplateError(f"unknown name {node.name!r}: templates may only use "
                                f"{' and '.join(NAMESPACES)}")
        return (node.name,)
    if isinstance(node, nodes.Getattr):
        return _path(node.node) + (node.attr,)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return _path(node.node) + (str(node.arg.value),)
    raise TemplateError(f"only {{{{ item.field }}}} and {{{{ sample.field }}}} paths are "
                        f"allowed in templates, not {type(node).__name__}")


@functools.lru_cache(maxsize=512)
def template_paths(source: str) -> tuple[tuple[str, ...], ...]:
    """The paths a template reads, each a tuple ('item', 'answer'); TemplateError if invalid."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"template longer than {MAX_TEMPLATE_CHARS} characters")
    try:
        tree = _ENV.parse(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error: {exc.message}") from None
    paths = []
    for node in tree.body:
        if not isinstance(node, nodes.Output):
            raise TemplateError("templates may not use {% ... %} statements")
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                continue
            paths.append(_path(child))
    return tuple(paths)


def item_fields(source: str) -> set[str]:
    """Top-level dataset fields a template reads (`item.a.b` -> 'a')."""
    return {p[1] for p in template_paths(source) if p[0] == "item" and len(p) > 1}


def _text(value: Any) -> str:
    # A dict or list is rendered as JSON (what a grader comparing structured output wants),
    # a missing value as the empty string (jinja's Undefined).
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else str(value)


@functools.lru_cache(maxsize=512)
def _compiled(source: str):
    template_paths(source)  # validate before jinja compiles anything
    return _ENV.from_string(source)


def render(source: str, item: dict, sample: dict) -> str:
    """The template filled from `item` and `sample` (only those two names exist)."""
    template = _compiled(source)
    if "{" not in source:
        return source
    context = {"item": _Namespace(item), "sample": _Namespace(sample)}
    return template.render(context)


class _Namespace:
    """Wraps a JSON value so `{{ x.y }}` renders dicts and lists as JSON, not Python repr."""

    __slots__ = ("_value",)

    def __init__(self, value: Any):
        self._value = value

    def _child(self, key: Any) -> Any:
        value = self._value
        if isinstance(value, dict):
            return _Namespace(value.get(key)) if key in value else _Namespace(None)
        if isinstance(value, list):
            try:
                return _Namespace(value[int(key)])
            except (ValueError, IndexError):
                return _Namespace(None)
        return _Namespace(None)

    __getattr__ = _child
    __getitem__ = _child

    def __str__(self) -> str:
        return _text(self._value)
