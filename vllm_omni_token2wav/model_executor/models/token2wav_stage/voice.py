# SPDX-License-Identifier: Apache-2.0
"""Which voice a request asks for, and the reference audio normalised the way MiniCPM-o does it.

A request's voice comes with its first chunk: reference audio as an array (`codes.ref` with
`meta.ref_audio_sr`, MiniCPM-o's producer; `ref_audio` with `ref_audio_sr` top-level in a request
without a producer), or a file path / encoded bytes (`meta.prompt_wav`, or top-level `prompt_wav`);
without either it is the stage's default voice. Every voice, the default one included, is
normalised like MiniCPM-o's code2wav: resampled to 24 kHz mono and cut or zero-padded to a fixed
length (default 6 s). MiniCPM-o's reason holds for every family: the prompt length is the origin of
the flow's attention caches, so one length means one cache-origin shape (fewer graph-capture keys,
one row shape for batched attention, and a per-stream memory that does not depend on the caller).

`VoiceRequest.key` identifies what was asked for without decoding anything (a content hash of an
array or bytes, the path with its size and mtime), so a chunk that repeats its voice is recognised
cheaply and a chunk that changes it mid-stream is rejected. The prepared features are cached by
the content of the normalised audio in the Token2Wav core (`StepAudio2Token2WavCore.prepare_prompt`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_stage.fields import codes_value, meta_value, scalar

#: MiniCPM-o's default reference window (`ref_audio_max_seconds`).
DEFAULT_REFERENCE_SECONDS = 6.0
VOICE_SAMPLE_RATE = 24_000
#: The streaming caches hold at most ~16.9 s of prompt (see StepAudio2Token2WavCore); keep below it.
MAX_REFERENCE_SECONDS = 16.0


@dataclass(frozen=True)
class VoiceRequest:
    """What a segment says about its voice: `source` is None for the stage's default voice."""

    key: str
    label: str
    source: Any = None

    @property
    def is_default(self) -> bool:
        return self.source is None


DEFAULT_VOICE = VoiceRequest(key="default", label="the default voice")


def check_reference_seconds(seconds: float) -> float:
    seconds = float(seconds)
    if not 0.5 <= seconds <= MAX_REFERENCE_SECONDS:
        raise ValueError(
            f"ref_audio_max_seconds must be in [0.5, {MAX_REFERENCE_SECONDS}] s (the streaming caches hold at most "
            f"~16.9 s of prompt), got {seconds}"
        )
    return seconds


def normalize_reference(source: Any, seconds: float) -> np.ndarray:
    """`source` as float32 mono 24 kHz of exactly `round(seconds * 24000)` samples (cut or zero-padded).

    `source`: a path, encoded bytes, or `(waveform, sample_rate)`. Errors of the audio front end
    (missing file, undecodable bytes, bad dtype, float audio outside [-1, 1]) surface unchanged.
    """
    from vllm_omni_token2wav.model_executor.models import audio as frontend

    loaded = frontend.load_audio(source, VOICE_SAMPLE_RATE, max_seconds=seconds, truncate=True)
    wav = np.ascontiguousarray(loaded.detach().cpu().numpy(), dtype=np.float32).reshape(-1)
    target = round(seconds * VOICE_SAMPLE_RATE)
    if wav.shape[0] >= target:
        return wav[:target].copy()
    return np.concatenate([wav, np.zeros(target - wav.shape[0], dtype=np.float32)])


def _array_key(array: np.ndarray | torch.Tensor, rate: int) -> str:
    values = array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    h = hashlib.sha256(f"{rate}:{values.dtype.str}:{values.shape}:".encode())
    h.update(np.ascontiguousarray(values).tobytes())
    return "ref:" + h.hexdigest()


