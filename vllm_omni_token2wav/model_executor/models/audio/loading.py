# SPDX-License-Identifier: Apache-2.0
"""Prompt audio loading: a path, encoded bytes or an array -> mono float32 in [-1, 1] at a given rate.

A voice-cloning request carries its prompt as a file, as uploaded bytes, or as an in-memory array at
some native rate. The front end needs the same prompt at 16 kHz (speaker fbank, speech tokens) and at
24 kHz (flow prompt mel), both converted from the ORIGINAL decoded audio rather than one from the
other, so that the 24 kHz copy keeps the 8-12 kHz band a 16 kHz copy has already discarded.

Normalisation rules (every other input is a ValueError that names the problem):
- decoding: libsndfile via `soundfile` (WAV, FLAC, OGG/Vorbis, MP3 with libsndfile >= 1.1, ...);
  integer PCM is scaled by 1 / 2^(bits-1) (uint8: (x - 128) / 128). Without soundfile (accelerator
  images ship only the core dependencies), PCM WAV files (8/16/24/32-bit) are decoded with the
  standard library's `wave` module, with the same scaling; other formats then need soundfile;
- arrays: int16 / 32768, int32 / 2^31, int8 / 128, uint8 as above, float32 / float64 kept and
  required to lie in [-1, 1] (a peak above 1 is almost always int16 values stored as floats);
- channels are averaged (stereo mix-down); a 2-D array's channel axis is its shorter one;
- a limit on the duration (default 30 s for prompts): longer audio is rejected unless the caller
  asked for `truncate=True`, which keeps the first `max_seconds`;
- resampling: `resample.resample` (libsoxr, band-limited), then clipped to [-1, 1] since the
  band-limiting can overshoot a full-scale input by a few percent.

Prompts (`load_prompt_audio`, the one door every Token2Wav prompt passes) must also carry a signal:
the peak of the decoded original after removing its DC offset (its mean) must reach
`MIN_PROMPT_PEAK_DBFS` = -60 dBFS. Why that floor (measured on the shipped CMU ARCTIC clip, Kaldi
fbank with its FLT_EPSILON log floor, docs/design/audio_frontend.md "Prompt level"):
- at or below about -90 dBFS peak every fbank cell sits on the log floor, so the speaker features are
  constant and every such prompt (1e-9 or 1e-6 noise, a pure DC offset) yields one identical "no
  speaker" embedding: the degenerate result this check exists to stop; -60 dBFS keeps a 30 dB margin;
- -60 dBFS is 33 LSB of 16-bit audio, the level of a silent room on a typical recording chain: below it
  there is no speech to clone;
- real speech passes with a wide margin: the ARCTIC clip peaks at -3.7 dBFS (rms -21.7 dBFS), and the
  same speech recorded 50 dB quieter (-54 dBFS peak) still passes.
Prompts between -60 and -40 dBFS pass with a warning: the fbank floor already flattens their quiet
bands, so their embedding drifts from that of the same voice at a normal level.

A peak says nothing about duration: one sample of 0.5 in a second of zeros peaks at -6 dBFS and
used to yield an embedding without a word. Prompts must therefore also carry sustained signal
(`prompt_activity`): cut into the fbank's frames (25 ms every 10 ms, DC offset removed), a frame
is active when its RMS is within `ACTIVE_WITHIN_DB` = 40 dB of the loudest frame and at least
`ACTIVE_FLOOR_DBFS` = -80 dBFS; a prompt needs `MIN_ACTIVE_SECONDS` = 0.3 s of active frames.
Measured (docs/design/audio_frontend.md "Prompt activity", the tests assert each row):
- refused: a click (0.03 s active), five clicks (0.15 s), a 250 ms beep (0.27 s), three 60 ms beeps
  (0.24 s), a -50 dBFS click on 16-bit dither (0.03 s: the dither is under the -80 dBFS floor);
- accepted: the shipped clip (3.95 s of its 4.0 s), the same clip 20 / 30 / 40 / 50 dB quieter
  (3.95 / 3.71 / 2.85 / 2.29 s) and with its peak at the -60 dBFS floor (1.56 s), every 0.5 s window
  of it the tests use as a voice (0.49 s).
The relative limit makes the measure independent of the level; 40 dB spans speech and the room
tone of its pauses (28-39 dB under the loudest frame in the shipped clip), so a short prompt that
starts in a pause still counts as the recording it is. The absolute floor stops a quiet transient
from counting the quantisation noise around it as signal: 16-bit dither is at -96 dBFS RMS.
This is a rule on energy over time, not a speech detector: a tone, hum or noise lasting 0.3 s passes.
"""

