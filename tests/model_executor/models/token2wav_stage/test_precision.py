# SPDX-License-Identifier: Apache-2.0
"""The flow's dtype per platform (`token2wav_dtype`, `token2wav_float16`: `precision.py`) and the K/V arena after it.

Accelerator platforms are platform objects that answer without a device (no GPU or NPU needed): the
default must come from the platform object, so a fake CUDA / NPU platform is enough to check it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import stage_options
from vllm_omni_token2wav.model_executor.models.token2wav_stage.precision import (
    parse_flow_dtype,
    requested_flow_dtype,
    resolve_flow_dtype,
)
from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform
from vllm_omni_token2wav.platforms.cuda.platform import CudaDevicePlatform
from vllm_omni_token2wav.platforms.npu.platform import NpuDevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

ACCELERATORS = [CudaDevicePlatform, NpuDevicePlatform]


@pytest.fixture
def serve_on() -> Iterator[Any]:
    """Make a platform object the current one for the test (`serve_on(platform)`), restored afterwards."""
    yield platforms.reset_current_platform
    platforms.reset_current_platform()


def config(extra: dict[str, Any] | None = None, device: Any = None, hf: Any = None) -> SimpleNamespace:
    """A duck-typed VllmConfig: `additional_config`, the device config's device, the model's hf_config."""
    return SimpleNamespace(
        additional_config=extra or {},
        device_config=SimpleNamespace(device=device),
        model_config=SimpleNamespace(hf_config=hf),
    )


# ---- the default per platform ------------------------------------------------------------------


def test_the_cpu_platform_defaults_to_float32(serve_on: Any) -> None:
    serve_on(CpuDevicePlatform())
    assert CpuDevicePlatform().default_flow_dtype() == torch.float32
    assert stage_options(config(), {}).flow_dtype == torch.float32
    assert stage_options(config(device="cpu"), {}).flow_dtype == torch.float32


@pytest.mark.parametrize("platform_class", ACCELERATORS, ids=["cuda", "npu"])
def test_an_accelerator_platform_defaults_to_float16_for_its_device(platform_class: type, serve_on: Any) -> None:
    platform = platform_class()
    serve_on(platform)
    assert platform.default_flow_dtype() == torch.float16
    for device in (None, platform.device_type, f"{platform.device_type}:1", 0):
        options = stage_options(config(device=device), {})
        assert options.flow_dtype == torch.float16 and options.float16, device
    assert stage_options(config(), {"flow_dtype": "auto"}).flow_dtype == torch.float16
    # a stage placed on the CPU of an accelerator host stays fp32
    assert stage_options(config(device="cpu"), {}).flow_dtype == torch.float32


def test_the_default_is_asked_of_the_platform_object_not_of_torch() -> None:
    class Custom(CudaDevicePlatform):
        def default_flow_dtype(self) -> torch.dtype:
            return torch.bfloat16

    assert resolve_flow_dtype(None, None, Custom()) == torch.bfloat16
    assert resolve_flow_dtype(None, "cuda:1", Custom()) == torch.bfloat16
    assert resolve_flow_dtype(None, "cpu", Custom()) == torch.float32


# ---- explicit choices ----------------------------------------------------------------------------


@pytest.mark.parametrize("platform_class", ACCELERATORS, ids=["cuda", "npu"])
@pytest.mark.parametrize(
    "extra",
    [{"token2wav_dtype": "float32"}, {"token2wav_float16": False}, {"token2wav_float16": "false"}],
    ids=["token2wav_dtype", "token2wav_float16-false", "token2wav_float16-string"],
)
def test_explicit_fp32_is_honoured_on_an_accelerator(platform_class: type, extra: dict, serve_on: Any) -> None:
    serve_on(platform_class())
    assert stage_options(config(extra, device=platform_class.device_type), {}).flow_dtype == torch.float32


def test_a_keyword_override_wins_over_the_deploy_keys_and_the_platform(serve_on: Any) -> None:
    serve_on(CudaDevicePlatform())
    cfg = config({"token2wav_dtype": "bfloat16"}, device="cuda")
    assert stage_options(cfg, {}).flow_dtype == torch.bfloat16
    assert stage_options(cfg, {"flow_dtype": "float32"}).flow_dtype == torch.float32
    assert stage_options(cfg, {"flow_dtype": torch.float16}).flow_dtype == torch.float16


@pytest.mark.parametrize(
    ("extra", "hf", "expected"),
    [
        ({"token2wav_float16": True}, None, torch.float16),  # MiniCPM-o's key, on a CPU too (upstream's meaning)
        ({}, SimpleNamespace(token2wav_float16=True), torch.float16),  # Step-Audio2's hf_config
        ({"token2wav_dtype": "bf16"}, None, torch.bfloat16),
        ({"token2wav_dtype": "float16", "token2wav_float16": True}, None, torch.float16),  # agreeing
        ({"token2wav_dtype": "auto", "token2wav_float16": False}, None, torch.float32),
        ({"token2wav_dtype": "auto"}, None, torch.float32),  # auto on the CPU platform
    ],
)
def test_the_deploy_keys_on_a_cpu(extra: dict[str, Any], hf: Any, expected: torch.dtype, serve_on: Any) -> None:
    serve_on(CpuDevicePlatform())
    assert stage_options(config(extra, device="cpu", hf=hf), {}).flow_dtype == expected


def test_contradicting_keys_and_unknown_values_name_the_keys() -> None:
    with pytest.raises(ValueError, match=r"token2wav_dtype: bfloat16 contradicts token2wav_float16: true"):
        requested_flow_dtype({"token2wav_dtype": "bfloat16", "token2wav_float16": True})
    with pytest.raises(ValueError, match=r"token2wav_dtype: float16 contradicts token2wav_float16: false"):
        requested_flow_dtype({"token2wav_dtype": "float16", "token2wav_float16": False})
    with pytest.raises(ValueError, match=r"token2wav_dtype must be auto, float32, float16 or bfloat16, got 'fp8'"):
        parse_flow_dtype("fp8")
    with pytest.raises(ValueError, match=r"token2wav_float16 must be true or false, got 'maybe'"):
        requested_flow_dtype({"token2wav_float16": "maybe"})


# ---- the models follow: the flow's parameters and the K/V arena ---------------------------------


@pytest.mark.usefixtures("cpu_platform")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_the_flow_and_its_kv_arena_follow_the_dtype_while_vocoder_and_speaker_stay_fp32(dtype: torch.dtype) -> None:
    from vllm_omni_token2wav.assets.audio import speech_sample
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import read_prompt_tokens, voice_tokens_path
    from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir
    from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore

    folder = ensure_standin_cosyvoice3_dir(reduced=True)
    cv3 = CosyVoice3Token2Wav(folder, device="cpu", n_timesteps=2, flow_dtype=dtype)
    wav = folder / "default_voice.wav"
    voice = cv3.prompt(str(wav), read_prompt_tokens(voice_tokens_path(wav))[:, :40])
    state = cv3.set_stream_cache(prompt=voice)
    audio = cv3.stream(list(range(30)), state=state, return_waveform=True)
    kv = state.caches.flow.kv
    assert (kv.keys.dtype, kv.values.dtype) == (dtype, dtype) and kv.keys.numel() > 0
    assert cv3.flow.dtype == dtype and {p.dtype for p in cv3.hift.parameters()} <= {torch.float32, torch.float64}
    assert audio.dtype == torch.float32 and voice.embedding.dtype == torch.float32  # CAM++ stays fp32

    core = StepAudio2Token2WavCore(
        ensure_standin_token2wav_dir(reduced=True), device="cpu", n_timesteps=2, flow_dtype=dtype
    )
    wave, rate = speech_sample()
    stream = core.set_stream_cache((wave[: 3 * rate].copy(), rate))
    audio = core.stream(list(range(30)), last_chunk=False, return_waveform=True, state=stream)
    att = stream.caches.flow.estimator_att
    assert (att.own.dtype, att.base.dtype) == (dtype, dtype)
    assert {p.dtype for p in core.hift.parameters()} == {torch.float32} and audio.dtype == torch.float32


@pytest.mark.usefixtures("cpu_platform")
def test_an_explicit_kv_dtype_still_wins_over_the_flows() -> None:
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
    from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

    folder = str(ensure_standin_cosyvoice3_dir(reduced=True))
    follows = CosyVoice3Code2Wav(model=folder, device="cpu", flow_dtype="float16")
    follows.load_weights([])
    assert follows.backend.kv_dtype == torch.float16  # type: ignore[attr-defined]
    kept = CosyVoice3Code2Wav(model=folder, device="cpu", flow_dtype="float16", kv_cache_dtype="float32")
    kept.load_weights([])
    assert kept.backend.kv_dtype == torch.float32  # type: ignore[attr-defined]


class _OneCudaPlatform(CudaDevicePlatform):
    """CUDA platform that answers without a GPU (device index 0)."""

    def current_device_index(self) -> int | None:
        return 0


@pytest.mark.parametrize("family", ["minicpmo_4_5", "step_audio2", "cosyvoice3"])
def test_the_stage_of_each_family_hands_the_platform_default_or_the_explicit_dtype_to_its_facade(
    family: str, serve_on: Any, tmp_path: Path
) -> None:
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
    from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
    from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir
    from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
        StepAudio2Token2WavForConditionalGeneration,
    )

    serve_on(_OneCudaPlatform())
    shipped = tmp_path / "model"  # laid out as Step-Audio2 / MiniCPM-o ship it: the token2wav folder inside
    shipped.mkdir()
    (shipped / "token2wav").symlink_to(ensure_standin_token2wav_dir(reduced=True))
    stage_class, folder = {
        "minicpmo_4_5": (MiniCPMO45Code2Wav, shipped),
        "step_audio2": (StepAudio2Token2WavForConditionalGeneration, shipped),
        "cosyvoice3": (CosyVoice3Code2Wav, ensure_standin_cosyvoice3_dir(reduced=True)),
    }[family]
    # construction loads no model (nothing touches the absent GPU); the CPU speaker backend, no budget
    common = {"model": str(folder), "spk_backend": "onnxruntime", "memory_budget": "off"}
    for given, expected in ({}, torch.float16), ({"flow_dtype": "float32"}, torch.float32):
        stage = stage_class(**common, **given)
        assert stage.options.flow_dtype == expected and stage.backend.core.flow_dtype == expected, given
        assert stage.backend.core.device.type == "cuda"
