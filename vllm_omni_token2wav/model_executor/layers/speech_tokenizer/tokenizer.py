# SPDX-License-Identifier: Apache-2.0
"""Speech tokenizer v2 backends: 16 kHz waveform -> 25 Hz codes, on the device or in onnxruntime.

Both backends share the front end (`LogMelFrontend`), the input checks and the > 30 s windowing
(`windowing.quantize_long_mel`); they differ only in who runs one <= 30 s window:

| backend | window runs in                                       | when                                   |
|---------|------------------------------------------------------|----------------------------------------|
| torch   | the in-tree `SpeechTokenizerV2` on the serving device | default: no host round trip, no CPU ORT |
| onnx    | a CPU onnxruntime session of the shipped file         | fallback / parity reference             |

`select_speech_tokenizer(onnx_path, backend="auto", device=...)` is the one place that chooses.
`tokenize(wav_16k)` returns `(tokens [1, L] int64, L)` on both, with identical tokens on the same file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import (
    CODEBOOK_SIZE,
    N_FFT,
    SAMPLE_RATE,
)
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.frontend import LogMelFrontend
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.model import SpeechTokenizerV2, code_count
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.windowing import quantize_long_mel
from vllm_omni_token2wav.platforms import DeviceSpec, normalize_device

logger = init_logger(__name__)

# The centred STFT reflect-pads n_fft // 2 samples on each side, which needs more input than that.
MIN_SAMPLES = N_FFT // 2 + 1


class SpeechTokenizerBackend(Protocol):
    """What the token2wav stage needs from a speech tokenizer."""

    name: str
    device: torch.device

    def tokenize(self, wav_16k: torch.Tensor) -> tuple[torch.Tensor, int]: ...


def check_waveform(wav: torch.Tensor) -> torch.Tensor:
    """Validate a 16 kHz mono waveform ([N] or [1, N], float); returns it as [N]."""
    if not isinstance(wav, torch.Tensor):
        raise TypeError(f"speech tokenizer expects a torch.Tensor waveform, got {type(wav).__name__}")
    if wav.dim() == 2 and wav.shape[0] == 1:
        wav = wav[0]
    if wav.dim() != 1:
        raise ValueError(
            f"speech tokenizer expects a mono 16 kHz waveform [N] (or [1, N]), got shape {tuple(wav.shape)}; "
            "mix stereo down and resample to 16 kHz first"
        )
    if not wav.is_floating_point():
        raise ValueError(
            f"speech tokenizer expects float samples in [-1, 1], got {wav.dtype}; divide int16 PCM by 32768"
        )
    if wav.shape[0] < MIN_SAMPLES:
        raise ValueError(
            f"speech tokenizer needs at least {MIN_SAMPLES} samples ({1000 * MIN_SAMPLES / SAMPLE_RATE:.1f} ms at "
            f"16 kHz), got {wav.shape[0]}"
        )
    # Values are checked where they can be read without a device round trip: a waveform already on an
    # accelerator came through the host front end (`audio.loading` rejects NaN / Inf) before its copy.
    if wav.device.type == "cpu" and not bool(torch.isfinite(wav).all()):
        raise ValueError("speech tokenizer got a waveform with NaN or Inf samples")
    return wav


class TorchSpeechTokenizer:
    """The in-tree model on the serving device (front end on the same device)."""

    name = "torch"

    def __init__(self, model: SpeechTokenizerV2) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.frontend = LogMelFrontend().to(self.device)

    def _window(self, mel: torch.Tensor) -> torch.Tensor:
        frames = mel.shape[-1]
        lengths = torch.tensor([frames]).to(mel.device, non_blocking=True)
        codes, _ = self.model(mel, lengths)
        # One unpadded window: the code count is the encoder's subsampling of its frame count, known on
        # the host (reading the model's code_len back would wait for the device).
        return codes[0, : code_count(frames)]

    @torch.inference_mode()
    def tokenize(self, wav_16k: torch.Tensor) -> tuple[torch.Tensor, int]:
        mel = self.frontend(check_waveform(wav_16k).to(self.device))
        codes = quantize_long_mel(mel, self._window)
        return codes[None], int(codes.shape[0])


class OrtSpeechTokenizer:
    """The shipped ONNX file in a CPU onnxruntime session; front end in torch on the CPU."""

    name = "onnx"

    def __init__(self, onnx_path: str | os.PathLike[str], *, intra_op_num_threads: int = 1) -> None:
        import onnxruntime as ort

        self.path = Path(onnx_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"speech tokenizer ONNX file not found: {self.path}")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = intra_op_num_threads
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        inputs = self.session.get_inputs()
        if len(inputs) != 2:
            raise ValueError(
                f"{self.path}: expected 2 inputs (feats, feats_length), got {[i.name for i in inputs]}; "
                "is this speech_tokenizer_v2_25hz.onnx?"
            )
        self._feats, self._length = inputs[0].name, inputs[1].name
        self.device = torch.device("cpu")
        self.frontend = LogMelFrontend()

    def _window(self, mel: torch.Tensor) -> torch.Tensor:
        feeds = {
            self._feats: mel.numpy().astype(np.float32, copy=False),
            self._length: np.array([mel.shape[-1]], dtype=np.int32),
        }
        codes = self.session.run(None, feeds)[0]
        return torch.from_numpy(np.asarray(codes).reshape(-1).astype(np.int64))

    @torch.inference_mode()
    def tokenize(self, wav_16k: torch.Tensor) -> tuple[torch.Tensor, int]:
        mel = self.frontend(check_waveform(wav_16k).detach().cpu())
        codes = quantize_long_mel(mel, self._window)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= CODEBOOK_SIZE):
            raise ValueError(f"{self.path}: produced codes outside [0, {CODEBOOK_SIZE}); not a 25 Hz v2 tokenizer")
        return codes[None], int(codes.shape[0])


def select_speech_tokenizer(
    onnx_path: str | os.PathLike[str],
    *,
    backend: Literal["auto", "torch", "onnx"] = "auto",
    device: DeviceSpec = None,
) -> SpeechTokenizerBackend:
    """Choose the tokenizer backend for `onnx_path`.

    | backend | result                                                                   |
    |---------|--------------------------------------------------------------------------|
    | auto    | torch on `device` (default: the serving platform's device)               |
    | torch   | torch on `device`; load errors propagate (no silent fallback)            |
    | onnx    | CPU onnxruntime session (the upstream behaviour)                         |
    """
    if backend not in ("auto", "torch", "onnx"):
        raise ValueError(f"speech tokenizer backend must be 'auto', 'torch' or 'onnx', got {backend!r}")
    if backend == "onnx":
        return OrtSpeechTokenizer(onnx_path)
    from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.onnx_loader import (
        load_speech_tokenizer_from_onnx,
    )

    return TorchSpeechTokenizer(load_speech_tokenizer_from_onnx(onnx_path, device=normalize_device(device)))
