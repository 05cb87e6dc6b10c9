# SPDX-License-Identifier: Apache-2.0
"""StepAudio2Token2WavCore: laziness, backend installation, prompt features, cache, dtype, bad input."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from tests.helpers.token2wav import (
    SessionCounter,
    assert_embeddings_close,
    export_other_speaker_net_onnx,
    make_token2wav_dir,
    rewrite_in_place_same_size,
)
from vllm_omni_token2wav.model_executor.models import audio as frontend
from vllm_omni_token2wav.model_executor.models.speaker_embedding import selection as speaker_embedding
from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as speaker_embedding_torch
from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

REPO_ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def ort_core(token2wav_dir: Path) -> StepAudio2Token2WavCore:
    """One ORT-fallback core shared by the read-only checks (its session is built once)."""
    return StepAudio2Token2WavCore(token2wav_dir)


class CountingBackend:
    """Wraps a backend and counts embeddings (observes how often the cache lets a prompt through)."""

    def __init__(self, inner: speaker_embedding.SpeakerEmbeddingBackend) -> None:
        self.inner = inner
        self.calls = 0
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def __call__(self, feat: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.calls += 1
        return self.inner(feat)


class ConstantBackend:
    def __init__(self, value: float = 0.5, name: str = "constant-cpu") -> None:
        self.value, self._name = value, name

    @property
    def name(self) -> str:
        return self._name

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def __call__(self, feat: torch.Tensor) -> torch.Tensor:
        return torch.full((1, 192), self.value, dtype=torch.float32)


@pytest.fixture
def torch_loader(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, torch.device]]:
    """Record calls to the real torch CAM++ loader (still returning the real backend)."""
    calls: list[tuple[Path, torch.device]] = []
    real = speaker_embedding_torch.get_campplus_torch

    def recording(onnx_path: Path, device: torch.device, **kwargs: str) -> object:
        calls.append((Path(onnx_path), device))
        return real(onnx_path, device, **kwargs)

    monkeypatch.setattr(speaker_embedding_torch, "get_campplus_torch", recording)
    return calls


@pytest.fixture
def torch_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the CPU device path the torch network whatever the recorded policy says."""
    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", "torch")


# ---- laziness ----------------------------------------------------------------------------------


def test_constructor_only_records_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SessionCounter(monkeypatch)
    selections: list[str] = []
    real_select = speaker_embedding.select_speaker_embedding_backend
    monkeypatch.setattr(
        "vllm_omni_token2wav.model_executor.models.token2wav_core.speaker_prompt.select_speaker_embedding_backend",
        lambda *a, **k: selections.append(k["request"]) or real_select(*a, **k),
    )
    core = StepAudio2Token2WavCore(tmp_path / "does-not-exist", float16=True, n_timesteps=5)
    assert (core.float16, core.n_timesteps) == (True, 5)
    assert core.spk_backend == "onnxruntime-cpu"  # what would run; nothing built to say so
    assert counter.count == 0 and selections == []


def test_enable_device_path_builds_no_ort_session_and_loads_no_models(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, torch_on_cpu: None, torch_loader: list[object]
) -> None:
    counter = SessionCounter(monkeypatch)
    loads: list[int] = []
    monkeypatch.setattr(StepAudio2Token2WavCore, "load_models", lambda self: loads.append(1))
    core = StepAudio2Token2WavCore(token2wav_dir)
    assert core.enable_device_spk_embedding() == core.spk_backend
    assert core.spk_backend.startswith("torch-cpu")
    assert torch_loader == [(token2wav_dir / "campplus.onnx", torch.device("cpu"))]
    assert counter.count == 0 and loads == []