from __future__ import annotations

import hashlib
import io
import os
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.audio.resample import check_sample_rate, resample
from vllm_omni_token2wav.model_executor.models.audio.speaker_fbank import SPEAKER_SAMPLE_RATE, min_speaker_samples

logger = init_logger(__name__)

DEFAULT_MAX_PROMPT_SECONDS = 30.0
PROMPT_MEL_RATE = 24000
# Channels beyond this on the shorter axis of a 2-D array mean the layout is not (samples, channels).
_MAX_CHANNELS = 16
# Float input may exceed 1.0 by rounding (a float WAV written from int16 data); more is a scaling bug.
_FLOAT_PEAK_TOLERANCE = 1e-4
#: Prompts whose peak after DC removal is below this are rejected (reasons in the module docstring).
MIN_PROMPT_PEAK_DBFS = -60.0
#: Prompts below this (but above the floor) are accepted with a warning: the fbank floor clips them.
QUIET_PROMPT_PEAK_DBFS = -40.0
#: Frames of the activity rule: the fbank's (25 ms windows every 10 ms).
ACTIVITY_FRAME_SECONDS = 0.025
ACTIVITY_HOP_SECONDS = 0.010
#: A frame is active when its RMS is within this many dB of the prompt's loudest frame ...
ACTIVE_WITHIN_DB = 40.0
#: ... and at least this level (RMS, dB re full scale 1.0); reasons in the module docstring.
ACTIVE_FLOOR_DBFS = -80.0
#: Prompts with less active signal than this are refused (a click, a beep, a few transients).
MIN_ACTIVE_SECONDS = 0.3

AudioSource = str | os.PathLike[str] | bytes | bytearray | memoryview | tuple[Any, int]


@dataclass(frozen=True)
class DecodedAudio:
    """The original prompt after decoding, normalisation and mix-down (before any resampling)."""

    waveform: np.ndarray  # float32 [N] in [-1, 1]
    sample_rate: int
    origin: str  # for messages: the path, "<bytes>" or "<array>"
    truncated: bool

    @property
    def seconds(self) -> float:
        return self.waveform.shape[0] / self.sample_rate

    def digest(self) -> str:
        """sha256 over f"{rate}:" then the little-endian float32 samples: identical audio, identical key.

        The format is stable (callers hash mono arrays the same way to skip decoding on a cache hit).
        """
        h = hashlib.sha256()
        h.update(f"{self.sample_rate}:".encode())
        h.update(np.ascontiguousarray(self.waveform, dtype="<f4").tobytes())
        return h.hexdigest()


@dataclass(frozen=True)
class PromptAudio:
    """One decoded prompt at the two rates the front end needs, both resampled from the original.

    `digest` identifies the decoded original (rate + samples after mix-down/truncation), so it is a
    content key for prompt-feature caches: the same audio sent as a path, as bytes or as an array with
    the same samples hashes the same.
    """

    wav_16k: torch.Tensor  # float32 [N16] CPU, in [-1, 1]
    wav_24k: torch.Tensor  # float32 [N24] CPU, in [-1, 1]
    sample_rate: int  # of the original audio
    num_samples: int  # of the original audio (after truncation)
    digest: str
    truncated: bool

    @property
    def seconds(self) -> float:
        return self.num_samples / self.sample_rate


