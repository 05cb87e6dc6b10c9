# SPDX-License-Identifier: Apache-2.0
"""Prompt audio loading: every source kind, normalisation, mix-down, resampling from the original, bad input."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from vllm_omni_token2wav.assets.audio import speech_sample_path
from vllm_omni_token2wav.model_executor.models.audio import load_audio, load_prompt_audio

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(scope="module")
def speech_int16() -> np.ndarray:
    samples, rate = soundfile.read(str(speech_sample_path()), dtype="int16")
    assert rate == 16000
    return samples


def _encode(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def _tone(freq: float, rate: int, seconds: float = 1.0, amplitude: float = 0.4) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return amplitude * np.sin(2 * np.pi * freq * t)


def _level_at(x: torch.Tensor, rate: int, freq: float) -> float:
    spec = np.abs(np.fft.rfft(x.numpy().astype(np.float64) * np.hanning(len(x))))
    k = int(round(freq * len(x) / rate))
    return float(spec[k - 2 : k + 3].max() / (len(x) / 4))


def test_path_bytes_and_int16_array_load_to_the_same_normalised_samples(speech_int16: np.ndarray) -> None:
    expected = torch.from_numpy(speech_int16.astype(np.float32) / 32768.0)
    from_path = load_audio(speech_sample_path(), 16000)
    from_str = load_audio(str(speech_sample_path()), 16000)
    from_bytes = load_audio(speech_sample_path().read_bytes(), 16000)
    from_array = load_audio((speech_int16, 16000), 16000)
    for got in (from_path, from_str, from_bytes, from_array):
        assert got.dtype == torch.float32 and got.ndim == 1
        assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "convert",
    [
        lambda x: x.astype(np.int32) << 16,
        lambda x: x.astype(np.float64) / 32768.0,
        lambda x: x.astype(np.float32) / 32768.0,
        lambda x: torch.from_numpy(x.astype(np.float32) / 32768.0),
    ],
    ids=["int32", "float64", "float32", "torch_float32"],
)
def test_int32_and_float_arrays_are_normalised_like_int16(convert, speech_int16: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    expected = torch.from_numpy(speech_int16.astype(np.float32) / 32768.0)
    torch.testing.assert_close(load_audio((convert(speech_int16), 16000), 16000), expected, atol=1e-7, rtol=0)


def test_uint8_pcm_is_centred_at_128() -> None:
    got = load_audio((np.array([0, 64, 128, 192, 255] * 200, dtype=np.uint8), 16000), 16000)
    np.testing.assert_allclose(got[:5].numpy(), [-1.0, -0.5, 0.0, 0.5, 127 / 128], atol=1e-7)


@pytest.mark.parametrize("layout", ["channels_last", "channels_first", "file"])
def test_stereo_is_mixed_down_to_the_channel_mean(layout: str) -> None:
    left, right = _tone(440.0, 16000, 0.5), _tone(660.0, 16000, 0.5, amplitude=0.2)
    stereo = np.stack([left, right], axis=1).astype(np.float32)
    if layout == "channels_last":
        source: object = (stereo, 16000)
    elif layout == "channels_first":
        source = (stereo.T.copy(), 16000)
    else:
        source = _encode(stereo, 16000, "FLAC", "PCM_24")
    got = load_audio(source, 16000)  # type: ignore[arg-type]
    np.testing.assert_allclose(got.numpy(), (left + right) / 2, atol=1e-6)


def test_prompt_24k_copy_is_resampled_from_the_original_not_from_16k() -> None:
    # A 10 kHz tone exists at 48 kHz and 24 kHz but not at 16 kHz (Nyquist 8 kHz).
    original = (_tone(10000.0, 48000) + _tone(1000.0, 48000)).astype(np.float32)
    prompt = load_prompt_audio(_encode(original, 48000, "WAV", "FLOAT"))
    assert prompt.sample_rate == 48000 and prompt.num_samples == 48000
    assert prompt.wav_16k.shape == (16000,) and prompt.wav_24k.shape == (24000,)
    assert _level_at(prompt.wav_24k, 24000, 10000.0) == pytest.approx(0.4, rel=0.05)
    assert _level_at(prompt.wav_16k, 16000, 1000.0) == pytest.approx(0.4, rel=0.05)
    assert prompt.wav_16k.abs().max() <= 1.0 and prompt.wav_24k.abs().max() <= 1.0


def test_prompt_digest_is_a_content_key(speech_int16: np.ndarray) -> None:
    a = load_prompt_audio(speech_sample_path())
    b = load_prompt_audio(speech_sample_path().read_bytes())
    c = load_prompt_audio((speech_int16, 16000))
    assert a.digest == b.digest == c.digest
    assert load_prompt_audio((speech_int16, 22050)).digest != a.digest, "the rate is part of the content"
    louder = (np.clip(speech_int16.astype(np.int32) * 2, -32768, 32767)).astype(np.int16)
    assert load_prompt_audio((louder, 16000)).digest != a.digest


def test_long_audio_is_rejected_unless_truncation_is_asked_for(tmp_path: Path) -> None:
    long = _tone(300.0, 16000, seconds=31.0).astype(np.float32)
    path = tmp_path / "long.wav"
    soundfile.write(path, long, 16000)
    for source in (path, (long, 16000)):
        with pytest.raises(ValueError, match=r"31.00 s long, over the 30 s limit"):
            load_audio(source, 16000)  # type: ignore[arg-type]
        cut = load_audio(source, 16000, truncate=True)  # type: ignore[arg-type]
        assert cut.shape == (30 * 16000,)
        np.testing.assert_allclose(cut.numpy(), long[: 30 * 16000], atol=1e-4)
    assert load_prompt_audio(path, truncate=True).truncated
    assert load_audio(path, 16000, max_seconds=None).shape == (31 * 16000,)
    with pytest.raises(ValueError, match="over the 2 s limit"):
        load_prompt_audio(path, max_seconds=2.0)


def test_all_zero_audio_loads_but_is_not_a_usable_prompt() -> None:
    silence = np.zeros(16000, dtype=np.int16)
    assert not load_audio((silence, 16000), 16000).any()
    with pytest.raises(ValueError, match="digital silence"):
        load_prompt_audio((silence, 16000))


def _peak_dbfs(x: np.ndarray) -> float:
    """The test's own level measure: max |x - mean| of the float waveform in dBFS."""
    x = np.asarray(x, dtype=np.float64)
    return 20 * np.log10(np.abs(x - x.mean()).max())


