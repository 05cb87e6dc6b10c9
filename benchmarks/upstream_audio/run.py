# SPDX-License-Identifier: Apache-2.0
"""Ours vs vLLM-Omni 0.30's own Token2Wav classes, outside the engine: the same tokens, voice and noise.

Upstream's `StepAudio2Token2WavCore` (vllm_omni.model_executor.models.step_audio2) and ours run on one
upstream-compatible stand-in folder (`ensure_standin_token2wav_dir(reduced=True, upstream_compatible=True)`).
Every comparison is a stage of the pipeline, so a difference is found where it starts:

- prompt features (speech tokens, CAM++ embedding, 24 kHz prompt mel), each side from the same wav;
- whole utterance with each side's own prompt features (what a user gets), then with upstream handed
  our prompt features (the flow + HiFT arithmetic alone): flow mel and audio;
- streaming (upstream's `setup_stream_for` / `stream_chunk_for` vs our `set_stream_cache` / `stream`,
  the reference's 25 + 3 token chunks from `stream_chunks`): per-chunk mel and audio, shared prompt.

Noise is made identical, not merely seeded alike (docs/benchmarks/upstream_audio.md):
- flow noise: upstream's `CausalConditionalCFM.rand_noise` is a `randn` buffer drawn from torch's
  global RNG when the flow is built; ours is the same-shape buffer from `noise_seed`. Upstream's buffer
  is replaced by ours (`rand_noise = ours.clone()`), so both read the same frames (whole: from 0;
  stream: at the estimator cache length);
- HiFT NSF noise: upstream draws `rand` / `randn_like` from the global RNG per HiFT call, ours draws
  the same calls from the request's generator seeded with `seed`; `torch.manual_seed(seed)` right
  before upstream's utterance (or stream set-up) makes the two streams of draws the same values.

Harness-only adaptation: upstream's streaming scratch buffers (`cnn_cache_buffer` / `att_cache_buffer`
of its CFM and DiT) are hard-coded to the shipped flow's geometry (16 blocks, 8 heads of 64, 1024
conv channels); the reduced stand-in flow needs them at its own size, so they are re-made zeroed at
that size (`fit_stream_buffers`). They are scratch written before being read; nothing else changes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

#: Flow-noise seed of ours (upstream gets our buffer) and NSF-noise seed of both sides.
SEED = 0


class BenchSetupError(RuntimeError):
    """An input of the comparison cannot be used (the message says which)."""


@dataclass(frozen=True)
class Agreement:
    """One quantity compared: ours against upstream's, over the common length."""

    case: str  # e.g. "step_audio2 whole (shared prompt)"
    quantity: str  # "mel", "audio", "speaker embedding", "prompt tokens", ...
    n_ours: int
    n_upstream: int
    max_abs: float
    rel_l2: float  # ||ours - upstream|| / ||upstream||
    note: str = ""

    @property
    def same_length(self) -> bool:
        return self.n_ours == self.n_upstream


def compare(case: str, quantity: str, ours: torch.Tensor, upstream: torch.Tensor, note: str = "") -> Agreement:
    """Max abs and relative L2 of `ours - upstream` (float64, flattened, over the common prefix)."""
    a = ours.detach().reshape(-1).double().cpu()
    b = upstream.detach().reshape(-1).double().cpu()
    n = min(a.numel(), b.numel())
    if n == 0:
        raise ValueError(f"compare {case} / {quantity}: empty tensor (ours {a.numel()}, upstream {b.numel()})")
    diff = a[:n] - b[:n]
    norm = float(b[:n].norm())
    rel = float(diff.norm()) / norm if norm > 0 else (0.0 if float(diff.norm()) == 0 else float("inf"))
    return Agreement(case, quantity, a.numel(), b.numel(), float(diff.abs().max()), rel, note)


def compare_tokens(case: str, ours: torch.Tensor, upstream: torch.Tensor, note: str = "") -> Agreement:
    """Speech tokens: `max_abs` is the number of differing positions, `rel_l2` their fraction."""
    a = ours.reshape(-1).long().cpu()
    b = upstream.reshape(-1).long().cpu()
    n = min(a.numel(), b.numel())
    wrong = int((a[:n] != b[:n]).sum()) + abs(a.numel() - b.numel())
    return Agreement(case, "prompt tokens (differing)", a.numel(), b.numel(), float(wrong), wrong / max(n, 1), note)


