# SPDX-License-Identifier: Apache-2.0
"""The one facade base: every family's facade is a `Token2WavFacade`, satisfies the stage's `StageCore`
Protocol, and runs the speaker / prompt / loading code written once in the base (not a copy of it)."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.models.audio.mel import PROMPT_MEL_CONFIG
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import (
    MiniCPMO45Token2wav,
    MiniCPMO45Token2WavCore,
)
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.assets import STEP_AUDIO2_ASSETS
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.facade import Token2WavFacade
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import StageCore

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

FACADES = [Token2WavCore, StepAudio2Token2WavCore, MiniCPMO45Token2WavCore, MiniCPMO45Token2wav, CosyVoice3Token2Wav]

#: What the base owns and no family may redefine (the forwarding issue 31 found copied three times).
BASE_MEMBERS = (
    "device",
    "asset_path",
    "request_seed",
    "spk_backend",
    "spk_model",
    "install_spk_backend",
    "reload_spk_embedding",
    "enable_device_spk_embedding",
    "enable_spk_embedding",
    "enable_trt_spk_embedding",
    "speaker_embedding",
    "prompt_cache_stats",
    "clear_prompt_cache",
    "models_loaded",
    "load_models",
    "load",
)


def _protocol_members(protocol: type) -> list[str]:
    return sorted(
        name for name, value in vars(protocol).items() if not name.startswith("_") and not isinstance(value, type)
    )


def _params(member: object) -> list[tuple[str, inspect._ParameterKind]]:
    function = member.fget if isinstance(member, property) else member
    assert callable(function)
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


class _ZeroBackend:
    """A speaker backend that returns a fixed embedding (any `__call__` / `name` / `device` may be installed)."""

    name = "zeros-test"
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, feat: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.full((1, 192), 0.5, dtype=torch.float32)


@pytest.mark.parametrize("cls", FACADES, ids=lambda c: c.__name__)
def test_each_facade_is_the_base_and_provides_stage_core_with_its_signatures(cls: type) -> None:
    assert issubclass(cls, Token2WavFacade)
    members = _protocol_members(StageCore)
    assert members == [
        "check_assets",
        "device",
        "enable_spk_embedding",
        "load_models",
        "models_loaded",
        "spk_backend",
    ]
    for name in members:
        ours, declared = getattr(cls, name), vars(StageCore)[name]
        assert isinstance(ours, property) == isinstance(declared, property), name
        assert _params(ours) == _params(declared), f"{cls.__name__}.{name}"


def test_instances_satisfy_the_runtime_protocol(tmp_path: Path, token2wav_dir: Path, cv3_dir: Path) -> None:
    cores = [Token2WavCore(tmp_path), CosyVoice3Token2Wav(tmp_path), MiniCPMO45Token2wav(token2wav_dir)]
    assert all(isinstance(core, StageCore) for core in cores)
    assert not isinstance(object(), StageCore)  # the check can fail


@pytest.mark.parametrize("cls", FACADES, ids=lambda c: c.__name__)
def test_the_forwarding_is_written_once_in_the_base(cls: type) -> None:
    for name in BASE_MEMBERS:
        assert getattr(cls, name) is getattr(Token2WavFacade, name), f"{cls.__name__} redefines {name}"
    # prepare_prompt: the CosyVoice2 core adds `with_tokens`; everything else is the base's.
    expected = Token2WavCore.prepare_prompt if issubclass(cls, Token2WavCore) else Token2WavFacade.prepare_prompt
    assert cls.prepare_prompt is expected


def test_minicpmo_facade_adds_only_its_construction() -> None:
    own = {name for name in vars(MiniCPMO45Token2wav) if not name.startswith("__") and name != "_abc_impl"}
    assert own == set()
    assert {"__init__", "__repr__"} <= set(vars(MiniCPMO45Token2wav))
    assert MiniCPMO45Token2wav.__mro__[1:3] == (MiniCPMO45Token2WavCore, Token2WavCore)


@pytest.mark.parametrize("family", ["core", "cosyvoice3"])
def test_both_families_run_the_same_speaker_path(
    family: str, token2wav_dir: Path, cv3_dir: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    facade: Token2WavFacade = (
        Token2WavCore(token2wav_dir, device="cpu") if family == "core" else CosyVoice3Token2Wav(cv3_dir, device="cpu")
    )
    assert facade.spk_backend == "onnxruntime-cpu"  # nothing installed, nothing built
    backend = _ZeroBackend()
    facade.install_spk_backend(backend)
    assert facade.spk_backend == "zeros-test" and facade.spk_model is backend
    first = facade.speaker_embedding(short_speech)
    again = facade.prepare_prompt(short_speech)
    assert torch.equal(first, torch.full((1, 192), 0.5)) and torch.equal(again.speaker_embedding, first)
    assert backend.calls == 1 and again.backend == "zeros-test"
    stats = facade.prompt_cache_stats
    assert (stats.hits, stats.misses) == (1, 1)
    facade.clear_prompt_cache()
    assert facade.prompt_cache_stats.size == 0
    assert facade.request_seed(None) == 0 and facade.request_seed(7) == 7


@pytest.mark.parametrize("cls", [Token2WavCore, CosyVoice3Token2Wav, MiniCPMO45Token2WavCore], ids=lambda c: c.__name__)
def test_errors_name_the_owning_class_and_construction_checks_are_shared(cls: type, tmp_path: Path) -> None:
    facade = cls(tmp_path)
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: this token2wav layout has no such asset"):
        facade.asset_path(None)
    with pytest.raises(FileNotFoundError, match="campplus.onnx is missing"):
        facade.check_assets()
    assert not facade.models_loaded
    with pytest.raises(ValueError, match="n_timesteps must be an int >= 1, got 0"):
        cls(tmp_path, n_timesteps=0)
    assert repr(facade).startswith(f"{cls.__name__}({str(tmp_path)!r}")


class _CountingFacade(Token2WavFacade):
    """A minimal family: counts what the base's loading lifecycle calls."""

    assets = STEP_AUDIO2_ASSETS
    prompt_mel_config = PROMPT_MEL_CONFIG
    has_speech_tokenizer = False

    def __init__(self, model_path: Path, *, fail_assets: bool = False) -> None:
        super().__init__(model_path, device="cpu")
        self.fail_assets = fail_assets
        self.loads = 0

    def check_assets(self) -> list[Path]:
        if self.fail_assets:
            raise FileNotFoundError("toy asset missing")
        return []

    def _load_synthesis_models(self) -> None:
        self.loads += 1


def test_load_models_is_idempotent_installs_the_fallback_and_fails_before_building(token2wav_dir: Path) -> None:
    toy = _CountingFacade(token2wav_dir)
    backend = _ZeroBackend()
    toy.install_spk_backend(backend)
    toy.load()
    toy.load_models()
    assert toy.loads == 1 and toy.models_loaded
    assert toy.spk_model is backend  # an installed backend is never replaced

    bare = _CountingFacade(token2wav_dir)
    bare.load_models()
    assert bare.spk_backend == "onnxruntime-cpu" and bare.loads == 1  # the lazy fallback, session not built

    broken = _CountingFacade(token2wav_dir, fail_assets=True)
    with pytest.raises(FileNotFoundError, match="toy asset missing"):
        broken.load_models()
    assert broken.loads == 0 and not broken.models_loaded
