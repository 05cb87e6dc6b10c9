# SPDX-License-Identifier: Apache-2.0
"""Bounded, constant-cost streaming of the causal HiFT: each chunk vocodes only its new mel frames.

Upstream CosyVoice3 streams its vocoder by keeping the whole mel of a request and re-running
`hift.inference(all_mel, finalize=False)` every chunk, emitting the samples past the previous
end: exact, but chunk k costs O(k). Here a request carries a `CausalHiFTStreamState` instead:

| carried                         | why                                                           |
|---------------------------------|---------------------------------------------------------------|
| last <= 4 mel frames            | look-ahead of conv_pre (4) and of the F0 predictor (3)        |
| left context of every causal conv | `ContextCarry`: F0 layers (float64), ups, source_downs,     |
|                                 | ResBlocks, conv_post; the zeros of the whole-utterance run    |
| phase per harmonic (float64)    | the sine phase accumulates from the utterance start           |
| noise cursor                    | the fixed noise table is indexed by absolute sample           |
| <= 12 + 480 excitation samples  | the centred 16-point STFT of the excitation overlaps 12       |
| conv_post frames from 120 E - 1 | the iSTFT overlap-adds 4 frames per sample                    |

so chunk k costs the same as chunk 1, and the audio equals the whole-utterance `inference(mel)` on
the concatenated mel (<= 1e-6; convolutions over windows of other lengths may round differently).

Timing. After N mel frames, F0 frames < N - 3 and decoded frames < N - 4 are final; audio frames
< N - 5 are final (the iSTFT needs one more frame). `StreamPolicy.emit_lag_frames` says how much
a non-final chunk holds back: 8 reproduces the reference's non-final `inference` ((N - 8) * 480
samples, so chunk boundaries match upstream and minicpmo-utils), 5 is the least that is exact
(60 ms earlier). The final chunk (`finalize=True`) emits everything: 480 N samples in all.

`StreamPolicy` also selects the phase numerics (`source.PhaseMode`) and two minicpmo-utils 1.0.7
habits (its `BoundedVocoder` + `Token2wav._stream_vocode`, checked in that package):

| policy                  | phase            | lag | blocks   | leading zeros                          |
|-------------------------|------------------|-----|----------|----------------------------------------|
| `COSYVOICE3_STREAM`     | cumulative fp32  | 8   | none     | none                                   |
| `MINICPMO_1_0_7_STREAM` | wrapped fp64     | 8   | 16 frames | 3840 before the first non-empty output |
|                         |                  |     |          | of a non-final call                    |

minicpmo-utils 1.0.7 re-decodes a window of 31 history frames + 16 new + 5 look-ahead per block
(F0: 8 left, 3 right); carrying every conv's context computes the same numbers (its 31-frame
window covers the decoder's receptive field) at a third of the work. No cross-fade in either.

States are frozen and never mutated: `push` returns a new state, and an exception leaves the one
passed in valid. A state holds B rows that advance together (one request: B = 1). Rows of several
streams at different absolute positions can share one `push` when their relative geometry agrees
(`batched_stream.push_rows`): the stacked state then carries one noise cursor per row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import torch

from vllm_omni_token2wav.model_executor.layers.hift.causal_conv import ContextCarry
from vllm_omni_token2wav.model_executor.layers.hift.layers import istft_head, stft_channels
from vllm_omni_token2wav.model_executor.layers.hift_causal.config import CausalHiFTConfig
from vllm_omni_token2wav.model_executor.layers.hift_causal.noise import NoiseCursor, NoiseTable
from vllm_omni_token2wav.model_executor.layers.hift_causal.source import CausalSource, PhaseMode


class StreamableHiFT(Protocol):
    """The kernels a `CausalHiFTStreamer` drives; `generator.CausalHiFTGenerator` provides them.

    The streamer depends on this description, not on the generator's module, so the generator can
    build a streamer for its whole-utterance `inference` without an import circle.
    """

    config: CausalHiFTConfig
    noise: NoiseTable
    m_source: CausalSource
    stft_window: torch.Tensor

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def predictor_device(self) -> torch.device: ...

    def check_mel(self, mel: torch.Tensor, *, allow_empty: bool = False) -> None: ...

    def predict_f0(self, mel: torch.Tensor, carry: ContextCarry | None, finalize: bool) -> torch.Tensor: ...

    def decode(
        self,
        mel: torch.Tensor,
        source_stft: torch.Tensor,
        carry: ContextCarry | None,
        *,
        first: bool,
        finalize: bool,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class StreamPolicy:
    """How a stream accumulates the sine phase, splits its work and emits audio."""

    name: str
    phase: PhaseMode
    emit_lag_frames: int
    block_frames: int | None = None
    leading_silence_samples: int = 0

    def __post_init__(self) -> None:
        if self.block_frames is not None and self.block_frames < 1:
            raise ValueError(f"StreamPolicy {self.name}: block_frames must be >= 1 or None, got {self.block_frames}")
        if self.leading_silence_samples < 0:
            raise ValueError(f"StreamPolicy {self.name}: leading_silence_samples must be >= 0")


# CosyVoice3 (upstream `CosyVoice3Model.tts` and vLLM-Omni 0.30): the reference's numerics, its chunk boundaries.
COSYVOICE3_STREAM = StreamPolicy("cosyvoice3", PhaseMode.CUMULATIVE_FP32, emit_lag_frames=8)
# minicpmo-utils 1.0.7 `Token2wav.stream`: BoundedVocoder(block_frames=16) + 8 frames (3840 samples) of zeros.
MINICPMO_1_0_7_STREAM = StreamPolicy(
    "minicpmo-utils-1.0.7",
    PhaseMode.WRAPPED_FP64,
    emit_lag_frames=8,
    block_frames=16,
    leading_silence_samples=3840,
)


@dataclass(frozen=True)
class StreamLayout:
    """What a state was made for; a streamer accepts only states of its own layout."""

    config: CausalHiFTConfig
    policy: StreamPolicy
    noise: str
    device: str
    predictor_device: str


@dataclass(frozen=True)
class CausalHiFTStreamState:
    """One request's (B rows') vocoder state between chunks. Counts are mel frames from the start."""

    layout: StreamLayout
    batch: int
    received: int  # mel frames pushed
    f0_done: int  # F0 (and excitation) frames computed
    decoded: int  # frames through conv_pre .. conv_post
    emitted: int  # audio frames returned (leading zeros not counted)
    finalized: bool
    silence_pending: bool
    mel_tail: torch.Tensor  # [B, 80, received - decoded]
    phase: torch.Tensor  # [B, H] float64, on the predictor's device
    # One cursor: every row at the same sample (a request's rows); a tuple: one per row (stacked streams).
    noise: NoiseCursor | tuple[NoiseCursor, ...]
    source_tail: torch.Tensor  # [B, S]: reflect-padded excitation from the next STFT frame's first sample
    post: torch.Tensor  # [B, 18, P]: conv_post frames from max(0, 120 * emitted - 1)
    contexts: Mapping[str, torch.Tensor]

    @property
    def emitted_samples(self) -> int:
        """Audio samples returned so far, leading zeros excluded."""
        return self.emitted * self.layout.config.upsample_scale

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds (memory accounting); the noise generator states included."""
        cursors = self.noise if isinstance(self.noise, tuple) else (self.noise,)
        rng = [c.rng_state for c in cursors if c.rng_state is not None]
        return [self.mel_tail, self.phase, self.source_tail, self.post, *self.contexts.values(), *rng]


