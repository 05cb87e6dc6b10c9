# SPDX-License-Identifier: Apache-2.0
"""`known_files`: official assets by digest, our stand-ins by registry, everything else an unknown file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from vllm_omni_token2wav import known_files
from vllm_omni_token2wav.file_identity import file_sha256
from vllm_omni_token2wav.known_files import KnownFile, identify_file, official_file, record_standin

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


#: The project cache as the session found it (the generated stand-ins other tests share).
PROJECT_CACHE = os.environ.get("VLLM_OMNI_TOKEN2WAV_CACHE_DIR")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry of the test's own."""
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path / "cache"))


def _pretend_official(monkeypatch: pytest.MonkeyPatch, path: Path) -> KnownFile:
    """Put `path`'s size and digest in the table, as the official campplus.onnx's would be."""
    row = KnownFile("official CosyVoice campplus.onnx", "campplus.onnx", path.stat().st_size, file_sha256(path), "test")
    monkeypatch.setattr(known_files, "KNOWN_FILES", (row,))
    return row


def test_the_table_holds_the_published_campplus_digest_and_size() -> None:
    row = official_file("campplus.onnx")
    assert row.size == 28_303_423
    assert row.sha256 == "a6ac6a63997761ae2997373e2ee1c47040854b4b759ea41ec48e4e42df0f4d73"
    assert row.label == "official CosyVoice campplus.onnx"
    with pytest.raises(KeyError, match="no official asset named 'flow.pt'; known: \\['campplus.onnx'\\]"):
        official_file("flow.pt")


def test_a_file_with_the_official_digest_is_labelled_official(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "campplus.onnx"
    path.write_bytes(b"the official bytes")
    _pretend_official(monkeypatch, path)
    origin = identify_file(path)
    assert (origin.kind, origin.label) == ("official", "official CosyVoice campplus.onnx")
    assert origin.describe().startswith("official CosyVoice campplus.onnx (sha256 ")


def test_same_size_other_content_is_an_unknown_file_not_official(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    official, other = tmp_path / "a.onnx", tmp_path / "campplus.onnx"
    official.write_bytes(b"the official bytes")
    other.write_bytes(b"the officiaL bytes")
    _pretend_official(monkeypatch, official)
    origin = identify_file(other)
    assert (origin.kind, origin.label) == ("unknown", "unknown file")
    assert origin.sha256 == file_sha256(other)


def test_a_registered_stand_in_is_recognised_also_as_a_copy_elsewhere(tmp_path: Path) -> None:
    made, copy = tmp_path / "made.onnx", tmp_path / "model" / "campplus.onnx"
    made.write_bytes(b"stand-in bytes")
    assert identify_file(made).label == "unknown file"
    record_standin(made, recipe="test recipe")
    copy.parent.mkdir()
    copy.write_bytes(made.read_bytes())
    origin = identify_file(copy)
    assert (origin.kind, origin.label, origin.detail) == ("stand-in", "stand-in", "test recipe")
    copy.write_bytes(b"stand-in byteZ")  # same size, other content
    assert identify_file(copy).label == "unknown file"


def test_a_size_no_known_file_has_is_labelled_without_hashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.onnx"
    path.write_bytes(b"x" * 1000)

    def no_hash(*args: object, **kwargs: object) -> None:
        raise AssertionError("hashed a file no known file has the size of")

    monkeypatch.setattr(known_files.FileIdentity, "of", no_hash)
    origin = identify_file(path)
    assert (origin.kind, origin.sha256) == ("unknown", None)
    assert origin.describe() == "unknown file (1000 bytes)"


def test_a_damaged_registry_costs_only_the_label(tmp_path: Path) -> None:
    path = tmp_path / "made.onnx"
    path.write_bytes(b"stand-in bytes")
    record_standin(path, recipe="r")
    (tmp_path / "cache" / "standins" / "registry.json").write_text("{not json")
    assert identify_file(path).label == "unknown file"
    record_standin(path, recipe="r")  # rewrites it
    assert identify_file(path).label == "stand-in"


def test_the_generated_campplus_stand_in_is_labelled_in_the_load_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The full-size stand-in from the project cache, where the other tests generate it once.
    if PROJECT_CACHE is None:
        monkeypatch.delenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR")
    else:
        monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", PROJECT_CACHE)
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.ort import OrtSpeakerEmbedding

    path = ensure_standin_campplus_onnx(seed=0)  # full size: the speaker path needs 192-d embeddings
    assert identify_file(path).label == "stand-in"
    with caplog.at_level(logging.INFO):
        _ = OrtSpeakerEmbedding(path, torch.device("cpu")).session
    assert any(", stand-in (sha256 " in r.getMessage() for r in caplog.records), caplog.text