def _normalise_array(array: Any, origin: str) -> np.ndarray:
    """Any supported array -> float64 [N, C] in [-1, 1] (channels last)."""
    if isinstance(array, torch.Tensor):
        array = array.detach().to("cpu").numpy()
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{origin}: audio array must be a numpy array or torch tensor, got {type(array).__name__}")
    if array.ndim == 1:
        array = array[:, None]
    elif array.ndim == 2:
        if min(array.shape) > _MAX_CHANNELS:
            raise ValueError(
                f"{origin}: 2-D audio of shape {array.shape} has no channel axis (both axes > {_MAX_CHANNELS}); "
                "pass [N] mono or [N, C] / [C, N] with a few channels"
            )
        if array.shape[0] < array.shape[1]:
            array = array.T  # [C, N] -> [N, C]
    else:
        raise ValueError(f"{origin}: audio must be [N] or 2-D with a channel axis, got shape {array.shape}")
    kind = array.dtype
    if kind == np.int16:
        out = array.astype(np.float64) / 32768.0
    elif kind == np.int32:
        out = array.astype(np.float64) / 2147483648.0
    elif kind == np.int8:
        out = array.astype(np.float64) / 128.0
    elif kind == np.uint8:
        out = (array.astype(np.float64) - 128.0) / 128.0
    elif kind in (np.float16, np.float32, np.float64):
        out = array.astype(np.float64)
    else:
        raise ValueError(
            f"{origin}: unsupported audio dtype {kind}; expected int16, int32, int8, uint8, float32 or float64"
        )
    return out


def _check_samples(samples: np.ndarray, origin: str) -> None:
    """Reject empty, non-finite and out-of-range float audio ([N, C] float64)."""
    if samples.shape[0] == 0:
        raise ValueError(f"{origin}: audio is empty (0 samples)")
    finite = np.isfinite(samples)
    if not finite.all():
        raise ValueError(f"{origin}: audio contains {int((~finite).sum())} NaN/Inf sample(s)")
    peak = float(np.abs(samples).max())
    if peak > 1.0 + _FLOAT_PEAK_TOLERANCE:
        raise ValueError(
            f"{origin}: float audio peaks at {peak:.4g}, outside [-1, 1]; if these are int16 values stored as "
            "floats, divide by 32768 (or pass the int16 array itself)"
        )


class AudioTooLongError(ValueError):
    """Audio over the duration limit. The message advises the loader's own options (`max_seconds`,
    `truncate=True`); callers that do not expose them re-phrase it from `origin`, `seconds`, `max_seconds`."""

    def __init__(self, origin: str, seconds: float, max_seconds: float) -> None:
        super().__init__(
            f"{origin}: audio is {seconds:.2f} s long, over the {max_seconds:g} s limit; "
            f"trim it, raise max_seconds, or pass truncate=True to keep the first {max_seconds:g} s"
        )
        self.origin, self.seconds, self.max_seconds = origin, seconds, max_seconds


def _limit(num_samples: int, rate: int, max_seconds: float | None, truncate: bool, origin: str) -> int:
    """How many samples to keep under the duration limit (raises unless truncation was asked for)."""
    if max_seconds is None:
        return num_samples
    limit = int(max_seconds * rate)
    if num_samples <= limit:
        return num_samples
    if not truncate:
        raise AudioTooLongError(origin, num_samples / rate, max_seconds)
    logger.info("%s: truncating %.2f s of audio to the first %.2f s", origin, num_samples / rate, max_seconds)
    return limit