class CausalHiFTStreamer:
    """Drives a `CausalHiFTGenerator` (any `StreamableHiFT`) chunk by chunk under a `StreamPolicy`; holds no
    request state."""

    def __init__(self, model: StreamableHiFT, policy: StreamPolicy = COSYVOICE3_STREAM) -> None:
        cfg = model.config
        if policy.emit_lag_frames < cfg.min_emit_lag_frames:
            raise ValueError(
                f"StreamPolicy {policy.name}: emit_lag_frames {policy.emit_lag_frames} < {cfg.min_emit_lag_frames}; "
                f"audio frames within {cfg.min_emit_lag_frames} of the newest mel frame are not final yet "
                f"(conv_pre reads {cfg.conv_pre_look_right} frames ahead, the iSTFT one more)"
            )
        self.model = model
        self.policy = policy
        self.frame_samples = cfg.upsample_scale
        self.stft_per_frame = cfg.upsample_scale // cfg.istft_hop

    @property
    def layout(self) -> StreamLayout:
        return StreamLayout(
            self.model.config,
            self.policy,
            self.model.noise.identity,
            str(self.model.device),
            str(self.model.predictor_device),
        )

    def start(self, batch: int = 1) -> CausalHiFTStreamState:
        """The state of `batch` fresh streams (nothing pushed yet)."""
        if batch < 1:
            raise ValueError(f"a stream needs batch >= 1 rows, got {batch}")
        m, cfg = self.model, self.model.config
        device = m.device
        return CausalHiFTStreamState(
            layout=self.layout,
            batch=batch,
            received=0,
            f0_done=0,
            decoded=0,
            emitted=0,
            finalized=False,
            silence_pending=self.policy.leading_silence_samples > 0,
            mel_tail=torch.zeros(batch, cfg.in_channels, 0, device=device, dtype=m.dtype),
            phase=m.m_source.initial_phase(batch, m.predictor_device),
            noise=m.noise.start(),
            source_tail=torch.zeros(batch, 0, device=device, dtype=m.dtype),
            post=torch.zeros(batch, cfg.stft_channels, 0, device=device, dtype=m.dtype),
            contexts=MappingProxyType({}),
        )

    @torch.inference_mode()
    def push(
        self, state: CausalHiFTStreamState, mel: torch.Tensor, *, finalize: bool = False
    ) -> tuple[torch.Tensor, CausalHiFTStreamState]:
        """Vocode the new frames `mel` [B, 80, n] (n may be 0); returns (audio [B, samples], next state).

        Non-final: the audio up to `emit_lag_frames` before the newest frame. Final: everything
        left; the state is then finalized (further pushes raise, except an empty final one, which
        returns no audio). A stream pushed with all its mel at once and `finalize=True` gives the
        whole-utterance output.
        """
        self._check(state, mel)
        if state.finalized:
            if mel.shape[-1] or not finalize:
                raise ValueError(
                    "this stream is finalized; start() a new state for the next utterance "
                    f"(got {mel.shape[-1]} more frames, finalize={finalize})"
                )
            return mel.new_zeros(state.batch, 0), state
        mel = mel.to(device=self.model.device, dtype=self.model.dtype)
        block = self.policy.block_frames
        outputs = []
        if block is None:
            audio, state = self._step(state, mel, finalize)
            outputs.append(audio)
        else:
            for part in mel.split(block, dim=-1):
                audio, state = self._step(state, part, False)
                outputs.append(audio)
            if finalize:
                audio, state = self._step(state, mel[..., :0], True)
                outputs.append(audio)
        audio = torch.cat(outputs, dim=-1) if outputs else mel.new_zeros(state.batch, 0)
        if state.silence_pending and audio.shape[-1]:
            # minicpmo-utils: zeros before the first non-empty output, unless that call is the last.
            if not finalize:
                silence = audio.new_zeros(state.batch, self.policy.leading_silence_samples)
                audio = torch.cat([silence, audio], dim=-1)
            state = dataclasses.replace(state, silence_pending=False)
        return audio, state

    # -- internals ---------------------------------------------------------------------------------

    def _check(self, state: CausalHiFTStreamState, mel: torch.Tensor) -> None:
        if not isinstance(state, CausalHiFTStreamState):
            raise ValueError(f"expected a CausalHiFTStreamState from start()/push(), got {type(state).__name__}")
        layout = self.layout
        if state.layout != layout:
            diffs = [
                f"{field.name}: state {getattr(state.layout, field.name)!r} vs streamer {getattr(layout, field.name)!r}"
                for field in dataclasses.fields(layout)
                if getattr(state.layout, field.name) != getattr(layout, field.name)
            ]
            raise ValueError(
                "this state belongs to another vocoder setup (" + "; ".join(diffs) + "); "
                "a state can only continue on a streamer with the same config, policy, noise table and devices"
            )
        self.model.check_mel(mel, allow_empty=True)
        if mel.shape[0] != state.batch:
            raise ValueError(f"mel chunk has {mel.shape[0]} rows but the stream state has {state.batch}")
        if isinstance(state.noise, tuple) and len(state.noise) != state.batch:
            raise ValueError(f"the stream state has {len(state.noise)} noise cursors for {state.batch} rows")

    def _step(
        self, state: CausalHiFTStreamState, mel: torch.Tensor, finalize: bool
    ) -> tuple[torch.Tensor, CausalHiFTStreamState]:
        m, cfg, policy = self.model, self.model.config, self.policy
        n_fft, hop, per = cfg.istft_n_fft, cfg.istft_hop, self.stft_per_frame
        received = state.received + mel.shape[-1]
        decoded, f0_done, emitted = state.decoded, state.f0_done, state.emitted
        window = torch.cat([state.mel_tail, mel], dim=-1)  # mel frames [decoded, received)
        carry = ContextCarry(state.contexts)

        # F0 and excitation of the frames whose look-ahead has arrived.
        phase, noise, source_tail = state.phase, state.noise, state.source_tail
        new_f0_done = received if finalize else max(f0_done, received - cfg.f0_lookahead)
        if new_f0_done > f0_done:
            f0 = m.predict_f0(window[..., f0_done - decoded :], carry, finalize)
            if f0.shape[-1] != new_f0_done - f0_done:
                raise RuntimeError(f"F0 predictor returned {f0.shape[-1]} frames, expected {new_f0_done - f0_done}")
            values, noise = _read_noise(m.noise, noise, f0.shape[-1] * self.frame_samples)
            source, phase = m.m_source(f0, phase, values, policy.phase, policy.block_frames)
            if f0_done == 0:  # the centred STFT reflects n_fft / 2 samples at the signal start
                source = torch.cat([source[..., 1 : n_fft // 2 + 1].flip(-1), source], dim=-1)
            source_tail = torch.cat([source_tail, source], dim=-1)
        if finalize:  # ... and at its end
            source_tail = torch.cat([source_tail, source_tail[..., -(n_fft // 2 + 1) : -1].flip(-1)], dim=-1)

        # Decoder over the frames whose conv_pre look-ahead has arrived.
        post = state.post
        new_decoded = received if finalize else max(decoded, received - cfg.conv_pre_look_right)
        if new_decoded > decoded:
            first_frame = 0 if decoded == 0 else per * decoded + 1
            frames = per * new_decoded + 1 - first_frame
            needed = hop * (frames - 1) + n_fft
            if source_tail.shape[-1] < needed:
                raise RuntimeError(f"excitation buffer holds {source_tail.shape[-1]} samples, STFT needs {needed}")
            stft = stft_channels(source_tail[..., :needed], n_fft, hop, m.stft_window, center=False)
            source_tail = source_tail[..., hop * frames :]
            decoded_post = m.decode(window, stft, carry, first=decoded == 0, finalize=finalize)
            if decoded_post.shape[-1] != frames:
                raise RuntimeError(f"decoder returned {decoded_post.shape[-1]} frames, expected {frames}")
            post = torch.cat([post, decoded_post], dim=-1)

        # Emit the audio frames this policy lets out.
        audio = mel.new_zeros(state.batch, 0)
        new_emitted = received if finalize else max(emitted, min(new_decoded - 1, received - policy.emit_lag_frames))
        if new_emitted > emitted:
            kept_from = max(0, per * emitted - 1)  # first conv_post frame in `post`
            upto = per * received + 1 if finalize else per * new_emitted + 2
            wave = istft_head(post[..., : upto - kept_from], n_fft, hop, m.stft_window)
            start = self.frame_samples * emitted - hop * kept_from
            audio = wave[..., start : start + self.frame_samples * (new_emitted - emitted)]
            audio = torch.clamp(audio, -cfg.audio_limit, cfg.audio_limit)
            post = post[..., per * new_emitted - 1 - kept_from :]

        next_state = dataclasses.replace(
            state,
            received=received,
            f0_done=new_f0_done,
            decoded=new_decoded,
            emitted=new_emitted,
            finalized=finalize,
            mel_tail=window[..., new_decoded - decoded :].clone(),
            phase=phase,
            noise=noise,
            source_tail=source_tail.clone(),
            post=post.clone(),
            contexts=MappingProxyType(carry.contexts()),
        )
        return audio, next_state


def _read_noise(
    table: NoiseTable, cursor: NoiseCursor | tuple[NoiseCursor, ...], samples: int
) -> tuple[torch.Tensor, NoiseCursor | tuple[NoiseCursor, ...]]:
    """`samples` noise rows: [samples, H] from one cursor, or [B, samples, H] from one cursor per row."""
    if isinstance(cursor, NoiseCursor):
        return table.read(cursor, samples)
    reads = [table.read(c, samples) for c in cursor]
    return torch.stack([values for values, _ in reads]), tuple(after for _, after in reads)
