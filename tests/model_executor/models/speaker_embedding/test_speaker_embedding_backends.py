# SPDX-License-Identifier: Apache-2.0
"""Speaker-embedding backends: the lazy ORT fallback, the one selection table, the TensorRT cache (fakes)."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from tests.helpers.mark import hardware_test
from tests.helpers.token2wav import (
    SessionCounter,
    assert_embeddings_close,
    campplus_reference,
    copy_with_io_names,
    export_other_speaker_net_onnx,
)
from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.model_executor.models.speaker_embedding import selection as speaker_embedding
from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as speaker_embedding_torch
from vllm_omni_token2wav.model_executor.models.speaker_embedding import trt as speaker_embedding_trt
from vllm_omni_token2wav.model_executor.models.speaker_embedding.backend import SpeakerEmbeddingBackend
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.onnx_import import CampplusOnnxError
from vllm_omni_token2wav.model_executor.models.speaker_embedding.ort import OrtSpeakerEmbedding
from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import select_speaker_embedding_backend
from vllm_omni_token2wav.model_executor.models.speaker_embedding.trt import (
    EngineCacheKey,
    load_or_build_engine,
)
from vllm_omni_token2wav.platforms.cuda.platform import CudaDevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def campplus_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full-size CAM++ stand-in (cached on disk), under the name a token2wav directory uses."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    link = tmp_path_factory.mktemp("campplus") / "campplus.onnx"
    os.symlink(ensure_standin_campplus_onnx(), link)
    return link


@pytest.fixture(scope="module")
def other_net_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_other_speaker_net_onnx(tmp_path_factory.mktemp("other") / "campplus.onnx")


def _feat(frames: int = 120, seed: int = 0) -> torch.Tensor:
    """Mean-normalised fbank-like features (what the speaker model is fed), seeded."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((frames, 80), generator=gen, dtype=torch.float32) * 3.0
    return x - x.mean(dim=0, keepdim=True)


class _FakeBackend:
    def __init__(self, name: str, device: torch.device) -> None:
        self._name, self._device = name, device

    @property
    def name(self) -> str:
        return self._name

    @property
    def device(self) -> torch.device:
        return self._device

    def __call__(self, feat: torch.Tensor) -> torch.Tensor:
        return torch.zeros((1, 192), dtype=torch.float32, device=self._device)


# ---- ORT fallback ------------------------------------------------------------------------------


