# SPDX-License-Identifier: Apache-2.0
"""Session fixtures: stand-in exports are built once (and cached on disk across sessions)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def full_standin() -> Path:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    return ensure_standin_campplus_onnx(seed=0)


@pytest.fixture(scope="session")
def reduced_standin() -> Path:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    return ensure_standin_campplus_onnx(seed=0, reduced=True)
