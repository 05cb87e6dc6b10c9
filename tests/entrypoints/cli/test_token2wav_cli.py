# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav token2wav`: token parsing, user errors (exit 2, one line), WAV output of both paths."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soundfile

from vllm_omni_token2wav.cli_types import CLIUsageError
from vllm_omni_token2wav.entrypoints.cli.main import main
from vllm_omni_token2wav.entrypoints.cli.token2wav import parse_tokens

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_parse_tokens_accepts_lists_and_seeded_random() -> None:
    assert parse_tokens("1, 2,3\n4 5") == [1, 2, 3, 4, 5]
    random = parse_tokens("random:30:7")
    assert len(random) == 30 and random == parse_tokens("random:30:7") and all(0 <= t < 6561 for t in random)
    for text, match in (("", "no speech tokens"), ("1,x", "'x' is not an integer"), ("1,6561", "6561 is outside")):
        with pytest.raises(CLIUsageError, match=match):
            parse_tokens(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tokens", "1,2", "--out", "{tmp}/a.wav"], "give --model-dir DIR"),
        (["--tokens", "1,2", "--model-dir", "{tmp}/none", "--out", "{tmp}/a.wav"], "is not a directory"),
        (["--tokens", "1,2", "--standin", "reduced", "--out", "{tmp}/no/a.wav"], "does not exist"),
        (["--tokens", "1,2", "--standin", "reduced", "--prompt", "{tmp}/p.wav", "--out", "{tmp}/a.wav"], "--prompt"),
        (["--tokens-file", "{tmp}/t.txt", "--standin", "reduced", "--out", "{tmp}/a.wav"], "--tokens-file"),
        (["--tokens", "1", "--standin", "reduced", "--n-timesteps", "0", "--out", "{tmp}/a.wav"], "--n-timesteps"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["token2wav", *[a.format(tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-omni-token2wav: error:") and message in err[0]


@pytest.mark.parametrize("stream", [False, True])
def test_writes_a_24k_wav_of_the_expected_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stream: bool
) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(" ".join(str(t) for t in parse_tokens("random:33:1")))
    out = tmp_path / "reply.wav"
    argv = ["token2wav", "--tokens-file", str(tokens), "--standin", "reduced", "--n-timesteps", "2", "--device", "cpu"]
    argv += ["--out", str(out)]
    assert main(argv + (["--stream"] if stream else [])) == 0
    audio, rate = soundfile.read(out, dtype="int16")
    assert rate == 24000 and audio.shape == (33 * 960,) and np.any(audio)
    printed = capsys.readouterr().out
    assert f"wrote {out}: 33 tokens -> 1.32 s" in printed
    assert ("chunk 1: 8 tokens" in printed) == stream
    # The stand-in's audio is noise: stdout says so before anyone listens to it.
    assert "RANDOM weights" in printed and "not speech" in printed


@pytest.mark.parametrize("out", ["{tmp}", "{tmp}/readonly/a.wav"])
def test_an_unusable_out_path_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, out: str
) -> None:
    from vllm_omni_token2wav.entrypoints.cli import token2wav

    def must_not_run(*args: object) -> int:
        raise AssertionError("synthesis started although --out cannot be written")

    monkeypatch.setattr(token2wav, "_synthesise", must_not_run)
    (tmp_path / "readonly").mkdir(mode=0o555)
    if os.access(tmp_path / "readonly", os.W_OK):  # root ignores the mode bits
        monkeypatch.setattr(token2wav.os, "access", lambda path, mode: Path(path).name != "readonly")
    assert main(["token2wav", "--tokens", "1,2", "--standin", "reduced", "--out", out.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-omni-token2wav: error: --out")
    assert ("is a folder" in err[0]) == (out == "{tmp}") and ("not writable" in err[0]) == (out != "{tmp}")


def _forbid_synthesis(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_omni_token2wav.entrypoints.cli import token2wav

    def must_not_run(*args: object) -> int:
        raise AssertionError("synthesis started although the command line should have been refused")

    monkeypatch.setattr(token2wav, "_synthesise", must_not_run)
    monkeypatch.setattr(token2wav, "_synthesise_cosyvoice3", must_not_run)


@pytest.mark.parametrize("family", ["step_audio2", "cosyvoice3"])
@pytest.mark.parametrize(
    ("name", "kind"), [("x.mp9", "'.mp9' name"), ("reply.mp3", "'.mp3' name"), ("reply", "without")]
)
def test_an_out_name_that_is_not_wav_is_refused_before_any_work(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    name: str,
    kind: str,
) -> None:
    _forbid_synthesis(monkeypatch)
    argv = ["token2wav", "--family", family, "--tokens", "1,2", "--standin", "reduced", "--out", str(tmp_path / name)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and err[0].startswith(f"vllm-omni-token2wav: error: --out {tmp_path / name}: ") and kind in err[0]
    )
    assert "the output is a WAV file" in err[0] and f"(e.g. {tmp_path / Path(name).stem}.wav)" in err[0]
    assert not any(tmp_path.iterdir())


def test_a_wav_name_in_any_case_is_a_usable_out(tmp_path: Path) -> None:
    from vllm_omni_token2wav.entrypoints.cli.token2wav import _check_out

    for name in ("reply.wav", "REPLY.WAV", "take.2.Wav"):
        _check_out(tmp_path / name)  # no error


@pytest.mark.parametrize("family", ["step_audio2", "cosyvoice3"])
def test_a_click_as_the_prompt_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    _forbid_synthesis(monkeypatch)
    click = np.zeros(16000, np.float32)
    click[8000] = 0.5
    prompt = tmp_path / "click.wav"
    soundfile.write(prompt, click, 16000, subtype="PCM_16")
    argv = ["token2wav", "--family", family, "--tokens", "1,2", "--standin", "reduced", "--prompt", str(prompt)]
    argv += ["--prompt-tokens", "1,2,3"] if family == "cosyvoice3" else []
    assert main([*argv, "--out", str(tmp_path / "a.wav")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"vllm-omni-token2wav: error: --prompt: {prompt}: prompt has 0.03 s of sustained"
    )
    assert "below the 0.3 s minimum for a reference voice" in err[0]
    assert not (tmp_path / "a.wav").exists()


@pytest.mark.parametrize("stream", [False, True])
def test_cosyvoice3_writes_a_24k_wav_from_token_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stream: bool
) -> None:
    out = tmp_path / "reply.wav"
    argv = ["token2wav", "--family", "cosyvoice3", "--tokens", "random:60:2", "--standin", "reduced"]
    argv += ["--n-timesteps", "2", "--device", "cpu", "--out", str(out)]
    assert main(argv + (["--stream"] if stream else [])) == 0
    audio, rate = soundfile.read(out, dtype="int16")
    assert rate == 24000 and audio.shape == (60 * 960,) and np.any(audio)
    printed = capsys.readouterr().out
    assert "60 tokens -> 2.40 s" in printed and "stand-in CosyVoice3 directory with RANDOM weights" in printed
    assert ("chunk 1:" in printed) == stream


def test_cosyvoice3_prompt_needs_its_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_omni_token2wav.assets.audio import speech_sample

    wav, rate = speech_sample()
    clip = tmp_path / "voice.wav"
    soundfile.write(clip, wav[:rate], rate)
    common = ["token2wav", "--tokens", "1,2", "--standin", "reduced", "--out", str(tmp_path / "a.wav")]
    assert main([*common, "--family", "cosyvoice3", "--prompt", str(clip)]) == 2
    assert "needs the prompt's speech tokens" in capsys.readouterr().err
    assert main([*common, "--prompt-tokens", "1,2"]) == 2
    assert "are for --family cosyvoice3" in capsys.readouterr().err
    assert (
        main(
            [*common, "--family", "cosyvoice3", "--prompt", str(clip), "--prompt-tokens", "1,2,3", "--n-timesteps", "1"]
        )
        == 0
    )


def test_minicpmo_streams_with_its_own_facade_and_rules(tmp_path: Path) -> None:
    """`--family minicpmo_4_5` builds MiniCPM-o's facade (`facade_class`) with its stream rules (3 silence tokens as
    the prompt's lookahead, conformer cache trimmed): its stream equals that facade's own, and differs from
    Step-Audio2's on the same assets (whose lookahead is the prompt's first tokens)."""
    from vllm_omni_token2wav.assets.audio import speech_sample
    from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.family import MINICPMO_4_5
    from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2WavCore
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir
    from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

    tokens = parse_tokens("random:40:3")
    written = {}
    for family in ("minicpmo_4_5", "step_audio2"):
        out = tmp_path / f"{family}.wav"
        argv = ["token2wav", "--tokens", ",".join(map(str, tokens)), "--standin", "reduced", "--family", family]
        assert main([*argv, "--n-timesteps", "2", "--device", "cpu", "--stream", "--out", str(out)]) == 0
        written[family], _ = soundfile.read(out, dtype="float32")
    facade = MiniCPMO45Token2WavCore(
        ensure_standin_token2wav_dir(reduced=True),
        device="cpu",
        n_timesteps=2,
        seed=0,
        stream_lookahead=MINICPMO_4_5.lookahead,
        conformer_trim=MINICPMO_4_5.conformer_trim,
    )
    state = facade.set_stream_cache(speech_sample())
    pieces = [facade.stream(c, last_chunk=last, return_waveform=True, state=state) for c, last in stream_chunks(tokens)]
    expected = np.concatenate([p.reshape(-1).numpy() for p in pieces])
    assert written["minicpmo_4_5"].shape == expected.shape == (40 * 960,)
    assert np.max(np.abs(written["minicpmo_4_5"] - np.clip(expected, -1, 1))) <= 2 / 32768  # 16-bit PCM
    assert np.max(np.abs(written["minicpmo_4_5"] - written["step_audio2"])) > 1e-3  # the family's rules apply