def testload_models_keeps_an_installed_backend(token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SessionCounter(monkeypatch)
    core = StepAudio2Token2WavCore(token2wav_dir)
    backend = ConstantBackend()
    core.install_spk_backend(backend)
    core.load_models()
    core.load_models()
    assert core.spk_model is backend and core.spk_backend == "constant-cpu"
    assert counter.count == 0


def testload_models_installs_the_fallback_without_building_it(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, short_speech: tuple[np.ndarray, int]
) -> None:
    counter = SessionCounter(monkeypatch)
    core = StepAudio2Token2WavCore(token2wav_dir)
    core.load_models()
    assert core.spk_backend == "onnxruntime-cpu" and counter.count == 0
    core.prepare_prompt(short_speech)
    assert counter.count == 1


def test_device_path_never_builds_the_ort_session(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, torch_on_cpu: None, short_speech: tuple[np.ndarray, int]
) -> None:
    counter = SessionCounter(monkeypatch)
    core = StepAudio2Token2WavCore(token2wav_dir)
    core.enable_device_spk_embedding()
    core.load_models()
    features = core.prepare_prompt(short_speech)
    core.speaker_embedding((short_speech[0][:8000], short_speech[1]))
    assert features.backend.startswith("torch-cpu")
    assert counter.count == 0


def test_sixteen_threads_of_first_use_build_one_ort_session(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, speech: tuple[np.ndarray, int]
) -> None:
    counter = SessionCounter(monkeypatch, delay_s=0.05)
    core = StepAudio2Token2WavCore(token2wav_dir)
    wav, rate = speech
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:  # distinct prompts (0.5 s each), so the cache does not deduplicate the requests
            core.speaker_embedding((wav[i * 800 : i * 800 + 8000].copy(), rate))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert counter.count == 1
    assert core.prompt_cache_stats.misses == 16


# ---- platform policy ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["onnxruntime", "torch"])
def test_cpu_device_path_follows_the_recorded_policy(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    counter = SessionCounter(monkeypatch)
    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", policy)
    core = StepAudio2Token2WavCore(token2wav_dir)
    name = core.enable_device_spk_embedding()
    assert name.startswith("onnxruntime-cpu" if policy == "onnxruntime" else "torch-cpu")
    assert counter.count == 0


def test_failing_device_path_raises_and_keeps_the_previous_backend(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, torch_on_cpu: None
) -> None:
    def broken(onnx_path: Path, device: torch.device, **kwargs: object) -> None:
        raise RuntimeError(f"{onnx_path}: initializer 'xvector.dense.linear.weight' has shape [1], expected [192]")

    monkeypatch.setattr(speaker_embedding_torch, "get_campplus_torch", broken)
    core = StepAudio2Token2WavCore(token2wav_dir)
    with pytest.raises(RuntimeError, match="expected \\[192\\]"):
        core.enable_device_spk_embedding()
    assert core.spk_backend == "onnxruntime-cpu"


def test_explicit_tensorrt_on_cpu_raises(token2wav_dir: Path) -> None:
    core = StepAudio2Token2WavCore(token2wav_dir)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        core.enable_trt_spk_embedding()


_NPU_SCRIPT = r"""
import json, sys, types
import onnxruntime, torch
from tests.helpers.fake_npu import FakeNpuModule
torch.utils.rename_privateuse1_backend("npu")  # what torch_npu does; irreversible, hence a subprocess
torch.npu = FakeNpuModule(True)
sys.modules["torch_npu"] = types.ModuleType("torch_npu")
from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.platforms.npu.platform import NpuDevicePlatform
platforms.reset_current_platform(NpuDevicePlatform())
from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as speaker_embedding_torch
loads, sessions = [], []

class Fake:
    def __init__(self, device):
        self.device, self.name = device, f"torch-{device}"
    def __call__(self, feat):
        return torch.zeros((1, 192))

speaker_embedding_torch.get_campplus_torch = lambda path, device, **kw: loads.append(str(device)) or Fake(device)
onnxruntime.InferenceSession = lambda *a, **k: sessions.append(1)
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration)
core = StepAudio2Token2WavCore(sys.argv[1])
core_name = core.enable_device_spk_embedding()
stage = MiniCPMO45Code2Wav(model=sys.argv[1])
s2 = StepAudio2Token2WavForConditionalGeneration(model=sys.argv[1])
lazy = all(c._flow is None and c._hift is None and c._tokenizer is None for c in (stage.token2wav, s2.token2wav))
print(json.dumps({"core": core_name, "stage": stage.spk_backend, "stage_device": str(stage.token2wav.device),
                  "step_audio2_stage": s2.token2wav.spk_backend, "lazy": lazy,
                  "loads": loads, "sessions": len(sessions)}))
"""


def test_fake_npu_platform_enables_the_device_path_in_core_and_stages(token2wav_dir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL="WARNING")
    proc = subprocess.run(
        [sys.executable, "-c", _NPU_SCRIPT, str(token2wav_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "core": "torch-npu:0",
        "stage": "torch-npu:0",
        "stage_device": "npu:0",
        "step_audio2_stage": "torch-npu:0",
        "lazy": True,
        "loads": ["npu:0", "npu:0", "npu:0"],
        "sessions": 0,
    }


# ---- prompt features ---------------------------------------------------------------------------


def test_ort_and_torch_backends_agree_through_prepare_prompt(
    token2wav_dir: Path, ort_core: StepAudio2Token2WavCore, torch_on_cpu: None, speech: tuple[np.ndarray, int]
) -> None:
    # "auto": the torch CAM++ computes segment pooling like the installed onnxruntime does.
    torch_core = StepAudio2Token2WavCore(token2wav_dir, spk_seg_pool_mode="auto")
    torch_core.enable_device_spk_embedding()
    ort_features = ort_core.prepare_prompt(speech)
    torch_features = torch_core.prepare_prompt(speech)
    assert ort_features.backend == "onnxruntime-cpu" and torch_features.backend == "torch-cpu"
    assert_embeddings_close(torch_features.speaker_embedding, ort_features.speaker_embedding, rel_l2=1e-4)
    torch.testing.assert_close(torch_features.prompt_mel, ort_features.prompt_mel, rtol=0, atol=0)


def test_legacy_seg_pool_differs_from_exact_onnxruntime_only_slightly(
    token2wav_dir: Path, ort_core: StepAudio2Token2WavCore, torch_on_cpu: None, speech: tuple[np.ndarray, int]
) -> None:
    # The default device path keeps onnxruntime-1.18 numerics (what the flow models were trained on);
    # onnxruntime >= 1.29 averages the last partial segment over its real length. 4 s of speech gives
    # T' = 200 frames only when the fbank has 399-400 frames, so this prompt has a partial segment.
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import ort_seg_pool_mode

    legacy = StepAudio2Token2WavCore(token2wav_dir)  # spk_seg_pool_mode="legacy"
    legacy.enable_device_spk_embedding()
    got = legacy.speaker_embedding(speech)
    expected = ort_core.speaker_embedding(speech)
    if ort_seg_pool_mode() == "legacy":
        assert_embeddings_close(got, expected, rel_l2=1e-4)
    else:
        assert_embeddings_close(got, expected, rel_l2=0.1, min_cosine=0.99)
        assert not torch.allclose(got, expected, rtol=1e-4, atol=0)


def test_prompt_features_have_the_documented_layout(
    ort_core: StepAudio2Token2WavCore, speech: tuple[np.ndarray, int]
) -> None:
    wav, rate = speech
    features = ort_core.prepare_prompt(speech)
    frames_24k = round(wav.shape[0] * 24000 / rate) // 480  # 50 mel frames per second of 24 kHz audio
    assert features.speaker_embedding.shape == (1, 192) and features.speaker_embedding.dtype == torch.float32
    assert features.prompt_mel.shape == (1, frames_24k, 80) and features.prompt_mel.dtype == torch.float32
    assert features.prompt_mel_len.tolist() == [frames_24k] and features.prompt_mel_len.dtype == torch.int32
    assert features.digest == frontend.decode_audio(speech).digest()


def test_embedding_is_the_speaker_model_on_mean_normalised_fbank(
    token2wav_dir: Path, ort_core: StepAudio2Token2WavCore, speech: tuple[np.ndarray, int]
) -> None:
    # Independent route: kaldi-native-fbank (the C++ Kaldi reference) + onnxruntime directly.
    import kaldi_native_fbank as knf
    import onnxruntime

    wav, rate = speech
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.samp_freq = rate
    opts.mel_opts.num_bins = 80
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(rate, wav.tolist())
    fbank.input_finished()
    feats = np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]).astype(np.float32)
    feats -= feats.mean(axis=0, keepdims=True)
    session = onnxruntime.InferenceSession(str(token2wav_dir / "campplus.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {session.get_inputs()[0].name: feats[None]})
    got = ort_core.speaker_embedding(speech)
    assert_embeddings_close(got, expected, rel_l2=2e-3)  # fbank: torch vs kaldi-native-fbank, <= 1e-3 abs


# ---- cache -------------------------------------------------------------------------------------


def test_same_audio_in_any_form_is_computed_once(
    token2wav_dir: Path, tmp_path: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    wav, rate = short_speech
    pcm = np.round(wav * 32767).astype(np.int16)
    path = tmp_path / "prompt.wav"
    soundfile.write(path, pcm, rate, subtype="PCM_16")
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, rate, format="WAV", subtype="PCM_16")
    core = StepAudio2Token2WavCore(token2wav_dir)
    counting = CountingBackend(ConstantBackend())
    core.install_spk_backend(counting)
    forms = [(pcm, rate), (pcm.astype(np.float32) / 32768.0, rate), str(path), path, buffer.getvalue()]
    embeddings = [core.speaker_embedding(form) for form in forms]
    assert counting.calls == 1
    for emb in embeddings[1:]:
        torch.testing.assert_close(emb, embeddings[0], rtol=0, atol=0)


def test_cache_key_includes_the_backend(token2wav_dir: Path, short_speech: tuple[np.ndarray, int]) -> None:
    core = StepAudio2Token2WavCore(token2wav_dir)
    core.install_spk_backend(ConstantBackend(0.5, name="first-cpu"))
    first = core.speaker_embedding(short_speech)
    core.install_spk_backend(ConstantBackend(0.25, name="second-cpu"))
    second = core.speaker_embedding(short_speech)
    torch.testing.assert_close(second, torch.full((1, 192), 0.25), rtol=0, atol=0)
    assert not torch.equal(first, second)


def test_sixteen_threads_on_one_prompt_compute_once(token2wav_dir: Path, short_speech: tuple[np.ndarray, int]) -> None:
    core = StepAudio2Token2WavCore(token2wav_dir)
    counting = CountingBackend(ConstantBackend())
    core.install_spk_backend(counting)
    barrier = threading.Barrier(16)
    results: list[torch.Tensor] = []

    def worker() -> None:
        barrier.wait()
        results.append(core.speaker_embedding(short_speech))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counting.calls == 1 and len(results) == 16
    assert len({r.data_ptr() for r in results}) == 16


def test_lru_evicts_with_the_configured_size(token2wav_dir: Path, speech: tuple[np.ndarray, int]) -> None:
    wav, rate = speech
    core = StepAudio2Token2WavCore(token2wav_dir, prompt_cache_size=2)
    counting = CountingBackend(ConstantBackend())
    core.install_spk_backend(counting)
    prompts = [(wav[i * 4000 : i * 4000 + 16000].copy(), rate) for i in range(3)]
    for prompt in (prompts[0], prompts[1], prompts[0], prompts[2], prompts[0], prompts[1]):
        core.speaker_embedding(prompt)
    # misses: p0, p1, p2 (evicts p1, the least recently used), p1 again (evicts p2: p0 was used after it)
    assert counting.calls == 4
    assert core.prompt_cache_stats.size == 2


def test_callers_cannot_corrupt_cached_features(
    ort_core: StepAudio2Token2WavCore, short_speech: tuple[np.ndarray, int]
) -> None:
    core = ort_core
    first = core.prepare_prompt(short_speech)
    reference = first.clone()
    first.speaker_embedding.mul_(0.0)
    first.prompt_mel.fill_(1.0)
    again = core.prepare_prompt(short_speech)
    torch.testing.assert_close(again.speaker_embedding, reference.speaker_embedding, rtol=0, atol=0)
    torch.testing.assert_close(again.prompt_mel, reference.prompt_mel, rtol=0, atol=0)


# ---- dtype discipline --------------------------------------------------------------------------


def test_bf16_default_dtype_builds_fp32_and_is_left_alone(
    token2wav_dir: Path, torch_on_cpu: None, short_speech: tuple[np.ndarray, int]
) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as vLLM's set_default_torch_dtype does around model init
    try:
        core = StepAudio2Token2WavCore(token2wav_dir)
        assert torch.get_default_dtype() == torch.bfloat16
        core.enable_device_spk_embedding()
        assert torch.get_default_dtype() == torch.bfloat16
        features = core.prepare_prompt(short_speech)
        assert torch.get_default_dtype() == torch.bfloat16
    finally:
        torch.set_default_dtype(previous)
    assert features.speaker_embedding.dtype == torch.float32 and features.prompt_mel.dtype == torch.float32
    fp32 = StepAudio2Token2WavCore(token2wav_dir)
    fp32.enable_device_spk_embedding()
    torch.testing.assert_close(features.speaker_embedding, fp32.speaker_embedding(short_speech), atol=1e-5, rtol=1e-5)


# ---- bad input ---------------------------------------------------------------------------------


def test_missing_directory_is_named_on_first_use(tmp_path: Path, short_speech: tuple[np.ndarray, int]) -> None:
    core = StepAudio2Token2WavCore(tmp_path / "no-such-dir")
    with pytest.raises(FileNotFoundError, match=r"no-such-dir does not exist .*campplus\.onnx"):
        core.prepare_prompt(short_speech)
    with pytest.raises(FileNotFoundError, match="no-such-dir"):
        core.enable_device_spk_embedding()


def test_missing_speaker_model_is_named_with_the_directory_listing(tmp_path: Path) -> None:
    (tmp_path / "flow.pt").write_bytes(b"")
    core = StepAudio2Token2WavCore(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"campplus\.onnx is missing.*\['flow\.pt'\]"):
        core.load_models()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda tmp: str(tmp / "missing.wav"), id="missing-file"),
        pytest.param(lambda tmp: b"definitely not audio", id="garbage-bytes"),
        pytest.param(lambda tmp: (np.zeros(16000, dtype=np.float32), 16000), id="digital-silence"),
        pytest.param(
            lambda tmp: ((1e-6 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32), 16000),
            id="near-silent-noise",
        ),
        pytest.param(lambda tmp: (np.full(16000, 0.25, dtype=np.float32), 16000), id="dc-offset-only"),
        pytest.param(lambda tmp: (np.eye(1, 16000, 8000, dtype=np.float32)[0] * 0.5, 16000), id="a-click-in-silence"),
        pytest.param(lambda tmp: (np.full(16000, 3.0, dtype=np.float32), 16000), id="float-out-of-range"),
        pytest.param(lambda tmp: (np.ones(100, dtype=np.float32) * 0.1, 16000), id="too-short"),
        pytest.param(lambda tmp: (np.ones(16000, dtype=np.float32) * 0.1, 0), id="bad-rate"),
    ],
)
def test_prompt_audio_errors_surface_unchanged(token2wav_dir: Path, tmp_path: Path, bad: object) -> None:
    source = bad(tmp_path)  # type: ignore[operator]
    with pytest.raises((ValueError, FileNotFoundError)) as expected:
        frontend.load_prompt_audio(source)
    core = StepAudio2Token2WavCore(token2wav_dir)
    with pytest.raises(type(expected.value)) as got:
        core.prepare_prompt(source)
    # identical message (object addresses in decoder messages differ between two calls)
    assert re.sub(r"0x[0-9a-f]+", "0x", str(got.value)) == re.sub(r"0x[0-9a-f]+", "0x", str(expected.value))
    assert core.prompt_cache_stats.size == 0


def test_a_click_in_silence_is_not_a_voice(token2wav_dir: Path) -> None:
    """The issue's probe: one sample of 0.5 in a second of zeros (a -6 dBFS peak) used to give an embedding."""
    x = np.zeros(16000, np.float32)
    x[8000] = 0.5
    core = StepAudio2Token2WavCore(token2wav_dir, device="cpu", n_timesteps=2)
    message = r"<array>: prompt has 0\.03 s of sustained signal in its 1\.00 s, below the 0\.3 s minimum"
    for call in (
        lambda: core.speaker_embedding((x, 16000)),
        lambda: core.prepare_prompt((x, 16000), with_tokens=True),
        lambda: core.set_stream_cache((x, 16000)),
        lambda: core([1, 2, 3], (x, 16000)),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    assert core.prompt_cache_stats.size == 0


def test_an_overlong_prompt_gets_advice_that_works_here(
    ort_core: StepAudio2Token2WavCore, speech: tuple[np.ndarray, int], tmp_path: Path
) -> None:
    wav, rate = speech
    long = np.tile(wav, 8)  # 32 s
    path = tmp_path / "long.wav"
    soundfile.write(path, long, rate, subtype="PCM_16")
    for source in ((long, rate), str(path), path.read_bytes()):
        with pytest.raises(ValueError) as exc:
            ort_core.prepare_prompt(source)
        message = str(exc.value)
        assert "32.00 s long, over the 30 s prompt limit" in message
        assert "(waveform[: int(30 * rate)], rate)" in message
        # prepare_prompt takes neither: advice naming them would not work here.
        assert "truncate" not in message and "max_seconds" not in message
    # Following the advice works.
    assert ort_core.prepare_prompt((long[: int(30 * rate)], rate)).speaker_embedding.shape == (1, 192)


def test_a_speaker_model_of_another_network_is_refused_by_both_backends(
    tmp_path: Path, short_speech: tuple[np.ndarray, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """[B, T, 80] -> [B, 192] like CAM++, but another network: neither the ORT fallback nor the torch
    path may serve it (the same structural check, the same message), and nothing is cached."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.onnx_import import CampplusOnnxError

    other = export_other_speaker_net_onnx(tmp_path / "other.onnx")
    directory = make_token2wav_dir(tmp_path / "t2w", campplus=other)
    counter = SessionCounter(monkeypatch)
    fallback = StepAudio2Token2WavCore(directory)
    with pytest.raises(CampplusOnnxError, match=r"not a CAM\+\+ export") as ort_error:
        fallback.prepare_prompt(short_speech)
    assert counter.count == 0 and fallback.prompt_cache_stats.size == 0
    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", "torch")
    with pytest.raises(CampplusOnnxError) as torch_error:
        StepAudio2Token2WavCore(directory).enable_device_spk_embedding()
    # Same diagnosis; the torch path names the resolved file, the fallback the path it was given.
    assert str(torch_error.value).split(": ", 1)[1] == str(ort_error.value).split(": ", 1)[1]


def test_a_directory_in_place_of_an_asset_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "campplus.onnx").mkdir()
    with pytest.raises(IsADirectoryError, match=r"campplus\.onnx is a directory"):
        StepAudio2Token2WavCore(tmp_path).enable_device_spk_embedding()


@pytest.mark.parametrize("path", ["fallback", "device"])
def test_a_changed_speaker_model_is_kept_until_reload_and_new_facades_see_it(
    tmp_path: Path, short_speech: tuple[np.ndarray, int], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    from tests.model_executor.models.speaker_embedding.campplus.helpers import ort_embed, ort_session
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    own = tmp_path / "own-campplus.onnx"  # a private copy: the cached stand-in must not be edited
    shutil.copyfile(ensure_standin_campplus_onnx(), own)
    directory = make_token2wav_dir(tmp_path / "t2w", campplus=own)
    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", "torch")

    def facade() -> StepAudio2Token2WavCore:
        core = StepAudio2Token2WavCore(directory, spk_seg_pool_mode="auto")  # agree with the installed ORT
        if path == "device":
            core.enable_device_spk_embedding()
        return core

    core = facade()
    before = core.speaker_embedding(short_speech).clone()
    feats = speaker_features(frontend.load_prompt_audio(short_speech).wav_16k)
    rewrite_in_place_same_size(own)
    expected = torch.from_numpy(ort_embed(ort_session(own), feats))  # what the file on disk computes now
    assert not torch.allclose(before, expected, rtol=1e-3)

    # A running facade keeps what it loaded, also when it computes the embedding again.
    core.clear_prompt_cache()
    assert_embeddings_close(core.speaker_embedding(short_speech), before, rel_l2=1e-5, min_cosine=0.999999)
    # reload_spk_embedding() reads the file again, the way the backend was made, and drops cached features.
    assert core.reload_spk_embedding() == ("torch-cpu" if path == "device" else "onnxruntime-cpu")
    assert core.spk_backend == ("torch-cpu" if path == "device" else "onnxruntime-cpu")
    assert_embeddings_close(core.speaker_embedding(short_speech), expected, rel_l2=1e-4, min_cosine=0.999999)
    # A facade built after the change sees it without a reload (no stale process cache).
    assert_embeddings_close(facade().speaker_embedding(short_speech), expected, rel_l2=1e-4, min_cosine=0.999999)


def test_reload_refuses_to_guess_how_a_hand_installed_backend_was_made(tmp_path: Path) -> None:
    core = StepAudio2Token2WavCore(tmp_path)
    core.install_spk_backend(ConstantBackend())
    with pytest.raises(RuntimeError, match="passed to install_spk_backend"):
        core.reload_spk_embedding()
    assert core.spk_backend == "constant-cpu"


def test_installing_a_backend_is_logged_at_info_once_per_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm_omni_token2wav.logger import _reset_once_cache

    _reset_once_cache()
    caplog.set_level("DEBUG", logger="vllm_omni_token2wav")
    for _ in range(12):  # a benchmark installs the same backend into many facades
        StepAudio2Token2WavCore(tmp_path).install_spk_backend(ConstantBackend(name="constant-once-test"))
    StepAudio2Token2WavCore(tmp_path).install_spk_backend(ConstantBackend(name="constant-other-test"))
    lines = [r.getMessage() for r in caplog.records if "speaker embedding via" in r.getMessage()]
    assert lines == [
        "StepAudio2Token2WavCore: speaker embedding via constant-once-test",
        "StepAudio2Token2WavCore: speaker embedding via constant-other-test",
    ]


def test_bad_configuration_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_timesteps"):
        StepAudio2Token2WavCore(tmp_path, n_timesteps=0)
    with pytest.raises(ValueError, match="cache size"):
        StepAudio2Token2WavCore(tmp_path, prompt_cache_size=-1)
    with pytest.raises(TypeError, match="not a SpeakerEmbeddingBackend"):
        StepAudio2Token2WavCore(tmp_path).install_spk_backend(object())  # type: ignore[arg-type]
