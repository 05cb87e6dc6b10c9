# SPDX-License-Identifier: Apache-2.0
"""hyperpyyaml read as data: tags become records, `!ref` arithmetic is evaluated safely, nothing is imported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_omni_token2wav.model_executor.model_loader.tagged_yaml import Tagged, read_tagged_yaml, resolve_refs

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

TEXT = """\
chunk_size: 25
token_mel_ratio: 2
nested:
    width: 80
seed: !apply:somepkg_never_imported.seed [1986]
model: !new:somepkg_never_imported.Model
    size: !ref <nested.width>
    chunk: !ref <chunk_size> * <token_mel_ratio>
    mixed: !ref (<chunk_size> + 5) // 4 - <token_mel_ratio>
    alias: !ref <nested>
    items: [!ref <chunk_size>, 3]
"""


def test_tags_are_records_with_lines_and_nothing_named_is_imported() -> None:
    source, doc = read_tagged_yaml(TEXT, "test.yaml")
    assert source == "<test.yaml text>"
    assert doc["seed"] == Tagged("!apply:somepkg_never_imported.seed", [1986], 5)
    model = doc["model"]
    assert isinstance(model, Tagged) and model.tag == "!new:somepkg_never_imported.Model" and model.line == 6
    assert "somepkg_never_imported" not in sys.modules


def test_refs_resolve_to_values_and_arithmetic() -> None:
    source, doc = read_tagged_yaml(TEXT, "test.yaml")
    model = resolve_refs(doc["model"], doc, source)
    assert model.value == {"size": 80, "chunk": 50, "mixed": 5, "alias": {"width": 80}, "items": [25, 3]}


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        ("<missing>", "names no entry"),
        ("<chunk_size> ** 2", "not arithmetic"),
        ("<chunk_size>.__class__", "cannot parse|not arithmetic"),
        ("__import__('os')", "holds no <reference>"),
        ("<nested> * 2", "arithmetic needs numbers"),
        ("<loop>", "chain longer"),
    ],
)
def test_bad_refs_are_errors_naming_the_expression(expr: str, match: str) -> None:
    source, doc = read_tagged_yaml(f"chunk_size: 25\nnested: {{a: 1}}\nloop: !ref <loop>\nx: !ref {expr}\n", "t.yaml")
    with pytest.raises(ValueError, match=match):
        resolve_refs(doc["x"], doc, source)


def test_paths_and_parse_errors(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: !ref <b>\nb: 1\n")
    source, doc = read_tagged_yaml(path, "c.yaml")
    assert source == str(path) and resolve_refs(doc, doc, source) == {"a": 1, "b": 1}
    with pytest.raises(FileNotFoundError, match="c.yaml not found"):
        read_tagged_yaml(tmp_path / "missing.yaml", "c.yaml")
    with pytest.raises(ValueError, match="not valid YAML"):
        read_tagged_yaml("a: [1,\nb: 2\n", "c.yaml")