def _speech_at(speech_int16: np.ndarray, peak_dbfs: float) -> np.ndarray:
    x = speech_int16.astype(np.float64) / 32768.0
    return (x * 10 ** (peak_dbfs / 20) / np.abs(x - x.mean()).max()).astype(np.float32)


_RNG = np.random.default_rng(7)


@pytest.mark.parametrize(
    "wave",
    [
        pytest.param(1e-9 * _RNG.standard_normal(16000), id="noise-1e-9"),
        pytest.param(1e-6 * _RNG.standard_normal(16000), id="noise-1e-6"),
        pytest.param(0.5 + 1e-6 * _RNG.standard_normal(16000), id="dc-0.5-plus-1e-6-noise"),
        pytest.param(1e-5 * np.sin(np.arange(16000) / 5.0), id="tone-at-minus-100dBFS"),
    ],
)
def test_near_silent_prompts_are_rejected_with_their_measured_level(wave: np.ndarray) -> None:
    with pytest.raises(ValueError, match="below the -60 dBFS floor") as exc:
        load_prompt_audio((wave.astype(np.float32), 16000))
    level = _peak_dbfs(wave.astype(np.float32))
    assert f"peak {level:.1f} dBFS after removing its DC offset" in str(exc.value)
    assert "<array>" in str(exc.value)


def test_a_constant_dc_offset_is_rejected_as_a_constant_signal() -> None:
    with pytest.raises(ValueError, match=r"constant signal \(DC offset \+0.1\b.*below the -60 dBFS floor"):
        load_prompt_audio((np.full(16000, 0.1, dtype=np.float32), 16000))


def test_speech_below_the_floor_is_rejected_and_quiet_real_speech_passes(
    speech_int16: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    shipped = load_prompt_audio(str(speech_sample_path()))  # the shipped clip (-3.7 dBFS peak)
    assert shipped.wav_16k.abs().max() > 0.5
    with pytest.raises(ValueError, match=r"peak -65\.0 dBFS"):
        load_prompt_audio((_speech_at(speech_int16, -65.0), 16000))
    # The same speech 50 dB quieter, stored as int16 as a quiet recording would be: accepted, with a warning.
    quiet = np.round(_speech_at(speech_int16, -54.0).astype(np.float64) * 32768).astype(np.int16)
    assert _peak_dbfs(quiet / 32768.0) > -60
    caplog.clear()
    with caplog.at_level("WARNING", logger="vllm_omni_token2wav"):
        audio = load_prompt_audio((quiet, 16000))
    assert audio.num_samples == len(quiet)
    assert any("very quiet" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="vllm_omni_token2wav"):
        load_prompt_audio((_speech_at(speech_int16, -30.0), 16000))
    assert not any("very quiet" in r.getMessage() for r in caplog.records)


def test_prompt_shorter_than_four_fbank_frames_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"50.0 ms long; the speaker model needs at least 55 ms"):
        load_prompt_audio((_tone(300.0, 16000, seconds=0.05), 16000))
    # 55 ms passes the length check; 55 ms of anything is then too little signal to describe a voice.
    with pytest.raises(ValueError, match=r"0.04 s of sustained signal in its 0.06 s, below the 0.3 s minimum"):
        load_prompt_audio((_tone(300.0, 16000, seconds=0.055), 16000))


