# SPDX-License-Identifier: Apache-2.0
"""The stand-in token2wav folder as vLLM-Omni 0.30's own code loads it: every upstream loader, unchanged.

A stand-in only proves something about the real files if the reference loaders accept it. vLLM-Omni
0.30's `StepAudio2Token2WavCore._ensure_models_loaded` (which MiniCPM-o's code2wav stage also runs)
reads the folder with `s3tokenizer.load_model` (an ONNX-to-torch converter that finds weights by the
shipped export's names and builds the shipped 1280-wide encoder), an onnxruntime session on
`campplus.onnx`, `hyperpyyaml` on `flow.yaml` then a strict `load_state_dict(flow.pt)`, and its
hard-coded full-size HiFT with a strict load of `hift.pt` (`generator.` stripped). Each is called
here exactly as upstream calls it, on `ensure_standin_token2wav_dir(reduced=True,
upstream_compatible=True)` (tokenizer and HiFT at real size, flow reduced); then upstream's classes
themselves run on it: the Step-Audio2 core (one utterance) and MiniCPM-o's code2wav stage model,
built outside the engine from a minimal config, decoding a batch of two streams.

`flow.yaml` names its classes `cosyvoice2.flow.flow.CausalMaskedDiffWithXvec` etc.: upstream users get
those from Step-Audio2's code, here `stepaudio2-minicpmo` (installed by tools/install_engine_cpu.sh),
whose `Token2wav` registers `stepaudio2.cosyvoice2` as `cosyvoice2`; the `cosyvoice2_alias` fixture
calls that same function. Needs the engine venv; skipped without it, an error under CI.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.engine import require_engine
from tests.helpers.token2wav import assert_embeddings_close, campplus_reference

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine, pytest.mark.slow]

require_engine(
    "upstream's token2wav loaders on the stand-in folder",
    extra=("s3tokenizer", "hyperpyyaml", "onnxruntime", "stepaudio2-minicpmo"),
)

TOKENIZER = "speech_tokenizer_v2_25hz.onnx"
SAMPLES_PER_TOKEN = 2 * 480  # two mel frames per token, 480 samples per frame at 24 kHz


@pytest.fixture(scope="module")
def upstream_dir() -> Path:
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

    return ensure_standin_token2wav_dir(reduced=True, upstream_compatible=True)


@pytest.fixture(scope="module")
def cosyvoice2_alias() -> Iterator[None]:
    """`cosyvoice2.*` importable the way stepaudio2-minicpmo's Token2wav makes it (removed afterwards)."""
    from stepaudio2.token2wav import _setup_cosyvoice2_alias

    before = {name for name in sys.modules if name.split(".")[0] == "cosyvoice2"}
    _setup_cosyvoice2_alias()
    yield
    for name in [n for n in sys.modules if n.split(".")[0] == "cosyvoice2" and n not in before]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def speech_16k() -> torch.Tensor:
    from vllm_omni_token2wav.assets.audio import speech_sample

    samples, rate = speech_sample()
    assert rate == 16000
    return torch.from_numpy(samples).float()


def test_s3tokenizer_converts_the_speech_tokenizer_and_agrees_with_onnxruntime(
    upstream_dir: Path, speech_16k: torch.Tensor
) -> None:
    import onnxruntime
    import s3tokenizer

    from vllm_omni_token2wav.model_executor.layers.speech_tokenizer import (
        load_speech_tokenizer_from_onnx,
    )

    path = upstream_dir / TOKENIZER
    model = s3tokenizer.load_model(str(path)).eval()  # strict load_state_dict inside
    # The same weights as the in-tree loader reads by graph structure, under the same names.
    ours = load_speech_tokenizer_from_onnx(path, device="cpu").state_dict()
    theirs = model.state_dict()
    assert sorted(theirs) == sorted(ours)
    for key, value in theirs.items():
        assert torch.equal(value, ours[key]), key
    # s3tokenizer's torch encoder computes what the exported graph computes: the same codes on speech.
    mels, lengths = s3tokenizer.padding([s3tokenizer.log_mel_spectrogram(speech_16k)])
    with torch.no_grad():
        codes, code_lengths = model.quantize(mels, lengths)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_codes = session.run(None, {"feats": mels.numpy(), "feats_length": lengths.numpy().astype(np.int32)})[0]
    n = int(code_lengths[0])
    assert n == speech_16k.numel() // 640
    np.testing.assert_array_equal(codes[0, :n].numpy(), ort_codes[0, :n])
    assert len(set(ort_codes[0, :n].tolist())) > n // 4  # a tokenizer, not a constant


