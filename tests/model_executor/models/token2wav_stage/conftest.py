# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the Token2Wav stage tests: a complete reduced stand-in model folder and small voices.

Stage models built here use the reduced stand-in (every interface of the real assets, narrow
layers), 2 Euler steps and 1.5 s reference voices, so a step of several requests runs in well under
a second on a CPU; the numerics under test (batched == solo, state rules) do not depend on sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.token2wav import make_token2wav_dir
from tests.helpers.torch_state import one_intra_op_thread

#: Stage options every test stage uses unless it says otherwise.
FAST_OPTIONS: dict[str, Any] = {"device": "cpu", "n_timesteps": 2, "reference_seconds": 1.5}


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():
        yield


@pytest.fixture(scope="package")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder as Step-Audio2 lays it out: the assets and default voices in `token2wav/`."""
    root = tmp_path_factory.mktemp("model")
    make_token2wav_dir(root / "token2wav", synthesis=True)
    return root


@pytest.fixture(scope="package")
def voices() -> list[tuple[np.ndarray, int]]:
    """Three different reference voices: stretches of the shipped speech clip at 16 kHz."""
    from vllm_omni_token2wav.assets.audio import speech_sample

    wav, rate = speech_sample()
    return [(wav[s : s + int(1.6 * rate)].copy(), rate) for s in (0, int(1.2 * rate), int(2.4 * rate))]
