# SPDX-License-Identifier: Apache-2.0
"""`bench engine-ab --route pipeline`: upstream's own multi-stage pipeline at toy size in both arms.

Both arms serve the family's toy upstream pipeline (`model_executor/models/standin/toy/`): upstream's deploy
YAML (an overlay of only what a CPU host forces, `standin/toy/__init__.py`), upstream's thinker (and
MiniCPM-o's talker) with random weights over the toy folder; the arms differ only in the code2wav class
(`VLLM_OMNI_TOKEN2WAV_OVERRIDES=0`: upstream's; else ours), so the code2wav stage sees what upstream's own
stage input processors hand it, at upstream's `max_num_seqs`. One overlay file serves both arms.

The reply length is the deployment's (a served request cannot set every stage's): `stage_overrides` pin the
producing stage's `default_sampling_params` (`reply_overrides`):

- Step-Audio2 (`step_audio_2_async_chunk.yaml`): the thinker's `max_tokens` = the codes wanted, with
  `allowed_token_ids` the codec ids below the audio EOS, so every token is a code; requests stream raw PCM
  from `/v1/audio/speech` (upstream's Step-Audio2 speech adapter).
- MiniCPM-o 4.5 (`minicpmo_4_5_turn.yaml`): the thinker replies `TEXT_TOKENS` tokens (min = max: random
  weights may stop at once), the talker `tokens + 1` steps (it voices one code fewer; its YAML `min_tokens`
  capped to that); requests stream from `/v1/chat/completions` with `modalities: [text, audio]`: each SSE
  event whose delta is a base64 WAV is an audio delivery.

A request that ends with no audio samples failed. Reply lengths are not compared with a codes x 960 formula
(upstream's and our classes may voice a stream's context frames differently); each arm's throughput counts
the samples it delivered.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from vllm_omni_token2wav.benchmarks.speech_stream_client import (
    ServedRequest,
    error_message,
    run_closed_or_poisson,
    stream_speech,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import RequestResult

__all__ = [
    "CHAT_PATH",
    "PIPELINE_FAMILIES",
    "TEXT_TOKENS",
    "chat_stream",
    "pipeline_deploy",
    "pipeline_endpoint",
    "pipeline_max_num_seqs",
    "pipeline_wave",
    "reply_overrides",
    "wav_samples",
]

#: Families with a toy upstream pipeline (`standin/toy/`) whose code2wav stage both arms can serve.
PIPELINE_FAMILIES: Final = ("step_audio2", "minicpmo_4_5")
CHAT_PATH: Final = "/v1/chat/completions"
SPEECH_PATH: Final = "/v1/audio/speech"
TEXT_TOKENS: Final = 12
_STEP_AUDIO2_AUDIO_START: Final = 151696  # standin/toy/step_audio2.py (not imported: this module needs no vLLM)
_CODEBOOK: Final = 6561
WAV_HEADER_BYTES: Final = 44


def pipeline_endpoint(family: str) -> str:
    return SPEECH_PATH if family == "step_audio2" else CHAT_PATH


def reply_overrides(family: str, tokens: int) -> dict[int, dict[str, Any]]:
    """The deployment's `stage_overrides` that make every served reply `tokens` codes (module docstring)."""
    if family == "step_audio2":
        allowed = list(range(_STEP_AUDIO2_AUDIO_START, _STEP_AUDIO2_AUDIO_START + _CODEBOOK))
        return {0: {"default_sampling_params": {"max_tokens": tokens, "allowed_token_ids": allowed}}}
    if family == "minicpmo_4_5":
        steps = tokens + 1
        return {
            0: {"default_sampling_params": {"max_tokens": TEXT_TOKENS, "min_tokens": TEXT_TOKENS}},
            1: {"default_sampling_params": {"max_tokens": steps, "min_tokens": min(50, steps)}},
        }
    raise ValueError(f"no toy upstream pipeline route for {family!r}; families: {', '.join(PIPELINE_FAMILIES)}")


def pipeline_deploy(family: str, model: Path, folder: Path, tokens: int) -> Path:
    """The overlay both arms serve: the toy pipeline's deployment with the reply length pinned."""
    from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES

    pipeline = TOY_PIPELINES[family]
    return pipeline.deployment(model, folder, async_chunk=True, stage_overrides=reply_overrides(family, tokens))


def pipeline_max_num_seqs(family: str) -> tuple[int, str]:
    """The code2wav stage's `max_num_seqs` in upstream's YAML that both arms serve, and where it was read."""
    from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES, upstream_deploy_yaml

    pipeline = TOY_PIPELINES[family]
    name = pipeline.yaml_name(async_chunk=True)
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    stages = {int(s["stage_id"]): s for s in resolve_deploy_yaml(upstream_deploy_yaml(name))["stages"]}
    sid = pipeline.code2wav_stage
    return int(stages[sid].get("max_num_seqs", 1)), f"vllm_omni/deploy/{name} stage {sid} (both arms)"


def wav_samples(data: bytes) -> int | None:
    """Samples of a mono 16-bit WAV (its `data` chunk), or None if `data` is no WAV."""
    if len(data) < WAV_HEADER_BYTES or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        if chunk == b"data":
            return min(size, len(data) - pos - 8) // 2
        pos += 8 + size + (size & 1)
    return None


def _audio_deltas(event: Mapping[str, Any]) -> list[bytes]:
    """The base64 WAVs of one chat SSE event's deltas (text deltas are skipped)."""
    out = []
    for choice in event.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if not isinstance(content, str) or not content.startswith("UklGR"):  # base64 of "RIFF"
            continue
        try:
            out.append(base64.b64decode(content, validate=True))
        except (binascii.Error, ValueError):
            continue
    return out


def chat_stream(
    port: int, model: str, text: str, result: RequestResult, origin: float, *, timeout_s: float = 300.0
) -> None:
    """POST a streamed chat completion with text and audio out; every audio delta is a delivery."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "modalities": ["text", "audio"],
        "stream": True,
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", CHAT_PATH, body=json.dumps(body), headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            result.errors.append(f"HTTP {reply.status}: {' '.join(error_message(reply.read()).split())[:400]}")
            return
        while line := reply.readline():
            now = time.perf_counter() - origin
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if isinstance(event, dict) and "error" in event:
                result.errors.append(f"stream error: {str(event['error'])[:400]}")
                continue
            for wav in _audio_deltas(event):
                samples = wav_samples(wav)
                if samples:
                    result.deliveries.append((now, samples))
    except (OSError, http.client.HTTPException) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def pipeline_wave(
    port: int,
    family: str,
    model: str,
    texts: Sequence[str],
    concurrency: int,
    *,
    prefix: str,
    tokens: int,
    timeout_s: float,
) -> list[RequestResult]:
    """Every text through the family's endpoint as a closed loop of `concurrency`; no audio is a failure."""

    def send(request: ServedRequest, result: RequestResult, origin: float) -> None:
        result.tokens = tokens
        if family == "step_audio2":
            stream_speech(port, request.text, result, origin, timeout_s=timeout_s)
        else:
            chat_stream(port, model, request.text, result, origin, timeout_s=timeout_s)
        if not result.errors and result.samples == 0:
            result.errors.append("the reply carried no audio")

    requests = [ServedRequest(f"{prefix}-{i}", text) for i, text in enumerate(texts)]
    return run_closed_or_poisson(port, requests, concurrency, timeout_s=timeout_s, send=send)
