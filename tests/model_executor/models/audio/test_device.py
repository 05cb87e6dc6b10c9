# SPDX-License-Identifier: Apache-2.0
"""The front end stays on the waveform's device: no host round trip, device and dtype preserved.

CPU twin: a TorchFunctionMode that fails on every call that would be a device->host transfer or
sync on an accelerator (`.cpu()`, `.numpy()`, `.item()`, `.tolist()`, `bool()/int()/float()` of a
tensor), plus runs on the "meta" device, where any such call raises. The hardware test repeats the
parity check on the platform device (CUDA / NPU) when one is present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.helpers.mark import hardware_test
from tests.model_executor.models.audio.conftest import knf_fbank
from vllm_omni_token2wav.model_executor.models.audio import kaldi_fbank, prompt_mel_24k
from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features

_HOST_CALLS = {"cpu", "numpy", "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__array__"}


class _NoHostRoundTrip(TorchFunctionMode):
    """Raise on any tensor call that needs the tensor's values on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _HOST_CALLS:
            raise AssertionError(f"host round trip: Tensor.{name} called in the device path")
        self.calls.append(name)
        return func(*args, **(kwargs or {}))


PATHS: dict[str, Callable[[], Any]] = {
    "kaldi_fbank": lambda: kaldi_fbank(torch.rand(16000) - 0.5, check_finite=False),
    "kaldi_fbank_matmul": lambda: kaldi_fbank(torch.rand(16000) - 0.5, check_finite=False, dft_impl="matmul"),
    "kaldi_fbank_batched_unsnipped": lambda: kaldi_fbank(
        torch.rand(2, 16000) - 0.5, lengths=[16000, 9000], snip_edges=False, check_finite=False
    ),
    "kaldi_fbank_dither": lambda: kaldi_fbank(
        torch.rand(16000) - 0.5, dither=0.1, generator=torch.Generator().manual_seed(0), check_finite=False
    ),
    "speaker_features": lambda: speaker_features(torch.rand(16000) - 0.5, check_finite=False),
    "speaker_features_batched": lambda: speaker_features(
        torch.rand(2, 16000) - 0.5, lengths=[16000, 9000], check_finite=False
    ),
    "prompt_mel_24k": lambda: prompt_mel_24k(torch.rand(24000) - 0.5, check_finite=False),
    "prompt_mel_24k_matmul": lambda: prompt_mel_24k(torch.rand(24000) - 0.5, check_finite=False, dft_impl="matmul"),
}


@pytest.mark.core_model
@pytest.mark.cpu
@pytest.mark.parametrize("path", list(PATHS))
def test_feature_paths_never_read_tensor_values_on_the_host(path: str) -> None:
    PATHS[path]()  # first call builds the cached constants (host float64 -> device, once per process)
    guard = _NoHostRoundTrip()
    with guard:
        PATHS[path]()
    assert guard.calls, "the guard saw no tensor op: it is not intercepting anything"


@pytest.mark.core_model
@pytest.mark.cpu
def test_guard_catches_a_host_read() -> None:
    with pytest.raises(AssertionError, match="host round trip"), _NoHostRoundTrip():
        bool(torch.ones(2).all())


@pytest.mark.core_model
@pytest.mark.cpu
def test_meta_device_run_with_default_checks_stays_on_the_device() -> None:
    wav = torch.empty(2, 32000, device="meta")
    feats, counts = speaker_features(wav, lengths=[32000, 20000])
    assert feats.device.type == "meta" and feats.shape == (2, 198, 80) and counts.tolist() == [198, 123]
    assert kaldi_fbank(wav[0], snip_edges=False).device.type == "meta"
    assert prompt_mel_24k(torch.empty(48000, device="meta")).shape == (1, 100, 80)


@pytest.mark.core_model
@pytest.mark.cpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_outputs_are_float32_for_any_float_input(dtype: torch.dtype) -> None:
    wav = (torch.rand(24000) - 0.5).to(dtype)
    assert kaldi_fbank(wav).dtype == torch.float32
    assert speaker_features(wav).dtype == torch.float32
    assert prompt_mel_24k(wav).dtype == torch.float32


@pytest.mark.core_model
@hardware_test(res={"cuda": "H100", "npu": "A2"}, num_cards=1)
def test_front_end_on_the_platform_device_matches_kaldi_native_fbank(speech_16k: np.ndarray) -> None:
    from vllm_omni_token2wav import platforms

    device = platforms.current_omni_platform.torch_device()
    wav = torch.from_numpy(speech_16k).to(device)
    feats = kaldi_fbank(wav)
    assert feats.device == wav.device and feats.dtype == torch.float32
    diff = np.abs(feats.cpu().numpy() - knf_fbank(speech_16k))
    assert diff.max() <= 1e-3 and diff.mean() <= 1e-5
    centred = speaker_features(wav)
    assert centred.device == wav.device
    torch.testing.assert_close(centred.cpu(), speaker_features(wav.cpu()), atol=1e-3, rtol=0)
    wav_24k = torch.rand(48000, device=device) - 0.5
    torch.testing.assert_close(prompt_mel_24k(wav_24k).cpu(), prompt_mel_24k(wav_24k.cpu()), atol=1e-4, rtol=0)
