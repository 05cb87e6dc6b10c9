# SPDX-License-Identifier: Apache-2.0
"""What every CAM++ speaker-embedding backend is: the `SpeakerEmbeddingBackend` Protocol.

The backends (`ort.py`, `torch_backend.py`, `graphed.py`, `trt.py`) and the one function that picks
among them (`selection.py`) all depend on this module and on nothing of each other, so a backend can
be read, tested and replaced alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class SpeakerEmbeddingBackend(Protocol):
    """A CAM++ speaker-embedding runner.

    `backend(feat)` takes the mean-normalised Kaldi fbank of one utterance, `[T, 80]` float32 (any
    device), and returns the embedding `[1, 192]` float32 on `backend.device` (the facade's device).
    `name` identifies the backend and its device for logs, reports and cache keys, e.g.
    `"onnxruntime-cpu"`, `"torch-npu:0"`, `"tensorrt-cuda:0"`.
    """

    @property
    def name(self) -> str: ...

    @property
    def device(self) -> torch.device: ...

    def __call__(self, feat: torch.Tensor) -> torch.Tensor: ...


def check_speaker_model_path(onnx_path: Path) -> None:
    """Raise the error a user can act on when `onnx_path` is not a file: missing, or a directory."""
    if onnx_path.is_file():
        return
    if onnx_path.is_dir():
        inside = onnx_path / "campplus.onnx"
        hint = f"; did you mean {inside}?" if inside.is_file() else ""
        raise IsADirectoryError(f"speaker model {onnx_path} is a directory, not the campplus.onnx file{hint}")
    raise FileNotFoundError(f"speaker model {onnx_path} does not exist; the token2wav directory needs campplus.onnx")


__all__ = ["SpeakerEmbeddingBackend", "check_speaker_model_path"]