def test_campplus_runs_in_the_session_upstream_builds(upstream_dir: Path, speech_16k: torch.Tensor) -> None:
    import onnxruntime
    import torchaudio.compliance.kaldi as kaldi

    option = onnxruntime.SessionOptions()
    option.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    option.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(upstream_dir / "campplus.onnx"), sess_options=option, providers=["CPUExecutionProvider"]
    )
    feat = kaldi.fbank(speech_16k.unsqueeze(0), num_mel_bins=80, dither=0, sample_frequency=16000)
    feat = feat - feat.mean(dim=0, keepdim=True)
    embedding = session.run(None, {session.get_inputs()[0].name: feat[None].numpy()})[0]
    assert embedding.shape == (1, 192)
    assert_embeddings_close(torch.from_numpy(embedding), campplus_reference(feat), rel_l2=1e-4, min_cosine=0.999999)


def test_hyperpyyaml_builds_the_flow_and_flow_pt_loads_strictly(upstream_dir: Path, cosyvoice2_alias: None) -> None:
    from hyperpyyaml import load_hyperpyyaml

    with open(upstream_dir / "flow.yaml") as f:
        flow = load_hyperpyyaml(f)["flow"]
    assert type(flow).__module__.endswith("cosyvoice2.flow.flow")
    state = torch.load(upstream_dir / "flow.pt", map_location="cpu", weights_only=True)
    flow.load_state_dict(state, strict=True)
    assert sum(p.numel() for p in flow.parameters()) == sum(v.numel() for v in state.values())


def test_upstream_hift_loads_hift_pt_strictly(upstream_dir: Path) -> None:
    from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import _build_hift

    hift = _build_hift()
    state = torch.load(upstream_dir / "hift.pt", map_location="cpu", weights_only=True)
    hift.load_state_dict({k.replace("generator.", ""): v for k, v in state.items()}, strict=True)


def test_step_audio2_core_synthesises_from_the_standin(upstream_dir: Path, cosyvoice2_alias: None) -> None:
    from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore

    core = StepAudio2Token2WavCore(str(upstream_dir), device="cpu", n_timesteps=2)
    tokens = [(37 * i + 11) % 6561 for i in range(40)]
    wav = core.forward(tokens, str(upstream_dir / "default_female.wav"), return_bytes=False)
    assert wav.shape == (1, len(tokens) * SAMPLES_PER_TOKEN)
    assert torch.isfinite(wav).all()
    assert float(wav.abs().max()) > 1e-4


def _minicpmo_stage(model_dir: Path) -> Any:
    """Upstream's MiniCPM-o code2wav stage model, built from the only config fields it reads."""
    from vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav

    model_config = SimpleNamespace(model=str(model_dir), revision=None, stage_connector_config=None)
    return MiniCPMO45Code2Wav(vllm_config=SimpleNamespace(model_config=model_config))


def test_minicpmo_code2wav_loads_the_standin_and_decodes_a_batch(cosyvoice2_alias: None) -> None:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    stage = _minicpmo_stage(ensure_engine_model_dir("minicpmo_4_5", upstream_compatible=True))
    stage.load_weights(iter(()))  # builds its Token2wav over StepAudio2Token2WavCore and the batched backend
    backend = stage.backend
    features = backend.prepare_prompt("HT_ref_audio", stage._default_prompt_wav)
    states = backend.setup_batch(features, 2)
    chunk = torch.arange(2 * 28, dtype=torch.long).reshape(2, 28) * 97 % 6561
    first, states = backend.decode_batch(chunk, features, states, last_chunk=False)
    last, _ = backend.decode_batch(chunk.flip(1), features, states, last_chunk=True)
    for audio in (*first, *last):
        assert audio.ndim == 1 and audio.numel() > 0
        assert torch.isfinite(audio).all()
    assert first[0].numel() == first[1].numel() and not torch.equal(first[0], torch.zeros_like(first[0]))


def test_our_core_loads_the_upstream_compatible_variant(upstream_dir: Path) -> None:
    """Our loaders read every variant: the real-size tokenizer and HiFT beside the reduced flow."""
    from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import (
        StepAudio2Token2WavCore as OurCore,
    )

    core = OurCore(upstream_dir, device="cpu", n_timesteps=2)
    tokens = [(37 * i + 11) % 6561 for i in range(40)]
    wav = core(tokens, str(upstream_dir / "default_female.wav"), seed=0)
    assert wav.shape[-1] == len(tokens) * SAMPLES_PER_TOKEN
    assert torch.isfinite(wav).all()
