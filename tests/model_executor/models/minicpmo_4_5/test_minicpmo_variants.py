# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o's two Token2Wav variants through the facade: the rules each selects, the 1.0.7 variant's
streaming against a restated minicpmo-utils 1.0.7 driver (trims, lookahead, causal vocoder, 3840 zeros),
its whole utterance through `hift_original.pt`, and asset errors that name the file and its role.

The end-to-end check against the package itself (same weights and noise) is manual:
tools/check_minicpmo_reference.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.minicpmo_reference import LEADING_ZEROS, MiniCPMOReferenceStream
from tests.helpers.token2wav import make_token2wav_dir
from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead, load_flow
from vllm_omni_token2wav.model_executor.layers.hift import load_hift
from vllm_omni_token2wav.model_executor.layers.hift.loader import HiFTLoadError
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.variants import MiniCPMOVariant
from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import MINICPMO_1_0_7_LAYOUT
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderKind

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

N_STEPS = 2
V107 = MiniCPMOVariant.MINICPMO_UTILS_1_0_7


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():
        yield


@pytest.fixture(scope="module")
def dir_107(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reduced stand-ins in minicpmo-utils 1.0.7's layout (config.yaml, causal hift.pt, hift_original.pt)."""
    return make_token2wav_dir(tmp_path_factory.mktemp("t2w107"), synthesis=True, layout=MINICPMO_1_0_7_LAYOUT)


@pytest.fixture(scope="module")
def facade_107(dir_107: Path) -> MiniCPMO45Token2wav:
    return MiniCPMO45Token2wav(dir_107, device="cpu", n_timesteps=N_STEPS, variant="minicpmo-utils-1.0.7")


def _copy(source: Path, target: Path) -> Path:
    """A private copy of a token2wav directory (resolved files) that a test may break."""
    target.mkdir()
    for entry in source.iterdir():
        shutil.copyfile(os.path.realpath(entry), target / entry.name)
    return target


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 6561, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---- the variants ---------------------------------------------------------------------------------------


def test_each_variant_selects_its_lookahead_trim_and_vocoder(token2wav_dir: Path, dir_107: Path) -> None:
    assert MiniCPMOVariant.parse(None) is MiniCPMOVariant.VLLM_OMNI_0_30  # the default
    assert MiniCPMOVariant.parse("minicpmo-utils-1.0.7") is V107 and MiniCPMOVariant.parse(V107) is V107
    with pytest.raises(ValueError, match=r"unknown MiniCPM-o token2wav variant 'minicpmo-1.0.6'; choose one of"):
        MiniCPMOVariant.parse("minicpmo-1.0.6")
    default = MiniCPMO45Token2wav(token2wav_dir)
    assert (default.stream_lookahead, default.conformer_trim, default.vocoder_kind) == (
        Lookahead.SILENCE,
        ConformerTrim.PROMPT_PLUS_TAIL,
        VocoderKind.HIFT,
    )
    core = MiniCPMO45Token2wav(dir_107, variant=V107)
    assert (core.stream_lookahead, core.conformer_trim, core.vocoder_kind) == (
        Lookahead.PROMPT_HEAD,
        ConformerTrim.PER_RATE,
        VocoderKind.CAUSAL_HIFT,
    )
    mixed = MiniCPMO45Token2wav(dir_107, variant=V107, stream_lookahead=Lookahead.SILENCE)  # one rule overridden
    assert (mixed.stream_lookahead, mixed.conformer_trim) == (Lookahead.SILENCE, ConformerTrim.PER_RATE)


def test_1_0_7_variant_streams_like_the_minicpmo_utils_driver(
    facade_107: MiniCPMO45Token2wav, dir_107: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    """Five chunks with a 1.5 s prompt: both conformer and estimator caches are trimmed from chunk 3 on."""
    tokens = _tokens(25 * 5 + 10, seed=3)
    state = facade_107.set_stream_cache(short_speech)
    features = facade_107.prepare_prompt(short_speech, with_tokens=True)
    driver = MiniCPMOReferenceStream(dir_107, features, n_timesteps=N_STEPS)
    chunks = list(stream_chunks(tokens))
    got, want = [], []
    for chunk, last in chunks:
        got.append(facade_107.stream(chunk, None, last, True, state=state))
        want.append(driver.stream(chunk, last))
    assert driver.cache.conformer_frames == features.prompt_mel.shape[1] + 100  # the trims really ran
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert torch.equal(got[0][:, :LEADING_ZEROS], torch.zeros(1, LEADING_ZEROS)) and got[0][:, LEADING_ZEROS:].any()
    assert sum(a.shape[-1] for a in got) == LEADING_ZEROS + 960 * len(tokens)
    assert state.finished


def test_an_empty_last_call_flushes_the_causal_vocoder(
    facade_107: MiniCPMO45Token2wav, token2wav_dir: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    tokens = _tokens(25 * 2 + 3, seed=4)  # two non-final chunks, then the producer ends without tokens
    state = facade_107.set_stream_cache(short_speech)
    pieces = [facade_107.stream(c, None, False, True, state=state) for c, last in stream_chunks(tokens) if not last]
    tail = facade_107.stream([], None, True, True, state=state)
    assert isinstance(tail, torch.Tensor) and tail.shape == (1, 8 * 480)  # the 8 frames the stream held back
    assert sum(p.shape[-1] for p in pieces) + tail.shape[-1] == LEADING_ZEROS + 960 * 50 and state.finished
    default = MiniCPMO45Token2wav(token2wav_dir, device="cpu", n_timesteps=N_STEPS)
    with pytest.raises(ValueError, match="empty token list"):  # the HiFT path keeps rejecting it
        default.stream([], None, True, True, state=default.set_stream_cache(short_speech))


def test_1_0_7_whole_utterance_is_the_flow_then_hift_original(
    facade_107: MiniCPMO45Token2wav, dir_107: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    tokens = _tokens(40, seed=5)
    got = facade_107(tokens, short_speech, seed=9)
    features = facade_107.prepare_prompt(short_speech, with_tokens=True)
    flow = load_flow((dir_107 / "flow.yaml", dir_107 / "flow.pt"), device="cpu")
    ids = torch.tensor([tokens])
    mel = flow.inference(
        ids,
        torch.tensor([40]),
        features.prompt_tokens,
        features.prompt_token_len,
        features.prompt_mel,
        features.prompt_mel_len,
        features.speaker_embedding,
        n_timesteps=N_STEPS,
    )
    with torch.inference_mode():
        want, _ = load_hift(dir_107 / "hift_original.pt", device="cpu")(mel, generator=torch.Generator().manual_seed(9))
    assert got.shape == (1, 960 * 40)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


# ---- assets -------------------------------------------------------------------------------------------------


def test_without_hift_original_streaming_works_and_a_whole_utterance_names_the_file(
    dir_107: Path, tmp_path: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    folder = _copy(dir_107, tmp_path / "t2w")
    (folder / "hift_original.pt").unlink()
    facade = MiniCPMO45Token2wav(folder, device="cpu", n_timesteps=N_STEPS, variant=V107)  # construction is fine
    state = facade.set_stream_cache(short_speech)
    assert facade.stream(_tokens(12, seed=1), None, True, True, state=state).shape == (1, 960 * 12)  # type: ignore[union-attr]
    with pytest.raises(FileNotFoundError, match=r"hift_original\.pt is missing.*vocodes whole utterances"):
        facade(_tokens(12, seed=1), short_speech)


def test_a_directory_without_config_yaml_is_refused_at_construction(dir_107: Path, tmp_path: Path) -> None:
    folder = _copy(dir_107, tmp_path / "t2w")
    (folder / "config.yaml").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.yaml is missing.*MiniCPM-o variant vllm-omni-0\.30"):
        MiniCPMO45Token2wav(folder, variant=V107)


def test_each_vocoder_file_must_hold_the_vocoder_of_its_role(
    dir_107: Path, token2wav_dir: Path, tmp_path: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    swapped = _copy(dir_107, tmp_path / "swapped")
    (swapped / "hift.pt").rename(swapped / "causal.pt")
    (swapped / "hift_original.pt").rename(swapped / "hift.pt")
    (swapped / "causal.pt").rename(swapped / "hift_original.pt")
    with pytest.raises(HiFTLoadError, match=r"conv_pre kernel is 7, expected 5.*hift\.pt is the causal vocoder"):
        MiniCPMO45Token2wav(swapped, device="cpu", variant=V107).load()
    causal_whole = _copy(dir_107, tmp_path / "causal_whole")
    shutil.copyfile(causal_whole / "hift.pt", causal_whole / "hift_original.pt")
    facade = MiniCPMO45Token2wav(causal_whole, device="cpu", n_timesteps=N_STEPS, variant=V107)
    with pytest.raises(HiFTLoadError, match=r"conv_pre kernel is 5, expected 7.*hift_original\.pt must hold the non"):
        facade(_tokens(8, seed=2), short_speech)
    # The default variant on a 1.0.7 directory: hift.pt is the causal one; the error says which variant fits.
    with pytest.raises(HiFTLoadError, match=r"has config\.yaml: a minicpmo-utils 1\.0\.7 directory.*CAUSAL_HIFT"):
        MiniCPMO45Token2wav(dir_107, device="cpu").load()
    del token2wav_dir


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (("fmax: 8000", "fmax: null"), r"feat_extractor fmax=None \(needs 8000\)"),
        (("conv_pre_look_right: 4", "conv_pre_look_right: 3"), r"streaming delay of 7 frames.*requires\) 8"),
        (
            ("base_channels: 32", "base_channels: 64"),
            r"does not describe .*base_channels: config\.yaml 64, hift\.pt 32",
        ),
        (("__set_seed3: !apply:torch.manual_seed [1986]", "__set_seed3: 7"), None),
    ],
    ids=["cosyvoice3-mel", "delay", "sizes", "seed-line-removed"],
)
def test_config_yaml_is_checked_like_the_reference_loader(
    dir_107: Path, tmp_path: Path, edit: tuple[str, str], match: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _copy(dir_107, tmp_path / "t2w")
    text = (folder / "config.yaml").read_text()
    assert edit[0] in text
    (folder / "config.yaml").write_text(text.replace(*edit))
    facade = MiniCPMO45Token2wav(folder, device="cpu", variant=V107)
    if match is None:  # no seed before the vocoder: CosyVoice's 1986 is assumed, with a warning
        facade.load()
        assert "seeds nothing before building `hift`" in caplog.text
        return
    with pytest.raises(ValueError, match=match):
        facade.load()