def _decode_pcm_wav(
    source: Any, origin: str, max_seconds: float | None, truncate: bool
) -> tuple[np.ndarray, int, bool]:
    """A PCM WAV with the standard library (no soundfile): [N, C] float64 scaled as libsndfile scales it."""
    try:
        with wave.open(source, "rb") as f:
            rate = check_sample_rate(f.getframerate(), origin)
            total, width, channels = f.getnframes(), f.getsampwidth(), f.getnchannels()
            if f.getcomptype() != "NONE" or width not in (1, 2, 3, 4):
                raise wave.Error(f"{8 * width}-bit {f.getcomptype()} samples")
            keep = _limit(total, rate, max_seconds, truncate, origin)
            raw = f.readframes(keep)
    except (wave.Error, EOFError) as exc:
        raise ValueError(
            f"{origin}: cannot decode audio without soundfile ({exc}); only PCM WAV is read by the standard "
            "library: install soundfile (pip install 'vllm-omni-token2wav[bench]') for other formats"
        ) from exc
    data = np.frombuffer(raw, dtype=np.uint8).reshape(-1, width)
    if width == 1:  # 8-bit WAV is unsigned with a 128 offset
        samples = (data[:, 0].astype(np.float64) - 128.0) / 128.0
    else:  # little-endian signed: sign-extend the top byte, scale by 2^(bits - 1)
        value = data[:, -1].astype(np.int8).astype(np.int64)
        for byte in range(width - 2, -1, -1):
            value = (value << 8) | data[:, byte].astype(np.int64)
        samples = value.astype(np.float64) / float(1 << (8 * width - 1))
    return samples.reshape(-1, channels), rate, keep < total


def _decode_file(source: Any, origin: str, max_seconds: float | None, truncate: bool) -> tuple[np.ndarray, int, bool]:
    try:
        import soundfile
    except ImportError:
        return _decode_pcm_wav(source, origin, max_seconds, truncate)
    try:
        with soundfile.SoundFile(source) as f:
            rate = check_sample_rate(f.samplerate, origin)
            total = int(f.frames)
            keep = _limit(total, rate, max_seconds, truncate, origin)
            samples = f.read(frames=keep, dtype="float64", always_2d=True)
    except soundfile.LibsndfileError as exc:
        raise ValueError(
            f"{origin}: cannot decode audio ({exc}); supported containers are libsndfile's "
            f"({', '.join(sorted(soundfile.available_formats()))})"
        ) from exc
    return samples, rate, keep < total


def decode_audio(source: AudioSource, *, max_seconds: float | None = None, truncate: bool = False) -> DecodedAudio:
    """Decode `source` to mono float32 at its native rate (rules in the module docstring)."""
    if max_seconds is not None and not (np.isfinite(max_seconds) and max_seconds > 0):
        raise ValueError(f"decode_audio: max_seconds must be a positive number or None, got {max_seconds!r}")
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        origin = str(path)
        if not path.is_file():
            raise FileNotFoundError(f"{origin}: no such audio file")
        samples, rate, truncated = _decode_file(str(path), origin, max_seconds, truncate)
    elif isinstance(source, bytes | bytearray | memoryview):
        origin = "<bytes>"
        if len(source) == 0:
            raise ValueError("<bytes>: audio is empty (0 bytes)")
        samples, rate, truncated = _decode_file(io.BytesIO(bytes(source)), origin, max_seconds, truncate)
    elif isinstance(source, tuple):
        origin = "<array>"
        if len(source) != 2:
            raise ValueError(f"<array>: expected an (array, sample_rate) tuple, got a tuple of {len(source)} items")
        array, rate_value = source
        rate = check_sample_rate(rate_value, origin)
        samples = _normalise_array(array, origin)
        keep = _limit(samples.shape[0], rate, max_seconds, truncate, origin)
        truncated = keep < samples.shape[0]
        samples = samples[:keep]
    else:
        raise ValueError(
            f"audio source must be a path, encoded bytes or an (array, sample_rate) tuple, got {type(source).__name__}"
        )
    _check_samples(samples, origin)
    mono = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
    waveform = np.clip(mono, -1.0, 1.0).astype(np.float32)
    return DecodedAudio(waveform=waveform, sample_rate=rate, origin=origin, truncated=truncated)


def peak_dbfs_after_dc_removal(waveform: np.ndarray) -> float:
    """max |x - mean(x)| in dB relative to full scale (1.0); -inf for a constant signal."""
    x = np.asarray(waveform, dtype=np.float64)
    peak = float(np.abs(x - x.mean()).max()) if x.size else 0.0
    return 20.0 * float(np.log10(peak)) if peak > 0.0 else float("-inf")