def test_ort_session_is_built_on_first_call_only(campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SessionCounter(monkeypatch)
    backend = OrtSpeakerEmbedding(campplus_onnx, CPU)
    assert counter.count == 0
    assert not backend.session_built
    backend(_feat())
    backend(_feat(seed=1))
    assert counter.count == 1
    assert backend.session_built


def test_ort_sixteen_threads_on_first_use_build_one_session(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = SessionCounter(monkeypatch, delay_s=0.05)
    backend = OrtSpeakerEmbedding(campplus_onnx, CPU)
    barrier = threading.Barrier(16)
    results: dict[int, torch.Tensor] = {}

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = backend(_feat(seed=i))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.count == 1
    reference = campplus_reference(torch.stack([_feat(seed=i) for i in range(16)]))
    for i in range(16):
        assert_embeddings_close(results[i], reference[i], rel_l2=1e-4, min_cosine=0.999999)


def test_ort_session_uses_upstream_options(campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SessionCounter(monkeypatch)
    OrtSpeakerEmbedding(campplus_onnx, CPU)(_feat())
    OrtSpeakerEmbedding(campplus_onnx, CPU, intra_op_num_threads=3)(_feat())
    (default, three) = counter.calls
    assert default["providers"] == ["CPUExecutionProvider"]
    assert default["sess_options"].graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert default["sess_options"].intra_op_num_threads == 1
    assert three["sess_options"].intra_op_num_threads == 3


def test_ort_reads_io_names_from_the_session(campplus_onnx: Path, tmp_path: Path) -> None:
    path = copy_with_io_names(campplus_onnx, tmp_path / "renamed.onnx", input_name="feats", output_name="embedding")
    out = OrtSpeakerEmbedding(path, CPU)(_feat())
    assert_embeddings_close(out, campplus_reference(_feat()), rel_l2=1e-4, min_cosine=0.999999)


def test_ort_result_moves_to_the_facade_device(campplus_onnx: Path) -> None:
    # "meta" stands in for an accelerator: the CPU result must be handed over on the facade's device.
    out = OrtSpeakerEmbedding(campplus_onnx, torch.device("meta"))(_feat())
    assert out.device.type == "meta"
    assert out.shape == (1, 192) and out.dtype == torch.float32


def test_ort_missing_file_fails_on_first_use_naming_it(tmp_path: Path) -> None:
    backend = OrtSpeakerEmbedding(tmp_path / "nowhere" / "campplus.onnx", CPU)  # construction stays lazy
    with pytest.raises(FileNotFoundError, match=r"nowhere/campplus\.onnx"):
        backend(_feat())


def test_ort_directory_path_is_reported_as_a_directory(campplus_onnx: Path, tmp_path: Path) -> None:
    os.symlink(campplus_onnx, tmp_path / "campplus.onnx")
    with pytest.raises(IsADirectoryError, match=rf"{tmp_path} is a directory.*did you mean {tmp_path}/campplus\.onnx"):
        OrtSpeakerEmbedding(tmp_path, CPU)(_feat())


def test_ort_corrupt_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "campplus.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(CampplusOnnxError, match=r"campplus\.onnx: not a readable ONNX file"):
        OrtSpeakerEmbedding(bad, CPU)(_feat())


def test_ort_rejects_a_model_with_the_wrong_embedding_size() -> None:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    reduced = ensure_standin_campplus_onnx(reduced=True)  # embedding_size 64
    with pytest.raises(CampplusOnnxError, match=r"CAM\+\+ export with embedding_size=64, but 192 is needed"):
        OrtSpeakerEmbedding(reduced, CPU)(_feat())


def test_another_network_with_the_same_shapes_is_refused_by_every_backend(
    other_net_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime would run it ([B, T, 80] -> [B, 192]); the shared CAM++ check stops it before any session."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(other_net_onnx), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": _feat().numpy()[None]})[0].shape == (1, 192)  # it really does fit

    counter = SessionCounter(monkeypatch)
    with pytest.raises(CampplusOnnxError, match="not a CAM\\+\\+ export") as ort_error:
        OrtSpeakerEmbedding(other_net_onnx, CPU)(_feat())
    assert counter.count == 0
    with pytest.raises(CampplusOnnxError) as torch_error:
        speaker_embedding_torch.load_campplus_from_onnx(other_net_onnx)
    assert str(ort_error.value) == str(torch_error.value)  # one check, one diagnosis


@pytest.mark.parametrize("shape", [(120, 40), (1, 120, 80), (0, 80)])
def test_ort_rejects_bad_features(campplus_onnx: Path, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        OrtSpeakerEmbedding(campplus_onnx, CPU)(torch.zeros(shape, dtype=torch.float32))


@pytest.mark.parametrize("threads", [-1, 1.5, True])
def test_ort_thread_count_is_validated(campplus_onnx: Path, threads: object) -> None:
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        OrtSpeakerEmbedding(campplus_onnx, CPU, intra_op_num_threads=threads)  # type: ignore[arg-type]


# ---- selection table ---------------------------------------------------------------------------


@pytest.fixture
def torch_loader(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, torch.device]]:
    """Patch `get_campplus_torch` with a recorder returning a fake backend named like the real one."""
    calls: list[tuple[Path, torch.device]] = []

    def fake(onnx_path: Path, device: torch.device, **kwargs: object) -> _FakeBackend:
        calls.append((Path(onnx_path), device))
        return _FakeBackend(f"torch-{device}", device)

    monkeypatch.setattr(speaker_embedding_torch, "get_campplus_torch", fake)
    return calls


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, torch.device]]:
    """Pretend tensorrt is importable and record TrtSpeakerEmbedding constructions."""
    calls: list[tuple[Path, torch.device]] = []

    def fake(onnx_path: Path, device: torch.device) -> _FakeBackend:
        calls.append((Path(onnx_path), device))
        return _FakeBackend(f"tensorrt-{device}", device)

    monkeypatch.setattr(speaker_embedding_trt, "tensorrt_unavailable_reason", lambda: None)
    monkeypatch.setattr(speaker_embedding_trt, "TrtSpeakerEmbedding", fake)
    return calls


def test_fallback_request_gives_a_lazy_ort_backend_on_any_device(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch, torch_loader: list[object]
) -> None:
    counter = SessionCounter(monkeypatch)
    for device in (CPU, torch.device("cuda", 0), torch.device("meta")):
        backend = select_speaker_embedding_backend(campplus_onnx, device, request="fallback")
        assert isinstance(backend, SpeakerEmbeddingBackend)
        assert backend.name == "onnxruntime-cpu" and backend.device == device
    assert counter.count == 0 and torch_loader == []


