# SPDX-License-Identifier: Apache-2.0
"""Read hyperpyyaml files as plain data, never importing or calling what their tags name.

Model directories keep their hyperparameters in hyperpyyaml (`flow.yaml` of Step-Audio2 / MiniCPM-o,
`cosyvoice3.yaml` of Fun-CosyVoice3). Its tags (`!new:pkg.Class`, `!name:pkg.fn`, `!apply:random.seed`,
`!ref <key>`) make hyperpyyaml import and call Python objects, and a shipped file also describes parts
the stage never builds (the LLM, training losses). The in-tree readers need only numbers, so this
module parses with PyYAML's safe loader and turns every tagged node into a `Tagged(tag, value, line)`
record; nothing named in a file is ever imported. Each family's reader walks the part it needs and
maps the few tags it knows to its own classes or config dataclasses, rejecting any other tag there.

`!ref` is resolved on request (`resolve_refs`) with the subset the shipped files use: `<key>` or
`<key.sub>` references to other entries of the document, and arithmetic on references and numbers
(`<chunk_size> * <token_mel_ratio>`), evaluated by a small AST walker (+ - * / // % and parentheses on
int/float only), never by `eval`.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REF_TAG = "!ref"

_REF = re.compile(r"<([^<>]+)>")
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_REF_DEPTH = 32


@dataclass(frozen=True)
class Tagged:
    """A tagged YAML node kept as data: `tag` as written (`!new:cosyvoice.flow.flow.X`), its value, 1-based line."""

    tag: str
    value: Any
    line: int


class _TaggedLoader(yaml.SafeLoader):
    """Safe loader whose only extension is turning any `!tag` into a `Tagged` record."""


def _construct_tagged(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> Tagged:
    value: Any
    if isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)  # type: ignore[arg-type]
    return Tagged("!" + tag_suffix, value, node.start_mark.line + 1)


_TaggedLoader.add_multi_constructor("!", _construct_tagged)


def read_tagged_yaml(text_or_path: str | Path, what: str) -> tuple[str, Any]:
    """Parse a hyperpyyaml path (or its text) into `(source name, document)` with `Tagged` nodes.

    `what` names the expected file in errors (`"flow.yaml"`). A str without a newline is a path.
    """
    if isinstance(text_or_path, Path) or "\n" not in text_or_path:
        path = Path(text_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"{what} not found: {path}")
        source, text = str(path), path.read_text()
    else:
        source, text = f"<{what} text>", text_or_path
    try:
        doc = yaml.load(text, Loader=_TaggedLoader)  # noqa: S506 - SafeLoader subclass, tags become data
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from exc
    return source, doc


def _lookup(root: Mapping[str, Any], name: str, source: str, line: int) -> Any:
    node: Any = root
    for part in name.strip().split("."):
        if isinstance(node, Tagged):
            node = node.value
        if not isinstance(node, Mapping) or part not in node:
            raise ValueError(f"{source}: line {line}: !ref <{name}> names no entry of the document")
        node = node[part]
    return node


def _evaluate(expr: str, values: dict[str, Any], source: str, line: int) -> Any:
    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        raise ValueError(
            f"{source}: line {line}: !ref {expr!r} is not arithmetic on numbers and references "
            "(the in-tree reader supports + - * / // % and parentheses)"
        )

    try:
        return walk(ast.parse(expr, mode="eval"))
    except SyntaxError as exc:
        raise ValueError(f"{source}: line {line}: cannot parse !ref {expr!r}: {exc.msg}") from exc


def _resolve_ref(node: Tagged, root: Mapping[str, Any], source: str, depth: int) -> Any:
    if depth > _MAX_REF_DEPTH:
        raise ValueError(f"{source}: line {node.line}: !ref chain longer than {_MAX_REF_DEPTH} (a cycle?)")
    expr = str(node.value).strip()
    names = _REF.findall(expr)
    if not names:
        raise ValueError(f"{source}: line {node.line}: !ref {expr!r} holds no <reference>")
    resolved = {name: _resolve(_lookup(root, name, source, node.line), root, source, depth + 1) for name in names}
    if _REF.fullmatch(expr):  # a bare reference keeps the referenced value's type (mapping, list, str, ...)
        return resolved[names[0]]
    values: dict[str, Any] = {}
    for index, name in enumerate(names):
        value = resolved[name]
        if type(value) not in (int, float):
            raise ValueError(
                f"{source}: line {node.line}: !ref {expr!r}: <{name}> is {value!r}; arithmetic needs numbers"
            )
        values[f"_ref{index}"] = value
    python = _REF.sub(lambda m: f"_ref{names.index(m.group(1))}", expr)
    return _evaluate(python, values, source, node.line)


def _resolve(node: Any, root: Mapping[str, Any], source: str, depth: int) -> Any:
    if isinstance(node, Tagged):
        if node.tag == REF_TAG:
            return _resolve_ref(node, root, source, depth)
        return Tagged(node.tag, _resolve(node.value, root, source, depth), node.line)
    if isinstance(node, dict):
        return {key: _resolve(value, root, source, depth) for key, value in node.items()}
    if isinstance(node, list):
        return [_resolve(value, root, source, depth) for value in node]
    return node


def resolve_refs(node: Any, root: Mapping[str, Any], source: str) -> Any:
    """A copy of `node` with every `!ref` replaced by its value (looked up in `root`, the whole document)."""
    return _resolve(node, root, source, 0)
