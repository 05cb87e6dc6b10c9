# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's prompt conditioning as data: speech tokens, a 24 kHz mel (fmax 12 kHz), a CAM++ embedding.

The flow (`flow.CausalMaskedDiffWithDiT`) is conditioned on the reference voice three ways: its 25 Hz
speech tokens (prefix of the token sequence), its 50 Hz log-mel (`cond` of the prompt frames) and its
192-d CAM++ embedding. Two producers exist:

- vLLM-Omni's talker stage computes them in its multimodal processor and sends them once per request
  as `embed.{speech_token [1, T], speech_feat [1, 2T, 80], embedding [1, 192], speech_token_len}`
  (`prompt_from_conditioning`: unpadded with `speech_token_len`, checked, aligned);
- a caller with reference audio and the audio's speech tokens: the facade computes the embedding on
  the serving device (`speaker_embedding.select_speaker_embedding_backend`) and the mel
  (`COSYVOICE3_MEL_CONFIG`), then `build_prompt` aligns them.

The mel recipe is Step-Audio2's (n_fft 1920, hop 480, win 1920, 80 Slaney mels, center False) except
`fmax: null` in cosyvoice3.yaml, i.e. Nyquist, 12 kHz. Tokens and mel come from different extractors
and may disagree by a frame or two; CosyVoice's front end truncates both to `n = min(frames // 2,
tokens)` (`flow.align_prompt`), never pads. The speech tokens are the caller's: speech_tokenizer_v3 is
not in-tree (see docs/design/cosyvoice3.md, "Prompt features").

Limits: at most `MAX_PROMPT_SECONDS` (30 s, upstream's tokenizer refuses longer audio; the audio front
end enforces the same limit) i.e. `MAX_PROMPT_TOKENS` tokens; ids in [0, 6561).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import align_prompt
from vllm_omni_token2wav.model_executor.models.audio.mel import MelConfig

#: CosyVoice3's prompt mel: Step-Audio2's recipe with fmax = sample_rate / 2 (cosyvoice3.yaml `fmax: null`).
COSYVOICE3_MEL_CONFIG = MelConfig(fmax=12000.0)
SPEECH_VOCAB_SIZE = 6561
EMBEDDING_DIM = 192
MEL_BINS = 80
TOKEN_MEL_RATIO = 2
TOKEN_RATE = 25
MAX_PROMPT_SECONDS = 30.0
MAX_PROMPT_TOKENS = int(MAX_PROMPT_SECONDS * TOKEN_RATE)


@dataclass(frozen=True)
class CosyVoice3Prompt:
    """An aligned prompt on one device: tokens `(1, P)` long, mel `(1, 2P, 80)` float32, embedding `(1, 192)`
    float32 (not normalised; the flow normalises it). `key` identifies the content (cache and voice key)."""

    tokens: torch.Tensor
    mel: torch.Tensor
    embedding: torch.Tensor
    key: str

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.mel.nbytes + self.embedding.nbytes

    def to(self, device: torch.device) -> CosyVoice3Prompt:
        return CosyVoice3Prompt(self.tokens.to(device), self.mel.to(device), self.embedding.to(device), self.key)


def token_ids(tokens: Any, what: str, *, limit: int | None = None) -> torch.Tensor:
    """Speech token ids (list, 1-D / `(1, T)` array or tensor) as a `(1, T)` long CPU tensor, checked.

    Errors name `what`, the offending value and the allowed range; `limit` caps the count.
    """
    if isinstance(tokens, torch.Tensor):
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"{what} must hold integer speech token ids, got dtype {tokens.dtype}")
        if tokens.dim() == 2 and tokens.shape[0] != 1:
            raise ValueError(f"{what} must be 1-D or (1, T), got shape {tuple(tokens.shape)}")
        ids = tokens.detach().to("cpu", torch.long).reshape(1, -1)
    else:
        array = np.asarray(tokens)
        if array.size == 0:  # an empty list parses as float64
            array = array.astype(np.int64)
        if array.dtype.kind not in "iu":
            raise ValueError(f"{what} must hold integer speech token ids, got {array.dtype}")
        if (array.ndim == 2 and array.shape[0] != 1) or array.ndim > 2:
            raise ValueError(f"{what} must be 1-D or (1, T), got shape {array.shape}")
        ids = torch.from_numpy(array.astype(np.int64).reshape(1, -1))
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= SPEECH_VOCAB_SIZE:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"{what}: speech token id {bad} is outside [0, {SPEECH_VOCAB_SIZE}) (CosyVoice3's 25 Hz tokenizer has "
                f"{SPEECH_VOCAB_SIZE} codes; drop the talker's special ids such as the stop token 6561 first)"
            )
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(
            f"{what}: {ids.shape[1]} tokens ({ids.shape[1] / TOKEN_RATE:.1f} s) but a prompt holds at most {limit} "
            f"({limit / TOKEN_RATE:.0f} s, the reference tokenizer's limit); use a shorter reference clip"
        )
    return ids


def _float_tensor(value: Any, what: str, dims: int) -> torch.Tensor:
    tensor = torch.as_tensor(value) if not isinstance(value, torch.Tensor) else value
    if not tensor.dtype.is_floating_point:
        raise ValueError(f"{what} must be a float tensor, got {tensor.dtype}")
    while tensor.dim() < dims:
        tensor = tensor.unsqueeze(0)
    return tensor.detach().to(torch.float32)


def content_key(tokens: torch.Tensor, mel: torch.Tensor, embedding: torch.Tensor) -> str:
    """sha256 over the three tensors' values (CPU copies), a voice key for conditioning sent as tensors."""
    h = hashlib.sha256()
    for tensor in (tokens, mel, embedding):
        array = tensor.detach().to("cpu").contiguous().numpy()
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def build_prompt(
    tokens: Any, mel: torch.Tensor, embedding: torch.Tensor, *, key: str, device: torch.device, where: str
) -> CosyVoice3Prompt:
    """Check and align a prompt: tokens `(1, T)` / 1-D, mel `(1, F, 80)`, embedding `(1, 192)`.

    Truncates to `n = min(F // 2, T)` tokens and `2n` frames (CosyVoice's front end); errors name the
    tensor and the expected shape, and an alignment that leaves nothing.
    """
    ids = token_ids(tokens, f"{where}: prompt speech tokens", limit=MAX_PROMPT_TOKENS)
    mel = _float_tensor(mel, f"{where}: prompt mel", 3)
    embedding = _float_tensor(embedding, f"{where}: speaker embedding", 2)
    if mel.dim() != 3 or mel.shape[0] != 1 or mel.shape[2] != MEL_BINS:
        raise ValueError(
            f"{where}: prompt mel has shape {tuple(mel.shape)}, expected (1, frames, {MEL_BINS}) (frames first)"
        )
    if tuple(embedding.shape) != (1, EMBEDDING_DIM):
        raise ValueError(
            f"{where}: speaker embedding has shape {tuple(embedding.shape)}, expected (1, {EMBEDDING_DIM}) (CAM++)"
        )
    if ids.shape[1] == 0:
        raise ValueError(f"{where}: the prompt has no speech tokens; CosyVoice3 needs the reference clip's tokens")
    aligned_ids, aligned_mel = align_prompt(ids, mel, TOKEN_MEL_RATIO)
    if aligned_ids.shape[1] == 0:
        raise ValueError(
            f"{where}: the prompt mel has {mel.shape[1]} frames, fewer than {TOKEN_MEL_RATIO} per token for even one "
            "token; is the reference clip empty?"
        )
    return CosyVoice3Prompt(
        aligned_ids.to(device),
        aligned_mel.contiguous().to(device),
        embedding.to(device),
        key,
    )


def prompt_from_conditioning(
    speech_token: Any,
    speech_feat: Any,
    embedding: Any,
    speech_token_len: Any = None,
    *,
    device: torch.device,
    where: str = "embed",
) -> CosyVoice3Prompt:
    """The talker's `embed.*` payload as a prompt: right padding removed with `speech_token_len`, then aligned.

    Values may be tensors or 1-element lists of them (the runner's per-request wrapping).
    """
    speech_token, speech_feat, embedding = (per_request(v) for v in (speech_token, speech_feat, embedding))
    for name, value in (("speech_token", speech_token), ("speech_feat", speech_feat), ("embedding", embedding)):
        if value is None:
            raise ValueError(
                f"{where}.{name} is missing: the talker sends embed.speech_token, embed.speech_feat and "
                "embed.embedding together with the first chunk"
            )
    ids = token_ids(speech_token, f"{where}.speech_token")
    mel = _float_tensor(speech_feat, f"{where}.speech_feat", 3)
    length = per_request(speech_token_len)
    if length is not None:
        count = int(torch.as_tensor(length).reshape(-1)[0])
        if not 0 < count <= ids.shape[1]:
            raise ValueError(f"{where}.speech_token_len is {count} but speech_token holds {ids.shape[1]} ids")
        ids, mel = ids[:, :count], mel[:, : TOKEN_MEL_RATIO * count]
    emb = _float_tensor(embedding, f"{where}.embedding", 2)
    key = "talker:" + content_key(ids, mel, emb)
    return build_prompt(ids, mel, emb, key=key, device=device, where=where)


def per_request(value: Any) -> Any:
    """Unwrap the runner's one-element list around a per-request tensor (a list of ids stays as it is)."""
    if isinstance(value, list | tuple) and len(value) == 1 and isinstance(value[0], torch.Tensor | np.ndarray | list):
        return value[0]
    if isinstance(value, list | tuple) and not value:
        return None
    return value


#: A voice clip's prompt speech tokens are kept beside it: `voice.wav` -> `voice.tokens`.
TOKENS_SUFFIX = ".tokens"


def voice_tokens_path(wav: str | Path) -> Path:
    """Where a voice clip's prompt tokens are kept: `voice.wav` -> `voice.tokens`."""
    return Path(wav).with_suffix(TOKENS_SUFFIX)


def read_prompt_tokens(path: str | Path) -> torch.Tensor:
    """A voice's prompt speech tokens from a text file (ids separated by spaces, commas or newlines), `(1, T)`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise FileNotFoundError(f"{path}: cannot read the voice's prompt speech tokens ({exc})") from exc
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise ValueError(f"{path}: {bad!r} is not a speech token id (expected integers in [0, 6561))") from None
    return token_ids(values, str(path), limit=MAX_PROMPT_TOKENS)


__all__ = [
    "COSYVOICE3_MEL_CONFIG",
    "EMBEDDING_DIM",
    "MAX_PROMPT_SECONDS",
    "MAX_PROMPT_TOKENS",
    "SPEECH_VOCAB_SIZE",
    "TOKEN_MEL_RATIO",
    "CosyVoice3Prompt",
    "build_prompt",
    "content_key",
    "per_request",
    "prompt_from_conditioning",
    "read_prompt_tokens",
    "token_ids",
    "voice_tokens_path",
]