@dataclass(frozen=True)
class UpstreamAudioConfig:
    model_dir: Path | None = None  # None: the upstream-compatible reduced stand-in
    tokens: int = 100
    n_timesteps: int = 10
    seed: int = SEED
    threads: int = 2
    streaming: bool = True
    minicpmo: bool = True
    own_noise: bool = True  # also measure the noise difference itself (one more utterance)


@dataclass
class UpstreamAudioReport:
    config: UpstreamAudioConfig
    model_dir: str = ""
    rows: list[Agreement] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    command: str = ""


def speech_tokens(count: int) -> list[int]:
    """A fixed, varied code sequence in [0, 6561) (the same one the loader tests use)."""
    return [(37 * i + 11) % 6561 for i in range(count)]


def cosyvoice2_alias() -> None:
    """`cosyvoice2.*` importable the way stepaudio2-minicpmo's Token2wav makes it (flow.yaml names it)."""
    try:
        from stepaudio2.token2wav import _setup_cosyvoice2_alias
    except ImportError as exc:  # pragma: no cover - the engine venv has it
        raise BenchSetupError(
            f"stepaudio2-minicpmo is not installed ({exc}); tools/install_engine_cpu.sh installs it"
        ) from None
    _setup_cosyvoice2_alias()


def fit_stream_buffers(flow: Any) -> None:
    """Re-make upstream's fixed-size streaming scratch buffers at this flow's geometry (module docstring)."""
    cfm = flow.decoder
    est = cfm.estimator
    block = est.blocks[0]
    head_dim = block.attn.q_norm.normalized_shape[0]
    heads = block.attn.to_q.out_features // head_dim
    channels = block.conv.block[1].in_channels + block.conv.block[6].out_channels
    depth = len(est.blocks)
    steps = cfm.att_cache_buffer.shape[0]
    frames = est.att_cache_buffer.shape[3]
    est.att_cache_buffer = torch.zeros(depth, 2, heads, frames, 2 * head_dim)
    est.cnn_cache_buffer = torch.zeros(depth, 2, channels, 2)
    cfm.att_cache_buffer = torch.zeros(steps, depth, 2, heads, frames, 2 * head_dim)
    cfm.cnn_cache_buffer = torch.zeros(steps, depth, 2, channels, 2)