def _check_prompt_level(decoded: DecodedAudio) -> None:
    """Reject a prompt without signal (module docstring: why -60 dBFS); warn about a very quiet one."""
    level = peak_dbfs_after_dc_removal(decoded.waveform)
    if level >= MIN_PROMPT_PEAK_DBFS:
        if level < QUIET_PROMPT_PEAK_DBFS:
            logger.warning(
                "%s: prompt is very quiet (peak %.1f dBFS after DC removal); the fbank floor flattens its quiet "
                "bands and its speaker embedding drifts: normalise it to a normal speech level",
                decoded.origin,
                level,
            )
        return
    mean = float(np.mean(decoded.waveform, dtype=np.float64))
    if not np.any(decoded.waveform):
        what = "digital silence (all samples are zero)"
    elif level == float("-inf"):
        what = f"a constant signal (DC offset {mean:+.4g}, nothing else)"
    else:
        what = f"near-silent: peak {level:.1f} dBFS after removing its DC offset ({mean:+.3g})"
    raise ValueError(
        f"{decoded.origin}: prompt is {what}, below the {MIN_PROMPT_PEAK_DBFS:g} dBFS floor for prompts; its "
        "speaker features would be the fbank's constant log floor and give the same 'no speaker' embedding as "
        "any other silent prompt. Send a recording of the voice at a normal level"
    )


@dataclass(frozen=True)
class PromptActivity:
    """How much sustained signal a prompt carries (`prompt_activity`)."""

    active_frames: int
    frames: int
    loudest_dbfs: float  # RMS of the loudest frame; -inf when every frame is zero
    threshold_dbfs: float  # the level a frame needed to count: max(loudest - 40 dB, -80 dBFS)

    @property
    def active_seconds(self) -> float:
        return self.active_frames * ACTIVITY_HOP_SECONDS


