# SPDX-License-Identifier: Apache-2.0
"""What each request's audio must be: the same tokens through our stage model in this process, no engine.

The engine runs our stage classes in a worker process; the references build the same class here with
the deployment's options (`Cls(model=<folder>, n_timesteps=2, max_rows=<max_num_seqs>, ...)`, as the
stage tests in tests/model_executor/models/token2wav_stage/ do) and feed it each request ALONE, so an
engine step that batched several requests must give every request exactly its solo audio (the stage's
batched == alone rule, <= 1e-5 with equal length).

- code2wav alone: one `forward` with the request's codec ids and its `additional_information`, shaped
  as vLLM-Omni's runner shapes it (int32 ids, one dict per request, `request_ids`).
- streamed: the producer's codes (`standin.codes.expected_codes`) cut into chunks by upstream's own
  async-chunk function of the family (`thinker2token2wav_async_chunk`: 25 + 3 lookahead tokens, the rest
  at the end; `talker2code2wav_async_chunk`: growing prefixes), called in this process once per generated
  token with a stand-in transfer manager, the way the AR scheduler calls it once per step; each chunk then
  reaches the stage as the chunk adapter delivers it (`standin/chunk_producer.py`: `forward_inputs`). No seed
  reaches the stage on that path, so the reference gets the seed the engine's stage used (its counters).

References run with one intra-op thread (`tests/helpers/torch_state.py`): on a busy 2-core host two
OpenMP threads made these tiny models ~20x slower.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ChunkPayload, forward_inputs
from vllm_omni_token2wav.model_executor.models.standin.codes import expected_codes
from vllm_omni_token2wav.model_executor.models.standin.model_dirs import producer_codec_offset
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors

#: The connector `extra` of the shipped stand-in stream deployments (what upstream's chunk function reads).
STREAM_CONNECTOR_EXTRA = {"codec_chunk_frames": 25, "codec_left_context_frames": 3, "codec_vocab_size": 6561}


def stage_class(family: str) -> type:
    if family == "minicpmo_4_5":
        from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav

        return MiniCPMO45Code2Wav
    if family == "step_audio2":
        from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
            StepAudio2Token2WavForConditionalGeneration,
        )

        return StepAudio2Token2WavForConditionalGeneration
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav

    return CosyVoice3Code2Wav


def reference_stage(family: str, model: Path, *, async_chunk: bool, max_rows: int = 8, n_timesteps: int = 2) -> Any:
    """Our stage model of `family` over the engine's model folder, with the deployment's options."""
    stage = stage_class(family)(
        model=str(model), device="cpu", n_timesteps=n_timesteps, max_rows=max_rows, async_chunk=async_chunk
    )
    stage.load_weights([])
    return stage


def whole_request(stage: Any, request_id: str, codes: Sequence[int], info: Mapping[str, Any]) -> np.ndarray:
    """A code2wav-alone request through `stage` alone: its audio (float32)."""
    ids = torch.tensor(list(codes), dtype=torch.int32)
    stamped = {**info, "global_request_id": [request_id], "omni_final_stage_id": 0, "generated_len": 0}
    with one_intra_op_thread():
        out = stage(
            ids,
            None,
            runtime_additional_information=[stamped],
            seq_token_counts=[len(ids)],
            request_ids=[request_id],
        ).multimodal_outputs
    errors = segment_errors(out)
    if errors != [None]:
        raise AssertionError(f"reference of {request_id} failed: {errors[0]}")
    return out[stage.family.output_key][0].numpy()


class _Request:
    """The part of vLLM's `Request` upstream's async-chunk functions read."""

    def __init__(self, request_id: str, prompt: Sequence[int], generated: Sequence[int], finished: bool) -> None:
        self.external_req_id = request_id
        self.prompt_token_ids = list(prompt)
        self.output_token_ids = list(generated)
        self.all_token_ids = [*prompt, *generated]
        self.additional_information = None
        self._finished = finished

    def is_finished(self) -> bool:
        return self._finished


def upstream_chunks(family: str, request_id: str, prompt: Sequence[int], count: int) -> list[ChunkPayload]:
    """The chunks upstream's async-chunk function of `family` sends for the stand-in producer's `count` codes."""
    offset = producer_codec_offset(family)
    generated = [int(c) + offset for c in expected_codes(prompt, count, offset)]
    return replay_chunks(family, request_id, prompt, generated)


def replay_chunks(family: str, request_id: str, prompt: Sequence[int], generated: Sequence[int]) -> list[ChunkPayload]:
    """The chunks upstream's async-chunk function of `family` sends for a reply of `generated` token ids (as the
    producer's sampler emits them: Step-Audio2's absolute audio ids, CosyVoice3's codes), one call per step."""
    if family == "step_audio2":
        from vllm_omni.model_executor.stage_input_processors.step_audio2 import thinker2token2wav_async_chunk as chunk
    elif family == "cosyvoice3":
        from vllm_omni.model_executor.stage_input_processors.cosyvoice3 import talker2code2wav_async_chunk as chunk
    else:
        raise ValueError(f"no token-stream async-chunk function for {family}")
    generated = [int(t) for t in generated]
    manager = SimpleNamespace(
        code_prompt_token_ids=defaultdict(list),
        request_payload={},
        connector=SimpleNamespace(config={"extra": dict(STREAM_CONNECTOR_EXTRA)}),
    )
    chunks: list[ChunkPayload] = []
    count = len(generated)
    for step in range(1, count + 1):  # the AR scheduler calls it once per step, with that step's tokens
        payload = chunk(manager, None, _Request(request_id, prompt, generated[:step], step == count))
        if payload is None:
            continue
        tokens = tuple(int(t) for t in payload.codes.audio.tolist())
        last = bool(payload.meta.finished.item())
        offset_in_prefix = payload.meta.left_context_size if family == "cosyvoice3" else None
        chunks.append(ChunkPayload(request_id, tokens, last, len(chunks), offset=offset_in_prefix))
    return chunks