def _active_seconds(x: np.ndarray, rate: int) -> float:
    """The test's own activity measure, frame by frame: 25 ms frames every 10 ms of x minus its mean
    (the last zero-padded), active when mean(x^2) is within 40 dB of the loudest frame and >= -80 dBFS."""
    x = np.asarray(x, dtype=np.float64) - np.mean(x, dtype=np.float64)
    width, hop, start, levels = int(0.025 * rate), int(0.010 * rate), 0, []
    while True:
        frame = x[start : start + width]
        power = float(np.sum(frame * frame)) / width
        levels.append(10 * np.log10(power) if power > 0 else -np.inf)
        if start + width >= len(x):
            break
        start += hop
    threshold = max(max(levels) - 40.0, -80.0)
    return 0.01 * sum(level >= threshold for level in levels)


def _in_silence(events: list[tuple[float, np.ndarray]], seconds: float = 1.0, rate: int = 16000) -> np.ndarray:
    x = np.zeros(int(seconds * rate), dtype=np.float64)
    for at, event in events:
        x[int(at * rate) : int(at * rate) + event.shape[0]] += event
    return x


_CLICK = np.array([0.5])
_DITHER = (np.random.default_rng(3).triangular(-1.0, 0.0, 1.0, 16000) * 2.0**-16 * np.sqrt(6.0)).astype(np.float64)


@pytest.mark.parametrize(
    "wave",
    [
        pytest.param(_in_silence([(0.5, _CLICK)]), id="click-in-1s-of-zeros"),
        pytest.param(_in_silence([(0.5, _CLICK)]) + _DITHER, id="click-on-16bit-dither"),
        pytest.param(_in_silence([(0.5, _CLICK * 10 ** (-44 / 20))]) + _DITHER, id="click-at-minus-50dBFS-on-dither"),
        pytest.param(_in_silence([(t, _CLICK) for t in (0.1, 0.3, 0.5, 0.7, 0.9)]), id="five-clicks"),
        pytest.param(_in_silence([(0.3, _tone(1000.0, 16000, 0.1))]), id="beep-100ms"),
        pytest.param(_in_silence([(0.3, _tone(1000.0, 16000, 0.25))]), id="beep-250ms"),
        pytest.param(_in_silence([(t, _tone(1000.0, 16000, 0.06)) for t in (0.1, 0.45, 0.8)]), id="three-60ms-beeps"),
        pytest.param(_in_silence([(t, _tone(1000.0, 16000, 0.1)) for t in (0.1, 0.6)]), id="two-100ms-beeps"),
    ],
)
def test_a_click_or_beep_in_silence_is_refused_with_its_measured_active_duration(wave: np.ndarray) -> None:
    active = _active_seconds(wave.astype(np.float32), 16000)
    assert active < 0.3
    with pytest.raises(ValueError, match="below the 0.3 s minimum for a reference voice") as exc:
        load_prompt_audio((wave.astype(np.float32), 16000))
    assert str(exc.value).startswith(f"<array>: prompt has {active:.2f} s of sustained signal in its 1.00 s")
    assert "within 40 dB of the loudest frame" in str(exc.value) and "at least -80 dBFS" in str(exc.value)


def test_the_issues_click_is_refused_from_a_file_too(tmp_path: Path) -> None:
    x = np.zeros(16000, np.float32)
    x[8000] = 0.5
    path = tmp_path / "click.wav"
    soundfile.write(path, x, 16000, subtype="PCM_16")
    with pytest.raises(ValueError, match=rf"^{path}: prompt has 0.03 s of sustained signal"):
        load_prompt_audio(str(path))


@pytest.mark.parametrize("attenuation_db", [0, 20, 30, 40, 50])
def test_real_speech_passes_the_activity_rule_also_much_quieter(speech_int16: np.ndarray, attenuation_db: int) -> None:
    x = speech_int16.astype(np.float64) * 10 ** (-attenuation_db / 20)
    quiet = np.round(x).astype(np.int16)  # stored as int16, as a quiet recording would be
    active = _active_seconds(quiet / 32768.0, 16000)
    assert active >= 2.2  # of 4.0 s (docs/design/audio_frontend.md "Prompt activity": 3.95 .. 2.29 s)
    assert load_prompt_audio((quiet, 16000)).num_samples == len(quiet)