def prompt_activity(waveform: np.ndarray, sample_rate: int) -> PromptActivity:
    """Active frames of `waveform` (module docstring: the rule and why its limits).

    Frames are `ACTIVITY_FRAME_SECONDS` long every `ACTIVITY_HOP_SECONDS` at the native rate, over
    the waveform minus its mean; the last frame is zero-padded so that every sample is in a frame.
    A frame's level is `10 log10(mean(x^2))` (a full-scale sine: -3 dBFS); it is active when that is
    at least `max(loudest - ACTIVE_WITHIN_DB, ACTIVE_FLOOR_DBFS)`.
    """
    x = np.asarray(waveform, dtype=np.float64).reshape(-1)
    width = max(1, round(ACTIVITY_FRAME_SECONDS * sample_rate))
    hop = max(1, round(ACTIVITY_HOP_SECONDS * sample_rate))
    count = 1 + -(-max(0, x.shape[0] - width) // hop)
    padded = np.zeros((count - 1) * hop + width, dtype=np.float64)
    padded[: x.shape[0]] = x - (x.mean() if x.size else 0.0)  # (count - 1) * hop + width >= len(x)
    frames = np.lib.stride_tricks.sliding_window_view(padded, width)[::hop]
    power = np.einsum("ij,ij->i", frames, frames) / width
    loudest = float(power.max())
    if loudest <= 0.0:
        return PromptActivity(0, count, float("-inf"), ACTIVE_FLOOR_DBFS)
    loudest_db = 10.0 * float(np.log10(loudest))
    threshold = max(loudest_db - ACTIVE_WITHIN_DB, ACTIVE_FLOOR_DBFS)
    active = int(np.count_nonzero(power >= 10.0 ** (threshold / 10.0)))
    return PromptActivity(active, count, loudest_db, threshold)


def _check_prompt_activity(decoded: DecodedAudio) -> None:
    """Reject a prompt without `MIN_ACTIVE_SECONDS` of sustained signal (module docstring: why)."""
    activity = prompt_activity(decoded.waveform, decoded.sample_rate)
    if activity.active_seconds >= MIN_ACTIVE_SECONDS:
        return
    raise ValueError(
        f"{decoded.origin}: prompt has {activity.active_seconds:.2f} s of sustained signal in its "
        f"{decoded.seconds:.2f} s, below the {MIN_ACTIVE_SECONDS:g} s minimum for a reference voice "
        f"({activity.active_frames} of {activity.frames} frames of 25 ms every 10 ms reach "
        f"{activity.threshold_dbfs:.1f} dBFS RMS: within {ACTIVE_WITHIN_DB:g} dB of the loudest frame "
        f"({activity.loudest_dbfs:.1f} dBFS) and at least {ACTIVE_FLOOR_DBFS:g} dBFS). A click, a beep or a few "
        "transients in silence do not describe a voice; send a recording of the voice speaking"
    )


def _at_rate(decoded: DecodedAudio, target_rate: int) -> torch.Tensor:
    out = resample(decoded.waveform, decoded.sample_rate, target_rate)
    np.clip(out, -1.0, 1.0, out=out)
    return torch.from_numpy(out)


def load_audio(
    source: AudioSource, target_rate: int, *, max_seconds: float | None = 30.0, truncate: bool = False
) -> torch.Tensor:
    """Mono float32 [N] CPU tensor in [-1, 1] at `target_rate`, resampled from the decoded original.

    Args:
        source: a file path, encoded bytes (any libsndfile format), or (array, sample_rate).
        target_rate: output rate in Hz.
        max_seconds: duration limit of the original audio (None: no limit).
        truncate: keep the first `max_seconds` instead of raising when the audio is longer.

    Raises:
        ValueError: undecodable/unsupported data, bad dtype or layout, implausible sample rate, empty,
            NaN/Inf, float audio outside [-1, 1], over the duration limit.
        FileNotFoundError: a path that is not a file.
    """
    target = check_sample_rate(target_rate, "load_audio (target_rate)")
    return _at_rate(decode_audio(source, max_seconds=max_seconds, truncate=truncate), target)


def load_prompt_audio(
    source: AudioSource, *, max_seconds: float | None = DEFAULT_MAX_PROMPT_SECONDS, truncate: bool = False
) -> PromptAudio:
    """Decode a voice prompt once and resample the original to 16 kHz and 24 kHz.

    On top of `load_audio`'s checks, rejects prompts the speaker model cannot use: prompts without
    signal (peak after DC removal below `MIN_PROMPT_PEAK_DBFS`: digital silence, a DC offset, noise
    at the level of rounding; their fbank is the constant log floor), prompts shorter than the
    4 fbank frames CAM++ needs (55 ms), and prompts with less than `MIN_ACTIVE_SECONDS` of sustained
    signal (`prompt_activity`: a click, a beep or a few transients in silence).
    """
    decoded = decode_audio(source, max_seconds=max_seconds, truncate=truncate)
    need = min_speaker_samples() / SPEAKER_SAMPLE_RATE
    if decoded.seconds < need:
        raise ValueError(
            f"{decoded.origin}: prompt is {1000.0 * decoded.seconds:.1f} ms long; the speaker model needs at least "
            f"{1000.0 * need:.0f} ms (4 fbank frames of 25 ms every 10 ms)"
        )
    _check_prompt_level(decoded)
    _check_prompt_activity(decoded)
    wav_16k = _at_rate(decoded, SPEAKER_SAMPLE_RATE)
    if wav_16k.shape[0] < min_speaker_samples():
        raise ValueError(
            f"{decoded.origin}: prompt gives {wav_16k.shape[0]} samples at 16 kHz; the speaker model needs "
            f"{min_speaker_samples()}"
        )
    return PromptAudio(
        wav_16k=wav_16k,
        wav_24k=_at_rate(decoded, PROMPT_MEL_RATE),
        sample_rate=decoded.sample_rate,
        num_samples=int(decoded.waveform.shape[0]),
        digest=decoded.digest(),
        truncated=decoded.truncated,
    )
