# SPDX-License-Identifier: Apache-2.0
"""What a reference voice turns into before synthesis, as data: `PromptFeatures`.

The Token2Wav facades compute these once per distinct prompt waveform and cache them, so the
dataclass is also the unit of caching: `clone()` gives a caller tensors it may modify without
corrupting the cache. `waveform_digest` is the content key: the same audio gives the same digest
whether it arrives as int16 PCM, float32, float64 or a decoded file.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import torch

EMBEDDING_DIM = 192
MEL_BINS = 80
PROMPT_MEL_RATE = 24_000
SPEAKER_RATE = 16_000
#: Mel frames (50 Hz) per speech token (25 Hz).
TOKEN_MEL_RATIO = 2


@dataclass(frozen=True, kw_only=True)
class PromptFeatures:
    """Prompt-side inputs of the flow model for one reference voice, all on the facade's device.

    Fields (keyword-only, so new fields can be added without breaking callers):
    - `speaker_embedding`: CAM++ embedding `[1, 192]` float32 of the 16 kHz prompt (fbank minus
      its per-utterance mean), NOT L2-normalised (the flow model normalises it).
    - `prompt_mel`: log-mel of the 24 kHz prompt `[1, T, 80]` float32 at 50 frames/s (n_fft 1920,
      hop 480, fmin 0, center False; fmax 8000, or 12000 for CosyVoice3: the facade's `prompt_mel_config`).
    - `prompt_mel_len`: `[1]` int32 tensor holding T.
    - `digest`: content key of the decoded prompt waveform (see `waveform_digest`).
    - `backend`: `name` of the speaker-embedding backend that produced the embedding.
    - `prompt_tokens`: `[1, N]` int32 25 Hz speech tokens of the 16 kHz prompt, or None for
      speaker-path features (`prepare_prompt(..., with_tokens=False)`).
    - `prompt_token_len`: `[1]` int32 holding N (None with `prompt_tokens`).

    With tokens, the features are the flow model's prompt: `prompt_mel` holds exactly
    `TOKEN_MEL_RATIO * N` frames (the 24 kHz mel replicate-padded at the end, or cut, as upstream
    pads it to the token count) and `prompt_mel_len` that count.
    """

    speaker_embedding: torch.Tensor
    prompt_mel: torch.Tensor
    prompt_mel_len: torch.Tensor
    digest: str
    backend: str
    prompt_tokens: torch.Tensor | None = None
    prompt_token_len: torch.Tensor | None = None

    def __post_init__(self) -> None:
        emb, mel, mel_len = self.speaker_embedding, self.prompt_mel, self.prompt_mel_len
        if tuple(emb.shape) != (1, EMBEDDING_DIM) or emb.dtype != torch.float32:
            raise ValueError(
                f"speaker_embedding must be [1, {EMBEDDING_DIM}] float32, got {list(emb.shape)} {emb.dtype}"
            )
        if mel.dim() != 3 or mel.shape[0] != 1 or mel.shape[2] != MEL_BINS or mel.dtype != torch.float32:
            raise ValueError(f"prompt_mel must be [1, T, {MEL_BINS}] float32, got {list(mel.shape)} {mel.dtype}")
        if tuple(mel_len.shape) != (1,) or mel_len.dtype != torch.int32:
            raise ValueError(f"prompt_mel_len must be a [1] int32 tensor, got {list(mel_len.shape)} {mel_len.dtype}")
        # The value check reads the tensor, which would synchronise a device stream: CPU only.
        if mel_len.device.type == "cpu" and int(mel_len[0]) != mel.shape[1]:
            raise ValueError(f"prompt_mel_len must hold the mel length {mel.shape[1]}, got {int(mel_len[0])}")
        self._check_tokens()

    def _check_tokens(self) -> None:
        tokens, token_len, mel = self.prompt_tokens, self.prompt_token_len, self.prompt_mel
        if tokens is None and token_len is None:
            return
        if tokens is None or token_len is None:
            raise ValueError("prompt_tokens and prompt_token_len must be given together")
        if tokens.dim() != 2 or tokens.shape[0] != 1 or tokens.shape[1] < 1 or tokens.dtype != torch.int32:
            raise ValueError(f"prompt_tokens must be [1, N >= 1] int32, got {list(tokens.shape)} {tokens.dtype}")
        if tuple(token_len.shape) != (1,) or token_len.dtype != torch.int32:
            raise ValueError(
                f"prompt_token_len must be a [1] int32 tensor, got {list(token_len.shape)} {token_len.dtype}"
            )
        if mel.shape[1] != TOKEN_MEL_RATIO * tokens.shape[1]:
            raise ValueError(
                f"prompt_mel has {mel.shape[1]} frames but {tokens.shape[1]} prompt tokens need "
                f"{TOKEN_MEL_RATIO * tokens.shape[1]} (x{TOKEN_MEL_RATIO}); use fit_mel_to_tokens()"
            )
        if token_len.device.type == "cpu" and int(token_len[0]) != tokens.shape[1]:
            raise ValueError(f"prompt_token_len must hold {tokens.shape[1]}, got {int(token_len[0])}")

    @property
    def has_tokens(self) -> bool:
        return self.prompt_tokens is not None

    @property
    def device(self) -> torch.device:
        return self.speaker_embedding.device

    def clone(self) -> PromptFeatures:
        """A deep copy: every tensor cloned, so the copy shares no storage with `self`.

        Skips `__post_init__` (the fields were validated when `self` was built), so a cache hit
        costs the tensor copies and nothing that could synchronise the device.
        """
        copy = object.__new__(PromptFeatures)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            object.__setattr__(copy, f.name, value.clone() if isinstance(value, torch.Tensor) else value)
        return copy


def canonical_waveform(waveform: np.ndarray | torch.Tensor) -> np.ndarray:
    """`waveform` as C-contiguous little-endian float32, integer PCM scaled by its full range.

    The scaling is the audio front end's (`audio.loading`): int16 / 2^15, int32 / 2^31, int8 / 2^7,
    uint8 (x - 128) / 128, floats kept. So int16 `x` and float `x / 32768` give identical arrays,
    and for mono audio within [-1, 1] the result equals the front end's decoded samples.
    Raises ValueError for dtypes that are not audio samples (bool, complex, object).
    """
    array = waveform.detach().cpu().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform)
    if array.dtype == np.int16:
        return (array.astype(np.float64) / 32768.0).astype("<f4")
    if array.dtype == np.int32:
        return (array.astype(np.float64) / 2147483648.0).astype("<f4")
    if array.dtype == np.int8:
        return (array.astype(np.float64) / 128.0).astype("<f4")
    if array.dtype == np.uint8:  # 8-bit WAV is unsigned with a 128 offset
        return ((array.astype(np.float64) - 128.0) / 128.0).astype("<f4")
    if array.dtype.kind == "f":
        return np.ascontiguousarray(array, dtype="<f4")
    raise ValueError(
        f"prompt waveform has dtype {array.dtype}; expected float32/float64 in [-1, 1] or int16/int32/int8/uint8 PCM"
    )


def waveform_digest(waveform: np.ndarray | torch.Tensor, sample_rate: int) -> str:
    """Content key of a mono waveform: sha256 over `f"{rate}:"` and its canonical float32 samples.

    Same format as the front end's `DecodedAudio.digest()`, so a mono array hashes like the file
    it came from, without paying for decoding or resampling on a cache hit.
    """
    array = canonical_waveform(waveform)
    if array.ndim != 1:
        raise ValueError(f"waveform_digest expects a mono [N] waveform, got shape {list(array.shape)}")
    hasher = hashlib.sha256()
    hasher.update(f"{int(sample_rate)}:".encode())
    hasher.update(array.data)  # the C-contiguous buffer itself, no copy
    return hasher.hexdigest()


def fit_mel_to_tokens(mel: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """`mel` [1, T, 80] with exactly `TOKEN_MEL_RATIO * num_tokens` frames: last frame repeated, or cut.

    Upstream pads with `F.pad(..., mode="replicate")` by `2N - T`, which is a cut when negative; the
    24 kHz mel and the 25 Hz tokens of one clip differ by a few frames at most.
    """
    want = TOKEN_MEL_RATIO * num_tokens
    if mel.shape[1] == 0:
        raise ValueError("prompt mel has no frames; the prompt audio is too short")
    if mel.shape[1] >= want:
        return mel[:, :want].contiguous()
    pad = mel[:, -1:].expand(mel.shape[0], want - mel.shape[1], mel.shape[2])
    return torch.cat([mel, pad], dim=1)