@contextlib.contextmanager
def captured(obj: Any, name: str, sink: list[torch.Tensor], pick: Callable[[Any, tuple, dict], torch.Tensor]):
    """Wrap `obj.name` so each call appends `pick(result, args, kwargs)` to `sink` (restored afterwards)."""
    original = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        sink.append(pick(result, args, kwargs).detach().clone())
        return result

    setattr(obj, name, wrapper)
    try:
        yield sink
    finally:
        setattr(obj, name, original)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for dist in ("vllm-omni", "vllm", "s3tokenizer", "onnxruntime", "stepaudio2-minicpmo"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


class UpstreamAudioComparison:
    """Builds both sides on one folder and fills `report.rows` (`run()`); see the module docstring."""

    def __init__(self, config: UpstreamAudioConfig, stage: Callable[[str], None] = lambda _: None) -> None:
        if config.tokens < 2:
            raise BenchSetupError(f"--tokens must be >= 2, got {config.tokens}")
        if not 1 <= config.n_timesteps <= 16:
            raise BenchSetupError(f"--n-timesteps must be 1..16 (upstream's stream buffers), got {config.n_timesteps}")
        self.config = config
        self.stage = stage
        self.report = UpstreamAudioReport(config=config, versions=_versions())
        self.upstream_own_noise: torch.Tensor | None = None  # the flow noise upstream drew itself

    # ---- set-up --------------------------------------------------------------------------------

    def _model_dir(self) -> Path:
        if self.config.model_dir is not None:
            return self.config.model_dir
        from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

        return ensure_standin_token2wav_dir(reduced=True, upstream_compatible=True)

    def _build(self, model_dir: Path) -> tuple[Any, Any]:
        cosyvoice2_alias()
        try:
            from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import (
                StepAudio2Token2WavCore as UpstreamCore,
            )
        except ImportError as exc:
            raise BenchSetupError(f"vLLM-Omni 0.30 is not importable ({exc}); install the engine") from None
        from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import (
            StepAudio2Token2WavCore,
        )

        n = self.config.n_timesteps
        ours = StepAudio2Token2WavCore(model_dir, device="cpu", n_timesteps=n, seed=self.config.seed)
        ours.load_models()
        upstream = UpstreamCore(str(model_dir), device="cpu", n_timesteps=n)
        upstream._ensure_models_loaded()
        # The same flow noise: upstream's buffer (drawn unseeded at construction) replaced by ours.
        self.upstream_own_noise = upstream.flow.decoder.rand_noise.detach().clone()
        upstream.flow.decoder.rand_noise = ours.flow.decoder.rand_noise.detach().clone()
        fit_stream_buffers(upstream.flow)
        return ours, upstream

    # ---- the run -------------------------------------------------------------------------------

    def run(self) -> UpstreamAudioReport:
        torch.set_num_threads(self.config.threads)
        model_dir = self._model_dir()
        self.report.model_dir = str(model_dir)
        self.stage(f"building upstream's and our Step-Audio2 Token2Wav on {model_dir}")
        ours, upstream = self._build(model_dir)
        wav = str(model_dir / "default_female.wav")
        tokens = speech_tokens(self.config.tokens)
        with torch.inference_mode():
            own_upstream, ours_features = self._prompt_stage(ours, upstream, wav)
            self._whole(ours, upstream, wav, tokens, "step_audio2 whole (own prompt features)")
            upstream.cache[wav] = _as_upstream_prompt(ours_features)
            self._whole(ours, upstream, wav, tokens, "step_audio2 whole (shared prompt features)")
            if self.config.own_noise:
                self._own_noise(ours, upstream, wav, tokens)
            if self.config.streaming:
                self._stream(ours, upstream, wav, tokens, "step_audio2 stream (shared prompt features)")
            upstream.cache[wav] = own_upstream
            if self.config.minicpmo:
                self._minicpmo(model_dir, ours.flow.decoder.rand_noise, wav, tokens, ours_features)
        return self.report

    def _minicpmo(self, model_dir: Path, noise: torch.Tensor, wav: str, tokens: list[int], features: Any) -> None:
        """MiniCPM-o 4.5: upstream's `BatchedToken2Wav` (batch 1, as its code2wav stage builds it) vs ours."""
        from vllm_omni.model_executor.models.minicpmo_4_5.batched_token2wav import BatchedToken2Wav
        from vllm_omni.model_executor.models.minicpmo_4_5.batched_token2wav import PromptFeatures as UpFeatures
        from vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2wav as UpT2W

        from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2wav

        self.stage("minicpmo_4_5: building upstream's BatchedToken2Wav and our MiniCPM-o Token2wav (0.30 rules)")
        n, seed = self.config.n_timesteps, self.config.seed
        backend = BatchedToken2Wav(UpT2W(str(model_dir), n_timesteps=n, device="cpu"))
        backend.flow.decoder.rand_noise = noise.detach().clone()
        ours = MiniCPMO45Token2wav(model_dir, n_timesteps=n, device="cpu", seed=seed)
        ours.load()
        shared = UpFeatures(
            cache_key=("shared", wav),
            speech_tokens=features.prompt_tokens.to(torch.int32),
            speaker_embedding=features.speaker_embedding.clone(),
            mels=features.prompt_mel.clone(),
        )
        from vllm_omni_token2wav.model_executor.models.token2wav_core import synthesis
        from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

        for case, chunks in (
            ("minicpmo_4_5 stream (shared prompt features)", list(stream_chunks(tokens))),
            ("minicpmo_4_5 one call (shared prompt features)", [(list(tokens), True)]),
        ):
            self.stage(case)
            up_mel: list[torch.Tensor] = []
            our_mel: list[torch.Tensor] = []
            backend._setup_cache.clear()  # each case sets up afresh (setup_batch caches by prompt)
            torch.manual_seed(seed)
            start = time.perf_counter()
            states = backend.setup_batch(shared, 1)
            theirs = []
            with captured(backend, "_decode_cfm", up_mel, lambda r, _a, _k: r[0]):
                for chunk, last in chunks:
                    audio, states = backend.decode_batch(torch.tensor([chunk]), shared, states, last_chunk=last)
                    theirs.append(audio[0])
            self.report.seconds[f"{case}: upstream"] = round(time.perf_counter() - start, 3)
            start = time.perf_counter()
            with captured(synthesis, "flow_chunks", our_mel, lambda r, _a, _k: r[0].mel):
                stream = ours.set_stream_cache(wav, seed=seed)
                mine = [ours.stream(c, wav, last, return_waveform=True, state=stream) for c, last in chunks]
            self.report.seconds[f"{case}: ours"] = round(time.perf_counter() - start, 3)
            for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
                kind = "last" if chunks[i][1] else f"{len(chunks[i][0])} tokens"
                self.report.rows.append(compare(case, f"chunk {i} mel", our_mel[i], up_mel[i], kind))
                self.report.rows.append(compare(case, f"chunk {i} audio", a, b, kind))
            if len(chunks) > 1:
                whole_ours = torch.cat([a.reshape(-1) for a in mine])
                whole_up = torch.cat([b.reshape(-1) for b in theirs])
                self.report.rows.append(compare(case, "audio (all chunks)", whole_ours, whole_up))

    def _timed(self, key: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = fn()
        self.report.seconds[key] = round(time.perf_counter() - start, 3)
        return result

    def _prompt_stage(self, ours: Any, upstream: Any, wav: str) -> tuple[tuple, Any]:
        self.stage("prompt features: speech tokens, CAM++ embedding, prompt mel")
        theirs = upstream._prepare_prompt(wav)
        upstream.cache[wav] = theirs
        mine = ours.prepare_prompt(wav, with_tokens=True)
        case = "step_audio2 prompt"
        rows = self.report.rows
        backends = "ours: onnxruntime; upstream: s3tokenizer torch"
        rows.append(compare_tokens(case, mine.prompt_tokens, theirs[0], backends))
        rows.append(compare(case, "speaker embedding", mine.speaker_embedding, theirs[2], f"ours: {mine.backend}"))
        rows.append(compare(case, "prompt mel", mine.prompt_mel, theirs[3]))
        self._prompt_bisect(ours, wav, theirs)
        return theirs, mine

    def _prompt_bisect(self, ours: Any, wav: str, theirs: tuple) -> None:
        """Our front end on upstream's resampled audio: what is left is the backends, not the resampling."""
        import numpy as np
        from vllm.multimodal.audio import AudioResampler
        from vllm.multimodal.media.audio import load_audio

        from vllm_omni_token2wav.model_executor.models.audio.loading import PromptAudio, load_prompt_audio

        raw, rate = load_audio(wav, sr=None, mono=True)  # as upstream's _prepare_prompt
        raw = raw.astype(np.float32)
        up16 = torch.from_numpy(AudioResampler(target_sr=16000).resample(raw, orig_sr=int(rate)))
        up24 = torch.from_numpy(AudioResampler(target_sr=24000).resample(raw, orig_sr=int(rate)))
        mine = load_prompt_audio(wav)
        case = "step_audio2 prompt"
        rows = self.report.rows
        rows.append(compare(case, "16 kHz prompt audio", mine.wav_16k, up16, "ours: libsoxr; upstream: vLLM resampler"))
        rows.append(compare(case, "24 kHz prompt audio", mine.wav_24k, up24, "same resamplers"))
        audio = PromptAudio(
            wav_16k=up16.float(),
            wav_24k=up24.float(),
            sample_rate=int(rate),
            num_samples=raw.shape[0],
            digest="upstream-resampled",
            truncated=False,
        )
        shared = ours.speaker_prompt.compute(audio, audio.digest, ours.spk_model, ours.speech_tokenizer)
        case = "step_audio2 prompt (upstream's resampled audio)"
        rows.append(compare_tokens(case, shared.prompt_tokens, theirs[0], "tokenizer backends only"))
        rows.append(compare(case, "speaker embedding", shared.speaker_embedding, theirs[2], f"ours: {shared.backend}"))
        rows.append(compare(case, "prompt mel", shared.prompt_mel, theirs[3]))

    def _whole(self, ours: Any, upstream: Any, wav: str, tokens: list[int], case: str) -> None:
        self.stage(case)
        seed = self.config.seed
        up_mel: list[torch.Tensor] = []
        our_mel: list[torch.Tensor] = []
        with captured(upstream.hift, "inference", up_mel, lambda _r, a, k: k.get("speech_feat", a[0] if a else None)):
            torch.manual_seed(seed)
            up_audio = self._timed(f"{case}: upstream", lambda: upstream.forward(tokens, wav, return_bytes=False))
        hook = ours.hift.register_forward_pre_hook(lambda _m, args: our_mel.append(args[0].detach().clone()))
        try:
            our_audio = self._timed(f"{case}: ours", lambda: ours(tokens, wav, seed=seed))
        finally:
            hook.remove()
        self.report.rows.append(compare(case, "mel", our_mel[0], up_mel[0]))
        self.report.rows.append(compare(case, "audio", our_audio, up_audio))
        torch.manual_seed(seed)
        vocoded, _ = upstream.hift.inference(speech_feat=our_mel[0])
        self.report.rows.append(compare(case, "audio (upstream HiFT on our mel)", our_audio, vocoded, "HiFT alone"))

    def _own_noise(self, ours: Any, upstream: Any, wav: str, tokens: list[int]) -> None:
        """The size of the noise difference itself: upstream with the noise it draws on its own."""
        case = "step_audio2 whole (shared prompt, upstream's own noise)"
        self.stage(case)
        injected = upstream.flow.decoder.rand_noise
        assert self.upstream_own_noise is not None
        upstream.flow.decoder.rand_noise = self.upstream_own_noise
        up_mel: list[torch.Tensor] = []
        try:
            with captured(
                upstream.hift, "inference", up_mel, lambda _r, a, k: k.get("speech_feat", a[0] if a else None)
            ):
                torch.manual_seed(self.config.seed + 1)  # a global RNG state other than ours
                up_audio = upstream.forward(tokens, wav, return_bytes=False)
        finally:
            upstream.flow.decoder.rand_noise = injected
        our_mel: list[torch.Tensor] = []
        hook = ours.hift.register_forward_pre_hook(lambda _m, args: our_mel.append(args[0].detach().clone()))
        try:
            our_audio = ours(tokens, wav, seed=self.config.seed)
        finally:
            hook.remove()
        note = "intended: noise not injected"
        self.report.rows.append(compare(case, "mel", our_mel[0], up_mel[0], note))
        self.report.rows.append(compare(case, "audio", our_audio, up_audio, note))

    def _stream(self, ours: Any, upstream: Any, wav: str, tokens: list[int], case: str) -> None:
        from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import _StreamState

        from vllm_omni_token2wav.model_executor.models.token2wav_core import synthesis
        from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

        self.stage(case)
        chunks = list(stream_chunks(tokens))
        seed = self.config.seed
        up_mel: list[torch.Tensor] = []
        our_mel: list[torch.Tensor] = []
        state = _StreamState()
        with captured(upstream.flow, "inference_chunk", up_mel, lambda r, _a, _k: r[0]):
            torch.manual_seed(seed)
            start = time.perf_counter()
            upstream.setup_stream_for(wav, state)
            up_audio = [upstream.stream_chunk_for(c, wav, last, state) for c, last in chunks]
            self.report.seconds[f"{case}: upstream"] = round(time.perf_counter() - start, 3)
        with captured(synthesis, "flow_chunks", our_mel, lambda r, _a, _k: r[0].mel):
            start = time.perf_counter()
            stream = ours.set_stream_cache(wav, seed=seed)
            our_audio = [ours.stream(c, wav, last, return_waveform=True, state=stream) for c, last in chunks]
            self.report.seconds[f"{case}: ours"] = round(time.perf_counter() - start, 3)
        for i, (mine, theirs) in enumerate(zip(our_audio, up_audio, strict=True)):
            kind = "last" if chunks[i][1] else f"{len(chunks[i][0])} tokens"
            self.report.rows.append(compare(case, f"chunk {i} mel", our_mel[i], up_mel[i], kind))
            self.report.rows.append(compare(case, f"chunk {i} audio", mine, theirs, kind))
        self.report.rows.append(compare(case, "mel (all chunks)", torch.cat(our_mel, -1), torch.cat(up_mel, -1)))
        self.report.rows.append(
            compare(
                case,
                "audio (all chunks)",
                torch.cat([a.reshape(-1) for a in our_audio]),
                torch.cat([a.reshape(-1) for a in up_audio]),
                f"{len(chunks)} chunks",
            )
        )


def _as_upstream_prompt(features: Any) -> tuple:
    """Our `PromptFeatures` in the tuple upstream's `cache[prompt_wav]` holds."""
    tokens = features.prompt_tokens.to(torch.int32)
    return (
        tokens,
        torch.tensor([tokens.shape[1]], dtype=torch.int32),
        features.speaker_embedding.clone(),
        features.prompt_mel.clone(),
        torch.tensor([features.prompt_mel.shape[1]], dtype=torch.int32),
    )
