# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o's causal vocoder as minicpmo-utils 1.0.7 ships and runs it: assets, checks, streaming.

minicpmo-utils 1.0.7 (`stepaudio2/token2wav.py`, `load_causal_vocoder`, `Token2wav`) keeps the
Step-Audio2 flow but vocodes with two HiFTs from one token2wav directory:

| file               | holds                                             | used for                              |
|--------------------|---------------------------------------------------|---------------------------------------|
| `config.yaml`      | hyperpyyaml: `hift` (`CausalHiFTGenerator` + its  | building the causal vocoder (and, by  |
|                    | F0 predictor) after CosyVoice's seed lines,       | its seed, its fixed noise table);     |
|                    | `feat_extractor` (mel settings)                   | checking the mel settings             |
| `hift.pt`          | the causal HiFT (CosyVoice3 architecture)         | streaming (`BoundedVocoder`)          |
| `hift_original.pt` | the non-causal HiFT (Step-Audio2's)               | whole utterances (`__call__`), loaded |
|                    |                                                   | on first use                          |

What its loader requires, checked here with errors naming the file and the value (the reference
raises ValueError / TypeError for each): `feat_extractor` keywords equal the Step-Audio2 prompt
mel (`STEP_AUDIO2_VOCODER_MEL`: fmax 8000, so not Fun-CosyVoice3's own fmax-12 kHz vocoder),
`hift` is the causal generator, 24 kHz and 480 samples per frame, and a streaming delay of 8
frames (F0 look-ahead 3 + conv_pre look-ahead 4 + the iSTFT's one). Here also: `config.yaml`'s
sizes must be the ones `hift.pt` holds, and each file must hold the vocoder of its role (the
loaders tell the two architectures apart by conv_pre's kernel).

Streaming is `cosyvoice3.hift`'s bounded streamer under `MINICPMO_1_0_7_STREAM` (BoundedVocoder's
numerics: 16-frame blocks, float64 F0 and wrapped phase; 3840 zeros before a stream's first
non-empty output unless that call is its last; no cross-fade). `CausalHiFTVocoder` runs the
chunks of many streams in one launch (`batched_stream.push_rows`). The noise is the file's fixed
table, the same for every stream: a stream's seed does not change its audio (as in the reference).
Unlike the reference, which requires all seven files at construction, `hift_original.pt` is only
needed when a whole utterance is requested (the MiniCPM-o stage streams every reply).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from vllm_omni_token2wav.model_executor.layers.hift import HiFTGenerator, load_hift
from vllm_omni_token2wav.model_executor.layers.hift.loader import HiFTLoadError
from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    MINICPMO_1_0_7_STREAM,
    CausalHiFTGenerator,
    CausalHiFTStreamer,
    CausalHiFTStreamState,
    StreamPolicy,
    load_causal_hift,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.batched_stream import launch_key, push_rows
from vllm_omni_token2wav.model_executor.layers.hift_causal.yaml_config import read_vocoder_yaml
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderChunk
from vllm_omni_token2wav.platforms import DeviceSpec

#: The causal vocoder's hyperpyyaml, next to `hift.pt` (minicpmo-utils 1.0.7 layout).
VOCODER_CONFIG = "config.yaml"
#: The non-causal HiFT of the same layout, for whole utterances.
WHOLE_UTTERANCE_HIFT = "hift_original.pt"
#: `feat_extractor` keywords minicpmo-utils 1.0.7 requires (the Step-Audio2 prompt mel).
STEP_AUDIO2_VOCODER_MEL: dict[str, Any] = {
    "n_fft": 1920,
    "num_mels": 80,
    "sampling_rate": 24000,
    "hop_size": 480,
    "win_size": 1920,
    "fmin": 0,
    "fmax": 8000,
    "center": False,
}
#: Mel frames a stream holds back, as minicpmo-utils 1.0.7 asserts (`vocoder_delay_frames`).
REQUIRED_DELAY_FRAMES = 8


def _check_mel(keywords: Mapping[str, Any] | None, source: str) -> None:
    if keywords is None:
        raise ValueError(
            f"{source}: no `feat_extractor` entry; minicpmo-utils requires the vocoder's mel settings there "
            f"({STEP_AUDIO2_VOCODER_MEL})"
        )
    wrong = [
        f"{key}={keywords.get(key)!r} (needs {want!r})"
        for key, want in STEP_AUDIO2_VOCODER_MEL.items()
        if keywords.get(key) != want
    ]
    if wrong:
        raise ValueError(
            f"{source}: feat_extractor {', '.join(wrong)}: the causal vocoder must use the Step-Audio2 prompt mel "
            "the flow was trained on (a Fun-CosyVoice3 vocoder config, fmax null, is not a MiniCPM-o one)"
        )


def load_minicpmo_causal_vocoder(
    config_path: str | os.PathLike[str], hift_path: str | os.PathLike[str], *, device: DeviceSpec = None
) -> CausalHiFTGenerator:
    """The causal vocoder of a minicpmo-utils 1.0.7 directory, with its noise table (see the module docstring)."""
    described = read_vocoder_yaml(Path(config_path), VOCODER_CONFIG)
    source, cfg = described.source, described.config
    _check_mel(described.feat_extractor, source)
    if cfg.sampling_rate != 24000 or cfg.upsample_scale != 480:
        raise ValueError(
            f"{source}: hift makes {cfg.sampling_rate} Hz audio with {cfg.upsample_scale} samples per mel frame; "
            "the MiniCPM-o causal vocoder needs 24000 Hz and 480"
        )
    if cfg.reference_emit_lag_frames != REQUIRED_DELAY_FRAMES:
        raise ValueError(
            f"{source}: hift.conv_pre_look_right {cfg.conv_pre_look_right} gives a streaming delay of "
            f"{cfg.reference_emit_lag_frames} frames; minicpmo-utils 1.0.7 validated (and requires) "
            f"{REQUIRED_DELAY_FRAMES} (conv_pre_look_right 4)"
        )
    try:
        model = load_causal_hift(hift_path, device=device, noise=described.noise_origin())
    except HiFTLoadError as exc:
        raise HiFTLoadError(
            f"{exc} [in a minicpmo-utils 1.0.7 directory, hift.pt is the causal vocoder that streams and "
            f"{WHOLE_UTTERANCE_HIFT} the non-causal one for whole utterances]"
        ) from exc
    if model.config != cfg:
        diffs = [
            f"{f.name}: {VOCODER_CONFIG} {getattr(cfg, f.name)!r}, hift.pt {getattr(model.config, f.name)!r}"
            for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) != getattr(model.config, f.name)
        ]
        raise ValueError(f"{source} does not describe {hift_path}: {'; '.join(diffs)}")
    return model


def load_whole_utterance_hift(path: str | os.PathLike[str], *, device: DeviceSpec = None) -> HiFTGenerator:
    """`hift_original.pt`: the non-causal HiFT that vocodes whole utterances in the 1.0.7 layout."""
    try:
        return load_hift(path, device=device)
    except HiFTLoadError as exc:
        raise HiFTLoadError(
            f"{exc} [{WHOLE_UTTERANCE_HIFT} must hold the non-causal HiFT that vocodes whole utterances; "
            "the causal vocoder belongs in hift.pt]"
        ) from exc


class CausalHiFTVocoder:
    """`StreamVocoder` of `VocoderKind.CAUSAL_HIFT`: bounded causal HiFT, many streams per launch."""

    min_chunk_frames = 0
    #: No device-graph replay: the bounded streamer's per-row slicing runs eagerly.
    hift = None

    def __init__(self, model: CausalHiFTGenerator, policy: StreamPolicy = MINICPMO_1_0_7_STREAM) -> None:
        self.streamer = CausalHiFTStreamer(model, policy)
        self._model = model
        self.name = f"causal-hift({policy.name})"

    @property
    def model(self) -> CausalHiFTGenerator:
        return self._model

    def start(self, seed: int, device: torch.device) -> CausalHiFTStreamState:
        return self.streamer.start()

    def launch_key(self, state: object, frames: int, last: bool, *, equal_shapes: bool = False) -> Hashable:
        # Rows of one push share their relative geometry, whatever `equal_shapes` asks.
        assert isinstance(state, CausalHiFTStreamState)
        return launch_key(state, frames, last)

    def vocode(
        self, chunks: Sequence[VocoderChunk], pad_rows: int = 0, graphed: object | None = None
    ) -> list[tuple[torch.Tensor, object]]:
        if graphed is not None:
            raise ValueError(f"{self.name} has no graphed network (its hift is None); got {graphed!r}")
        if not chunks:
            return []
        states: list[CausalHiFTStreamState] = []
        for chunk in chunks:
            assert isinstance(chunk.state, CausalHiFTStreamState)
            states.append(chunk.state)
        mels = [chunk.mel.float() for chunk in chunks]
        # Padding rows repeat the first row (a valid computation) and are dropped.
        outs = push_rows(
            self.streamer, states + [states[0]] * pad_rows, mels + [mels[0]] * pad_rows, finalize=chunks[0].last
        )
        return [(audio.float(), state) for audio, state in outs[: len(chunks)]]

    def flush(self, state: object) -> torch.Tensor:
        assert isinstance(state, CausalHiFTStreamState)
        model = self.streamer.model
        audio, _ = self.streamer.push(state, torch.zeros(state.batch, 80, 0, device=model.device), finalize=True)
        return audio


__all__ = [
    "STEP_AUDIO2_VOCODER_MEL",
    "VOCODER_CONFIG",
    "WHOLE_UTTERANCE_HIFT",
    "CausalHiFTVocoder",
    "load_minicpmo_causal_vocoder",
    "load_whole_utterance_hift",
]