def test_cuda_device_path_prefers_tensorrt(
    campplus_onnx: Path, fake_trt: list[object], torch_loader: list[object]
) -> None:
    backend = select_speaker_embedding_backend(campplus_onnx, torch.device("cuda", 1), request="device")
    assert backend.name == "tensorrt-cuda:1"
    assert fake_trt == [(campplus_onnx, torch.device("cuda", 1))] and torch_loader == []


def test_cuda_device_path_without_tensorrt_uses_torch(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch, torch_loader: list[object]
) -> None:
    monkeypatch.setattr(speaker_embedding_trt, "tensorrt_unavailable_reason", lambda: "not installed (test)")
    backend = select_speaker_embedding_backend(campplus_onnx, torch.device("cuda", 0), request="device")
    assert backend.name == "torch-cuda:0"
    assert torch_loader == [(campplus_onnx, torch.device("cuda", 0))]


def test_cpu_device_path_follows_the_recorded_policy(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch, torch_loader: list[object]
) -> None:
    counter = SessionCounter(monkeypatch)
    expected = {"onnxruntime": "onnxruntime-cpu", "torch": "torch-cpu"}
    for policy, name in expected.items():
        monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", policy)
        assert select_speaker_embedding_backend(campplus_onnx, CPU, request="device").name == name
    assert counter.count == 0  # even the ORT choice stays lazy


def test_other_device_types_use_the_torch_network(campplus_onnx: Path, torch_loader: list[object]) -> None:
    backend = select_speaker_embedding_backend(campplus_onnx, torch.device("meta"), request="device")
    assert backend.name == "torch-meta"


