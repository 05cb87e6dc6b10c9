# SPDX-License-Identifier: Apache-2.0
"""Reference-voice normalisation, voice identities, and the per-family asset / default-voice lookup."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.models import audio as frontend
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import (
    MINICPMO_4_5,
    STEP_AUDIO2,
    default_voice_candidates,
    find_default_voice,
    resolve_token2wav_dir,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import (
    check_reference_seconds,
    normalize_reference,
    requested_voice,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_reference_audio_is_24k_mono_of_fixed_length(speech: tuple[np.ndarray, int]) -> None:
    wav, rate = speech  # 16 kHz mono, ~4 s
    stereo = np.stack([wav, wav], axis=1)
    out = normalize_reference((stereo, rate), 6.0)
    assert out.shape == (144_000,) and out.dtype == np.float32
    expected = frontend.load_audio((wav, rate), 24000).numpy()  # the front end's own 24 kHz copy
    np.testing.assert_allclose(out[: expected.shape[0]], expected, atol=1e-6)
    assert not np.any(out[expected.shape[0] :])  # zero-padded to 6 s
    short = normalize_reference((wav, rate), 2.5)  # cut the original at 2.5 s, then resample
    expected_short = frontend.load_audio((wav, rate), 24000, max_seconds=2.5, truncate=True).numpy()
    assert short.shape == (60_000,) == expected_short.shape
    np.testing.assert_allclose(short, expected_short, atol=1e-6)
    with pytest.raises(ValueError, match=r"ref_audio_max_seconds must be in \[0.5, 16.0\] s"):
        check_reference_seconds(0.2)


def test_voice_identities_need_no_decoding(tmp_path: Path) -> None:
    wav = np.linspace(-0.5, 0.5, 800, dtype=np.float32)
    a = requested_voice(torch.from_numpy(wav), 16000, None)
    b = requested_voice(wav.tolist(), torch.tensor(16000), "/ignored/when/ref/is/given.wav")
    c = requested_voice(wav, 24000, None)
    assert a is not None and b is not None and c is not None
    assert a.key == b.key != c.key and a.source[1] == 16000 and a.label == "reference audio (800 samples at 16000 Hz)"
    file = tmp_path / "v.wav"
    file.write_bytes(b"RIFF")
    p = requested_voice(None, None, str(file))
    assert p is not None and p.key.startswith(f"path:{file.resolve()}:4:") and p.source == str(file)
    raw = requested_voice(None, None, b"RIFF....")
    assert raw is not None and raw.key.startswith("bytes:") and raw.source == b"RIFF...."
    assert requested_voice(None, None, None) is None
    with pytest.raises(ValueError, match="meta.ref_audio_sr is 0"):
        requested_voice(wav, 0, None)
    with pytest.raises(ValueError, match="meta.prompt_wav must be a path or encoded audio bytes, got int"):
        requested_voice(None, None, 3)


def test_the_token2wav_folder_is_resolved_from_each_layout(tmp_path: Path) -> None:
    def assets(folder: Path) -> Path:
        folder.mkdir(parents=True)
        for name in ("flow.yaml", "flow.pt", "hift.pt"):
            (folder / name).write_bytes(b"")
        return folder

    assert resolve_token2wav_dir(assets(tmp_path / "a")) == tmp_path / "a"
    assert assets(tmp_path / "b" / "token2wav") == resolve_token2wav_dir(tmp_path / "b")
    assert assets(tmp_path / "c" / "assets" / "token2wav") == resolve_token2wav_dir(tmp_path / "c")
    (tmp_path / "d" / "token2wav").mkdir(parents=True)  # incomplete: the core's asset check names the file
    assert resolve_token2wav_dir(tmp_path / "d") == tmp_path / "d" / "token2wav"
    with pytest.raises(FileNotFoundError, match="no token2wav assets for model"):
        resolve_token2wav_dir(tmp_path / "e")


def test_default_voices_are_looked_up_like_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, t2w = tmp_path / "m", tmp_path / "m" / "token2wav"
    monkeypatch.delenv("STEP_AUDIO2_DEFAULT_PROMPT_WAV", raising=False)
    assert default_voice_candidates(MINICPMO_4_5, root, t2w) == [
        root / "assets" / "HT_ref_audio.wav",
        root / "HT_ref_audio.wav",
        t2w / "HT_ref_audio.wav",
    ]
    monkeypatch.setenv("STEP_AUDIO2_DEFAULT_PROMPT_WAV", "/env/voice.wav")
    assert default_voice_candidates(STEP_AUDIO2, root, t2w, "/opt/override.wav")[:3] == [
        Path("/opt/override.wav"),
        Path("/env/voice.wav"),
        root / "assets" / "default_female.wav",
    ]
    (root / "assets").mkdir(parents=True)
    (root / "default_female.wav").write_bytes(b"x")  # the env file does not exist: the next candidate wins
    assert find_default_voice(STEP_AUDIO2, root, t2w) == root / "default_female.wav"
    with pytest.raises(FileNotFoundError, match="minicpmo_4_5 token2wav stage: no default voice"):
        find_default_voice(MINICPMO_4_5, root, t2w)


def test_every_registered_family_lives_in_its_own_folder() -> None:
    """One list line per family; its record comes from its folder, and the framework's names resolve to it."""
    from vllm_omni_token2wav.model_executor.models.token2wav_stage import families

    assert [f.name for f in families.registered_families()] == ["minicpmo_4_5", "step_audio2", "cosyvoice3"]
    for module, entry in zip(families.FAMILY_MODULES, families.registered_families(), strict=True):
        assert module == f"vllm_omni_token2wav.model_executor.models.{entry.name}.family"
        spec = families.family_spec(entry.name)
        assert spec is entry.spec and spec.name == entry.name
        assert getattr(families, entry.name.upper()) is spec
        assert families.FAMILY_SPECS[entry.name] is spec
    with pytest.raises(ValueError, match="registered: minicpmo_4_5, step_audio2, cosyvoice3"):
        families.family_spec("tortoise")
    with pytest.raises(AttributeError):
        _ = families.NOT_A_FAMILY