def unwrap_waveform(value: Any) -> Any:
    """A waveform the engine may have wrapped in a one-element list (`[tensor]`, `[[0.1, ...]]`), unwrapped.

    A list of numbers is the waveform itself (the engine carries a serialized list of floats as a list).
    """
    while (
        isinstance(value, list | tuple)
        and len(value) == 1
        and isinstance(value[0], list | tuple | np.ndarray | torch.Tensor)
    ):
        value = value[0]
    return value


def requested_voice(
    ref: Any,
    ref_sr: Any,
    prompt_wav: Any,
    *,
    ref_key: str = "codes.ref",
    rate_key: str = "meta.ref_audio_sr",
    path_key: str = "meta.prompt_wav",
) -> VoiceRequest | None:
    """The voice named by a reference waveform `ref` + its rate `ref_sr`, or `prompt_wav`; None if neither.

    `*_key` name the fields in messages (a producer's `codes.ref` / `meta.*`, or a request's top-level
    `ref_audio` / `ref_audio_sr`). Raises ValueError for a reference array without a usable sample
    rate or of an unusable type.
    """
    if ref is not None:
        ref = unwrap_waveform(ref)
        if isinstance(ref, list | tuple):
            try:
                ref = np.asarray(ref, dtype=np.float32)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{ref_key} must be a list of float samples (mono waveform): {exc}") from exc
        if not isinstance(ref, np.ndarray | torch.Tensor):
            hint = f"; pass a file path as {path_key.rsplit('.', 1)[-1]}" if isinstance(ref, str | os.PathLike) else ""
            raise ValueError(f"{ref_key} must be a waveform array or tensor, got {type(ref).__name__}{hint}")
        try:
            rate = int(ref_sr)
        except (TypeError, ValueError):
            rate = 0
        if rate <= 0:
            raise ValueError(f"{ref_key} carries reference audio but {rate_key} is {ref_sr!r}; send its rate")
        array = ref.detach().cpu().float().reshape(-1).numpy() if isinstance(ref, torch.Tensor) else ref.reshape(-1)
        label = f"reference audio ({array.shape[0]} samples at {rate} Hz)"
        return VoiceRequest(key=_array_key(array, rate), label=label, source=(array, rate))
    if prompt_wav is None:
        return None
    if isinstance(prompt_wav, bytes | bytearray | memoryview):
        data = bytes(prompt_wav)
        return VoiceRequest(key="bytes:" + hashlib.sha256(data).hexdigest(), label="prompt_wav bytes", source=data)
    if isinstance(prompt_wav, str | os.PathLike):
        path = Path(prompt_wav)
        try:
            stat = path.stat()
            key = f"path:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        except OSError:
            key = f"path:{path}"  # loading it names the problem
        return VoiceRequest(key=key, label=f"prompt_wav {path}", source=str(path))
    raise ValueError(f"{path_key} must be a path or encoded audio bytes, got {type(prompt_wav).__name__}")


def request_voice(info: Mapping[str, Any]) -> VoiceRequest | None:
    """The reference voice a dict names: `codes.ref` + `meta.ref_audio_sr`, else top-level `ref_audio` +
    `ref_audio_sr`, else `prompt_wav` (`meta.*` or top-level); None if none (`contract.py` module docstring)."""
    rate = scalar(meta_value(info, "ref_audio_sr"))
    prompt_wav = scalar(meta_value(info, "prompt_wav"))
    ref = codes_value(info, "ref")
    if ref is not None:
        return requested_voice(ref, rate, prompt_wav)
    return requested_voice(
        info.get("ref_audio"), rate, prompt_wav, ref_key="ref_audio", rate_key="ref_audio_sr", path_key="prompt_wav"
    )


__all__ = [
    "DEFAULT_REFERENCE_SECONDS",
    "DEFAULT_VOICE",
    "MAX_REFERENCE_SECONDS",
    "VOICE_SAMPLE_RATE",
    "VoiceRequest",
    "check_reference_seconds",
    "normalize_reference",
    "request_voice",
    "requested_voice",
    "unwrap_waveform",
]
