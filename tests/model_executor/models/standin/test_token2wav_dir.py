# SPDX-License-Identifier: Apache-2.0
"""The stand-in token2wav directory: complete, loadable by the real loaders, cached, refreshed when stale."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_token2wav.model_executor.models.standin import token2wav_dir as standin

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

REPO_ROOT = Path(__file__).resolve().parents[4]
VOICES = {"HT_ref_audio.wav", "default_female.wav"}  # the stage models' default-voice names
FILES = {"campplus.onnx", "speech_tokenizer_v2_25hz.onnx", "flow.yaml", "flow.pt", "hift.pt"} | VOICES


def test_reduced_standin_directory_loads_with_the_strict_loaders() -> None:
    from vllm_omni_token2wav.model_executor.layers.flow import load_flow
    from vllm_omni_token2wav.model_executor.layers.hift import load_hift
    from vllm_omni_token2wav.model_executor.layers.speech_tokenizer import load_speech_tokenizer_from_onnx
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import load_campplus_from_onnx

    directory = standin.ensure_standin_token2wav_dir(reduced=True)
    assert FILES <= {p.name for p in directory.iterdir()}
    assert standin.ensure_standin_token2wav_dir(reduced=True) == directory  # cached
    campplus = load_campplus_from_onnx(directory / "campplus.onnx")
    assert campplus.state_dict()["xvector.dense.linear.weight"].shape[0] == 192  # the flow needs 192-d
    flow = load_flow(directory, device="cpu")
    assert flow.input_embedding.num_embeddings == 6561
    assert load_hift(directory / "hift.pt", device="cpu").config.in_channels == 80
    load_speech_tokenizer_from_onnx(directory / "speech_tokenizer_v2_25hz.onnx", device="cpu")


def test_the_default_voices_are_the_shipped_speech_clip_at_24k() -> None:
    import numpy as np
    import soundfile

    from vllm_omni_token2wav.assets.audio import speech_sample
    from vllm_omni_token2wav.model_executor.models import audio as frontend

    directory = standin.ensure_standin_token2wav_dir(reduced=True)
    clip, rate = speech_sample()
    expected = frontend.load_audio((clip, rate), 24000).numpy()
    for name in VOICES:
        wav, voice_rate = soundfile.read(str(directory / name), dtype="float32")
        assert voice_rate == 24000 and wav.ndim == 1 and wav.shape == expected.shape
        np.testing.assert_allclose(wav, expected, atol=1 / 32768 + 1e-6)  # 16-bit PCM of the 24 kHz copy


def test_default_voice_is_the_same_file_without_soundfile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard-library writer (accelerator images lack soundfile) gives libsndfile's bytes exactly."""
    import numpy as np

    with_soundfile = standin.default_voice_wav()
    monkeypatch.setitem(sys.modules, "soundfile", None)  # `import soundfile` now raises ImportError
    assert standin.default_voice_wav() == with_soundfile
    edges = np.array([1.0, -1.0, 0.5 / 32768, -0.5 / 32768, 2.5 / 32768, -0.99999], dtype=np.float32)
    monkeypatch.undo()
    import soundfile

    pcm, _ = soundfile.read(io.BytesIO(standin.pcm16_wav(edges, 24000)), dtype="int16")
    assert pcm.tolist() == [32767, -32768, 0, -1, 2, -32768]  # floor(x * 32768), clipped: libsndfile's rounding


def test_write_fills_a_directory_of_the_callers_choice(tmp_path: Path) -> None:
    target = standin.write_standin_token2wav_dir(tmp_path / "t2w", reduced=True)
    cached = standin.ensure_standin_token2wav_dir(reduced=True)
    assert {p.name for p in target.iterdir()} == FILES
    for name in FILES:
        assert (target / name).read_bytes() == (cached / name).read_bytes()


def test_a_regenerated_component_refreshes_the_cached_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path / "cache"))
    sources = {}
    for name in FILES:
        sources[name] = tmp_path / f"v1-{name}"
        sources[name].write_bytes(b"v1 " + name.encode())
    monkeypatch.setattr(standin, "_component_files", lambda **_: dict(sources))
    directory = standin.ensure_standin_token2wav_dir(reduced=True, seed=3)
    assert (directory / "hift.pt").read_bytes() == b"v1 hift.pt"
    sources["hift.pt"] = tmp_path / "v2-hift.pt"
    sources["hift.pt"].write_bytes(b"v2")
    assert standin.ensure_standin_token2wav_dir(reduced=True, seed=3) == directory
    assert (directory / "hift.pt").read_bytes() == b"v2"


def test_voices_written_with_another_resampler_are_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory assembled where the front end resampled differently (the device check's soxr stand-in on
    an image without python-soxr) must not be served as current where python-soxr resamples."""
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path / "cache"))
    sources = {}
    for name in FILES - VOICES:
        sources[name] = tmp_path / name
        sources[name].write_bytes(name.encode())
    monkeypatch.setattr(standin, "_component_files", lambda **_: dict(sources))
    monkeypatch.setattr(standin, "_voice_files", lambda: dict.fromkeys(VOICES, b"resampled by scipy"))
    directory = standin.ensure_standin_token2wav_dir(reduced=True, seed=5)
    assert {(directory / name).read_bytes() for name in VOICES} == {b"resampled by scipy"}
    monkeypatch.setattr(standin, "_voice_files", lambda: dict.fromkeys(VOICES, b"resampled by soxr"))
    assert standin.ensure_standin_token2wav_dir(reduced=True, seed=5) == directory
    assert {(directory / name).read_bytes() for name in VOICES} == {b"resampled by soxr"}


def test_cli_prints_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_omni_token2wav.model_executor.models.standin.token2wav_dir",
            "--reduced",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    assert {p.name for p in out.iterdir()} == FILES