def minicpmo_talker_chunks(request_id: str, codes: Sequence[int]) -> list[tuple[tuple[int, ...], bool]]:
    """`[(tokens, last)]` upstream's `tts2code2wav_async_chunk` sends for a talker reply of `codes`: called once
    per step with that step's code in the talker's multimodal output, then once more as the request finishes
    (the talker's last step samples its EOS, which it does not emit as a code). Left context included."""
    from vllm_omni.model_executor.stage_input_processors.minicpmo_4_5_omni import tts2code2wav_async_chunk

    manager = SimpleNamespace(
        request_payload={},
        code_prompt_token_ids=defaultdict(list),
        connector=SimpleNamespace(config={"extra": dict(STREAM_CONNECTOR_EXTRA)}),
    )
    out: list[tuple[tuple[int, ...], bool]] = []
    steps = [*([int(c)] for c in codes), []]
    for i, step in enumerate(steps):
        request = SimpleNamespace(external_req_id=request_id, request_id=request_id, additional_information=None)
        finished = i == len(steps) - 1
        request.is_finished = lambda finished=finished: finished
        output = {"codes": {"audio": torch.tensor(step, dtype=torch.long)}, "meta": {"request_id": request_id}}
        payload = tts2code2wav_async_chunk(manager, output, request, is_finished=finished)
        if payload is not None:
            out.append((tuple(int(t) for t in payload.codes.audio.tolist()), bool(payload.meta.last_chunk)))
    return out


def new_tokens(chunk: ChunkPayload) -> int:
    """How many tokens the stage serves for a chunk (CosyVoice3 sends a prefix: the part after its offset)."""
    return len(chunk.tokens) - (chunk.offset or 0)


def streamed_request(stage: Any, chunks: Sequence[ChunkPayload], seed: int) -> np.ndarray:
    """The chunks of one request through `stage` alone, with the noise seed the engine's stage used."""
    pieces = []
    with one_intra_op_thread():
        for chunk in chunks:
            ids, kwargs = forward_inputs([chunk], stage.family)
            kwargs["runtime_additional_information"][0]["meta"]["seed"] = seed
            out = stage(ids, None, **kwargs).multimodal_outputs
            errors = segment_errors(out)
            if errors != [None]:
                raise AssertionError(f"reference chunk {chunk.chunk_seq} of {chunk.request_id} failed: {errors[0]}")
            pieces.append(out[stage.family.output_key][0])
    return torch.cat(pieces).numpy()


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"lengths differ: {a.shape} vs {b.shape}")
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0


__all__ = [
    "STREAM_CONNECTOR_EXTRA",
    "max_abs",
    "minicpmo_talker_chunks",
    "new_tokens",
    "replay_chunks",
    "reference_stage",
    "stage_class",
    "streamed_request",
    "upstream_chunks",
    "whole_request",
]