def test_speech_at_the_level_floor_and_every_short_window_the_tests_use_pass(speech_int16: np.ndarray) -> None:
    at_floor = _speech_at(speech_int16, -59.9)  # just above the -60 dBFS peak floor
    assert 1.5 <= _active_seconds(at_floor, 16000) < 2.0
    load_prompt_audio((at_floor, 16000))
    x = speech_int16.astype(np.float32) / 32768.0
    for i in range(16):  # the 0.5 s voices of the facade tests, the first starting in 0.4 s of room tone
        window = x[i * 800 : i * 800 + 8000]
        assert _active_seconds(window, 16000) >= 0.45
        load_prompt_audio((window, 16000))


def test_prompt_activity_agrees_with_the_frame_by_frame_measure(speech_int16: np.ndarray) -> None:
    from vllm_omni_token2wav.model_executor.models.audio import prompt_activity

    x = speech_int16.astype(np.float32) / 32768.0
    for wave, rate in (
        (x, 16000),
        (x[:8000] * np.float32(0.01), 16000),
        (_in_silence([(0.3, _tone(1000.0, 16000, 0.25))]).astype(np.float32), 16000),
        (_tone(200.0, 44100, 0.7).astype(np.float32), 44100),
    ):
        assert prompt_activity(wave, rate).active_seconds == pytest.approx(_active_seconds(wave, rate), abs=1e-9)


def test_a_sustained_tone_passes_the_activity_rule() -> None:
    """The rule measures energy over time, not speech: 300 ms of a tone is sustained signal."""
    beep = _in_silence([(0.3, _tone(1000.0, 16000, 0.3))]).astype(np.float32)
    assert _active_seconds(beep, 16000) >= 0.3
    load_prompt_audio((beep, 16000))


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (b"", "empty"),
        (b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk", "cannot decode"),
        (b"this is not audio at all" * 10, "cannot decode"),
        ((np.zeros(0, dtype=np.int16), 16000), "empty"),
        ((np.array([0.0, np.nan] * 100), 16000), "NaN/Inf"),
        ((np.array([0.0, np.inf] * 100), 16000), "NaN/Inf"),
        ((np.array([0.0, 3000.0] * 100), 16000), "peaks at 3000.*int16 values stored as floats"),
        ((np.zeros(1000, dtype=np.int64), 16000), "unsupported audio dtype int64"),
        ((np.zeros((2, 2, 100), dtype=np.int16), 16000), "shape"),
        ((np.zeros((100, 200), dtype=np.int16), 16000), "no channel axis"),
        ((np.zeros(1000, dtype=np.int16), 16), "16 Hz is outside"),
        ((np.zeros(1000, dtype=np.int16), 48_000_000), "outside"),
        ((np.zeros(1000, dtype=np.int16), "16000"), "number of Hz"),
        ((np.zeros(1000, dtype=np.int16), 16000, 1), "tuple of 3 items"),
        (([0.0] * 1000, 16000), "numpy array or torch tensor"),
        (12345, "path, encoded bytes or an"),
    ],
)
def test_bad_sources_raise_value_error(source: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_audio(source, 16000)  # type: ignore[arg-type]


def test_unsupported_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not audio\n" * 100)
    with pytest.raises(ValueError, match=r"notes.txt: cannot decode audio"):
        load_audio(path, 16000)
    with pytest.raises(FileNotFoundError, match="missing.wav"):
        load_audio(tmp_path / "missing.wav", 16000)


@pytest.mark.parametrize(("target", "max_seconds"), [(100, 30.0), (16000, 0.0), (16000, float("nan"))])
def test_bad_target_rate_or_limit_raises_value_error(target: int, max_seconds: float) -> None:
    with pytest.raises(ValueError):
        load_audio((np.zeros(1000, dtype=np.int16), 16000), target, max_seconds=max_seconds)


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32"])
def test_pcm_wav_decodes_without_soundfile_to_the_same_samples(
    subtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accelerator images lack soundfile: PCM WAV (what voices and the stand-ins are) still decodes, identically."""
    stereo = np.stack([_tone(440.0, 16000, 0.5), _tone(880.0, 16000, 0.5, 0.2)], axis=1)
    data = _encode(stereo, 16000, subtype=subtype)
    path = tmp_path / "voice.wav"
    path.write_bytes(data)
    with_soundfile = (load_audio(path, 16000), load_audio(data, 16000))
    monkeypatch.setitem(sys.modules, "soundfile", None)  # `import soundfile` now raises ImportError
    for got, want in zip((load_audio(path, 16000), load_audio(data, 16000)), with_soundfile, strict=True):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="<bytes>: cannot decode audio without soundfile"):
        load_audio(_encode(stereo[:, 0], 16000, fmt="FLAC"), 16000)
