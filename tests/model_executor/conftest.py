# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the model tests: the parts (`layers/`) and the models and facades (`models/`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.token2wav import make_token2wav_dir
from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.assets.audio import speech_sample
from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform


@pytest.fixture
def cpu_platform() -> Iterator[None]:
    """Serve on the CPU platform for the test, whatever this host has (use via `usefixtures`)."""
    platforms.reset_current_platform(CpuDevicePlatform())
    yield
    platforms.reset_current_platform()


@pytest.fixture(scope="module")
def token2wav_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Full-size stand-in CAM++ with the reduced synthesis stand-ins: a complete, fast token2wav directory."""
    return make_token2wav_dir(tmp_path_factory.mktemp("token2wav"), synthesis=True)


@pytest.fixture(scope="module")
def speech() -> tuple[np.ndarray, int]:
    """The shipped 4 s real speech clip (16 kHz)."""
    return speech_sample()


@pytest.fixture(scope="module")
def short_speech(speech: tuple[np.ndarray, int]) -> tuple[np.ndarray, int]:
    """Its first 1.5 s: enough for every check that does not compare backends numerically."""
    wav, rate = speech
    return wav[: int(1.5 * rate)].copy(), rate


@pytest.fixture(scope="session")
def cv3_dir() -> Path:
    """The reduced stand-in Fun-CosyVoice3 directory (campplus.onnx full size, reduced flow.pt + causal hift.pt,
    cosyvoice3.yaml, default_voice.wav + .tokens), built once and cached."""
    from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

    return ensure_standin_cosyvoice3_dir(reduced=True)