def test_device_path_errors_propagate_instead_of_falling_back(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(onnx_path: Path, device: torch.device, **kwargs: object) -> None:
        raise RuntimeError("campplus.onnx: initializer 'x' has shape [1], expected [2]")

    monkeypatch.setattr(speaker_embedding_torch, "get_campplus_torch", broken)
    with pytest.raises(RuntimeError, match="expected \\[2\\]"):
        select_speaker_embedding_backend(campplus_onnx, torch.device("meta"), request="device")


def test_device_path_with_missing_file_names_it(tmp_path: Path, torch_loader: list[object]) -> None:
    with pytest.raises(FileNotFoundError, match=r"gone/campplus\.onnx"):
        select_speaker_embedding_backend(tmp_path / "gone" / "campplus.onnx", torch.device("meta"), request="device")
    assert torch_loader == []


def test_explicit_tensorrt_request_raises_with_the_reason(campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        select_speaker_embedding_backend(campplus_onnx, CPU, request="tensorrt")
    monkeypatch.setattr(speaker_embedding_trt, "tensorrt_unavailable_reason", lambda: "the tensorrt package is gone")
    with pytest.raises(RuntimeError, match="tensorrt package is gone"):
        select_speaker_embedding_backend(campplus_onnx, torch.device("cuda", 0), request="tensorrt")


def test_unknown_request_is_rejected(campplus_onnx: Path) -> None:
    with pytest.raises(ValueError, match="must be one of"):
        select_speaker_embedding_backend(campplus_onnx, CPU, request="gpu")  # type: ignore[arg-type]


# ---- TensorRT: availability and engine cache (fakes only) --------------------------------------


def test_tensorrt_availability_is_probed_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    if importlib.util.find_spec("tensorrt") is None:
        assert "not installed" in str(speaker_embedding_trt.tensorrt_unavailable_reason())
    fake = types.ModuleType("tensorrt")
    fake.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    assert speaker_embedding_trt.tensorrt_unavailable_reason() is None


def _key(path: Path, gpu: str = "NVIDIA H100 80GB HBM3", trt: str = "10.3.0") -> EngineCacheKey:
    return EngineCacheKey.for_file(path, gpu_name=gpu, tensorrt_version=trt)


def test_engine_key_tracks_file_identity_gpu_and_tensorrt_version(tmp_path: Path) -> None:
    onnx = tmp_path / "campplus.onnx"
    onnx.write_bytes(b"a" * 100)
    os.utime(onnx, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    base = _key(onnx)
    assert base.onnx_path == str(onnx.resolve()) and base.onnx_size == 100
    assert base.onnx_mtime_ns == 1_700_000_000_000_000_000
    assert _key(onnx).digest == base.digest  # same identity, same engine file
    variants = {
        "gpu": _key(onnx, gpu="NVIDIA L20").digest,
        "trt": _key(onnx, trt="10.4.0").digest,
    }
    os.utime(onnx, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_001))
    variants["mtime"] = _key(onnx).digest
    onnx.write_bytes(b"a" * 101)
    os.utime(onnx, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    variants["size"] = _key(onnx).digest
    assert len(set(variants.values()) | {base.digest}) == 5, variants
    assert base.engine_path(tmp_path).name == f"campplus-{base.digest}.plan"


def test_engine_key_for_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"campplus\.onnx does not exist"):
        _key(tmp_path / "campplus.onnx")


def test_engine_is_built_once_by_sixteen_threads_and_written_atomically(tmp_path: Path) -> None:
    engine = tmp_path / "engines" / "campplus-x.plan"
    builds: list[int] = []
    barrier = threading.Barrier(16)
    results: list[bytes] = []

    def build() -> bytes:
        builds.append(1)
        time.sleep(0.05)
        return b"serialized-engine"

    def worker() -> None:
        barrier.wait()
        results.append(load_or_build_engine(engine, build))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert results == [b"serialized-engine"] * 16
    assert engine.read_bytes() == b"serialized-engine"
    assert sorted(p.name for p in engine.parent.iterdir()) == [engine.name]  # no tmp file left
    assert (
        load_or_build_engine(engine, lambda: pytest.fail("cached engine must not be rebuilt")) == b"serialized-engine"
    )


def test_engines_have_separate_locks(tmp_path: Path) -> None:
    # A's build waits until B's build has run: with one global lock this would deadlock (and time out).
    b_built = threading.Event()

    def build_a() -> bytes:
        assert b_built.wait(timeout=5), "engine B was blocked by engine A's lock"
        return b"A"

    def build_b() -> bytes:
        b_built.set()
        return b"B"

    thread = threading.Thread(target=lambda: load_or_build_engine(tmp_path / "a.plan", build_a))
    thread.start()
    time.sleep(0.05)
    assert load_or_build_engine(tmp_path / "b.plan", build_b) == b"B"
    thread.join(timeout=10)
    assert (tmp_path / "a.plan").read_bytes() == b"A"


def test_failed_engine_build_leaves_no_file_and_is_retried(tmp_path: Path) -> None:
    engine = tmp_path / "campplus-y.plan"

    def broken() -> bytes:
        raise RuntimeError("TensorRT failed to build an engine")

    with pytest.raises(RuntimeError, match="failed to build"):
        load_or_build_engine(engine, broken)
    assert list(tmp_path.iterdir()) == []
    assert load_or_build_engine(engine, lambda: b"ok") == b"ok"


# ---- device twins ------------------------------------------------------------------------------


@pytest.mark.core_model
@hardware_test(res={"cuda": "H100"}, num_cards=1)
def test_tensorrt_engine_matches_onnxruntime_on_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if speaker_embedding_trt.tensorrt_unavailable_reason() is not None:
        pytest.skip(str(speaker_embedding_trt.tensorrt_unavailable_reason()))
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    onnx = ensure_standin_campplus_onnx()
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path))  # a fresh engine cache
    feat = _feat(300)
    device = platforms.current_omni_platform.torch_device(0)
    trt_out = speaker_embedding_trt.TrtSpeakerEmbedding(onnx, device)(feat).cpu().numpy()
    ort_out = OrtSpeakerEmbedding(onnx, CPU)(feat).numpy()
    cos = float((trt_out * ort_out).sum() / np.linalg.norm(trt_out) / np.linalg.norm(ort_out))
    assert cos > 0.999


# ---- TensorRT backend construction against a fake `tensorrt` module ----------------------------


class _FakeCudaPlatform(CudaDevicePlatform):
    """A CUDA platform that answers without a GPU."""

    def get_device_name(self, index: int | None = None) -> str:
        return "NVIDIA H100 80GB HBM3 (fake)"

    def current_device_index(self) -> int | None:
        return 0


