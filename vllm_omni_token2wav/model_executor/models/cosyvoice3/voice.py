# SPDX-License-Identifier: Apache-2.0
"""Which voice a CosyVoice3 segment asks for: the talker's prompt conditioning, or reference audio + tokens.

CosyVoice3's flow needs three things of a reference voice: its speech tokens, its mel and its CAM++
embedding (`cosyvoice3.prompt`). A segment names them one of two ways (`meta.*` / `codes.*` /
`embed.*` nested or flattened as `embed.<key>`, or top-level in a request without a producer:
`ref_audio` + `ref_audio_sr` / `prompt_wav` and `speech_token`; values possibly wrapped in a
one-element list):

| segment carries                                  | voice                                          |
|--------------------------------------------------|------------------------------------------------|
| `embed.speech_token` + `embed.speech_feat` +     | the talker's conditioning, used as sent        |
| `embed.embedding` (+ `embed.speech_token_len`)   | (vLLM-Omni 0.30's talker: with the 1st chunk)  |
| reference audio (`codes.ref` + `meta.ref_audio_sr`, | the stage computes the embedding (device    |
| or `ref_audio` + `ref_audio_sr`, or `prompt_wav`) | path) and the mel from the audio              |
| + `embed.speech_token` (or top-level             |                                                |
| `speech_token`)                                  |                                                |
| neither                                          | None: the stream's voice, or the default       |

Anything else is an error naming what is missing (reference audio without its tokens: the speech
tokenizer v3 is not in-tree). The voice key is a content hash, so the same conditioning sent by two
requests is prepared once and a stream's voice cannot change mid-stream unnoticed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import (
    MAX_PROMPT_TOKENS,
    per_request,
    prompt_from_conditioning,
    token_ids,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest, request_voice


@dataclass(frozen=True)
class ReferenceVoice:
    """Reference audio (a path, encoded bytes or `(waveform, rate)`) and its prompt speech tokens `(1, T)`."""

    audio: Any
    tokens: torch.Tensor


def embed_value(info: Mapping[str, Any], key: str, *, top_level: bool = False) -> Any:
    """`embed.<key>` whether nested (`info["embed"][key]`) or flattened (`info["embed.<key>"]`).

    `top_level`: also `info[key]` (a request without a producer sends `speech_token` there).
    """
    embed = info.get("embed")
    if isinstance(embed, Mapping) and embed.get(key) is not None:
        return embed[key]
    flat = info.get(f"embed.{key}")
    if flat is None and top_level:
        return info.get(key)
    return flat


def read_voice(info: Mapping[str, Any]) -> VoiceRequest | None:
    """The voice a CosyVoice3 segment names (see the module table); ValueError for incomplete ones."""
    token = per_request(embed_value(info, "speech_token", top_level=True))
    feat = embed_value(info, "speech_feat")
    embedding = embed_value(info, "embedding")
    audio = request_voice(info)
    if feat is not None or embedding is not None:
        if audio is not None:
            raise ValueError(
                "the segment carries both prompt conditioning (embed.*) and reference audio; send one of them"
            )
        prompt = prompt_from_conditioning(
            token, feat, embedding, embed_value(info, "speech_token_len"), device=torch.device("cpu")
        )
        return VoiceRequest(
            key=prompt.key, label=f"the talker's prompt conditioning ({prompt.num_tokens} tokens)", source=prompt
        )
    if audio is not None:
        if token is None:
            raise ValueError(
                f"{audio.label}: CosyVoice3 needs the reference audio's speech tokens too (embed.speech_token); "
                "the speech tokenizer v3 is not in-tree"
            )
        ids = token_ids(token, "embed.speech_token", limit=MAX_PROMPT_TOKENS)
        digest = hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]
        return VoiceRequest(
            key=f"{audio.key}:tokens:{digest}",
            label=f"{audio.label} with {ids.shape[1]} prompt tokens",
            source=ReferenceVoice(audio.source, ids),
        )
    if token is not None:
        raise ValueError(
            "embed.speech_token without embed.speech_feat + embed.embedding or reference audio (codes.ref / "
            "meta.prompt_wav); send the talker's whole prompt conditioning"
        )
    return None


__all__ = ["ReferenceVoice", "embed_value", "read_voice"]