def _fake_tensorrt(*, parse_ok: bool = True, build_ok: bool = True) -> types.ModuleType:
    """The slice of the TensorRT Python API the backend uses, recording what it is asked to do."""
    trt = types.ModuleType("tensorrt")
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    trt.__version__ = "10.3.0.fake"
    trt.builds = []  # type: ignore[attr-defined]
    trt.profiles = []  # type: ignore[attr-defined]

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            self.level = level

    class _Input:
        name = "input"

    class Network:
        def get_input(self, index: int) -> _Input:
            return _Input()

    class Parser:
        num_errors = 0 if parse_ok else 1

        def __init__(self, network: Network, logger: Logger) -> None:
            pass

        def parse(self, data: bytes) -> bool:
            return parse_ok

        def get_error(self, index: int) -> str:
            return "In node 3 (Conv): unsupported padding"

    class Profile:
        def set_shape(self, name: str, lo: tuple[int, ...], opt: tuple[int, ...], hi: tuple[int, ...]) -> None:
            trt.profiles.append((name, lo, opt, hi))  # type: ignore[attr-defined]

    class Config:
        def add_optimization_profile(self, profile: Profile) -> None:
            pass

    class Builder:
        def __init__(self, logger: Logger) -> None:
            pass

        def create_network(self, flags: int) -> Network:
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes | None:
            trt.builds.append(1)  # type: ignore[attr-defined]
            return b"fake-plan" if build_ok else None

    class TensorIOMode:
        INPUT = "input-mode"
        OUTPUT = "output-mode"

    class Engine:
        num_io_tensors = 2

        def get_tensor_name(self, index: int) -> str:
            return ("input", "output")[index]

        def get_tensor_mode(self, name: str) -> str:
            return TensorIOMode.INPUT if name == "input" else TensorIOMode.OUTPUT

        def create_execution_context(self) -> object:
            return object()

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            return Engine() if data == b"fake-plan" else None

    class NetworkDefinitionCreationFlag:
        EXPLICIT_BATCH = 0

    for name, value in list(locals().items()):
        if isinstance(value, type):
            setattr(trt, name, value)
    trt.OnnxParser = Parser  # type: ignore[attr-defined]
    return trt


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    platforms.reset_current_platform(_FakeCudaPlatform())
    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(cache))
    return cache


def test_tensorrt_backend_builds_once_and_reuses_the_cached_engine(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch, fake_cuda: Path
) -> None:
    trt = _fake_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    first = speaker_embedding_trt.TrtSpeakerEmbedding(campplus_onnx, torch.device("cuda", 0))
    second = speaker_embedding_trt.TrtSpeakerEmbedding(campplus_onnx, torch.device("cuda", 0))
    assert trt.builds == [1]  # type: ignore[attr-defined]
    assert trt.profiles == [("input", (1, 4, 80), (1, 500, 80), (1, 3000, 80))]  # type: ignore[attr-defined]
    expected = EngineCacheKey.for_file(
        campplus_onnx, gpu_name="NVIDIA H100 80GB HBM3 (fake)", tensorrt_version="10.3.0.fake"
    ).engine_path(fake_cuda / "tensorrt")
    assert first.engine_path == second.engine_path == expected
    assert expected.read_bytes() == b"fake-plan"
    assert first.name == "tensorrt-cuda:0" and first.device == torch.device("cuda", 0)
    # selection goes through the same constructor when tensorrt is importable
    chosen = select_speaker_embedding_backend(campplus_onnx, torch.device("cuda", 0), request="device")
    assert chosen.name == "tensorrt-cuda:0" and trt.builds == [1]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("parse_ok", "build_ok", "match"),
    [(False, True, "cannot parse the speaker model: In node 3"), (True, False, "failed to build an engine")],
)
def test_tensorrt_build_failures_raise_and_cache_nothing(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch, fake_cuda: Path, parse_ok: bool, build_ok: bool, match: str
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(parse_ok=parse_ok, build_ok=build_ok))
    with pytest.raises(RuntimeError, match=match):
        speaker_embedding_trt.TrtSpeakerEmbedding(campplus_onnx, torch.device("cuda", 0))
    assert list((fake_cuda / "tensorrt").glob("*")) == []


def test_tensorrt_refuses_to_build_an_engine_for_another_network(
    other_net_onnx: Path, monkeypatch: pytest.MonkeyPatch, fake_cuda: Path
) -> None:
    trt = _fake_tensorrt()  # its parser would accept the file
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    with pytest.raises(CampplusOnnxError, match="not a CAM\\+\\+ export"):
        speaker_embedding_trt.TrtSpeakerEmbedding(other_net_onnx, torch.device("cuda", 0))
    assert trt.builds == []  # type: ignore[attr-defined]
    assert list((fake_cuda / "tensorrt").glob("*")) == []


def test_corrupt_cached_engine_is_reported_with_its_path(
    campplus_onnx: Path, monkeypatch: pytest.MonkeyPatch, fake_cuda: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt())
    key = EngineCacheKey.for_file(
        campplus_onnx, gpu_name="NVIDIA H100 80GB HBM3 (fake)", tensorrt_version="10.3.0.fake"
    )
    path = key.engine_path(fake_cuda / "tensorrt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"truncated")
    with pytest.raises(RuntimeError, match="cannot deserialize the cached engine; delete the file"):
        speaker_embedding_trt.TrtSpeakerEmbedding(campplus_onnx, torch.device("cuda", 0))
