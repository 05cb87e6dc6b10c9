# SPDX-License-Identifier: Apache-2.0
"""Our CosyVoice3 stand-in folders against vLLM-Omni 0.30's own code2wav loader (fast: layouts on the meta device).

Upstream's `CosyVoice3Code2Wav` hard-codes the real sizes (`CosyVoice3Config`) and loads `flow.pt` and
`hift.pt` strictly, so the full-size stand-in must have exactly its keys and shapes, and the reduced
one (our fast tests' folder) cannot be loaded by it. The load and a forward of the real-size folder
through upstream run in `test_upstream_code2wav_full_size.py` (level `advanced_model`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the upstream CosyVoice3 code2wav layout tests")


@pytest.fixture(scope="module")
def upstream_on_meta() -> Any:
    """Upstream's code2wav module as its code2wav stage builds it, on the meta device (no memory, no init cost)."""
    from vllm_omni.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
    from vllm_omni.transformers_utils.configs.cosyvoice3 import CosyVoice3Config

    with torch.device("meta"):
        return CosyVoice3Code2Wav(CosyVoice3Config())


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in state.items()}


def test_the_full_size_stand_in_has_upstreams_exact_flow_and_vocoder_layout(upstream_on_meta: Any) -> None:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import REAL_FLOW_CONFIG
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import CausalMaskedDiffWithDiT
    from vllm_omni_token2wav.model_executor.layers.hift_causal.standin import CAUSAL_HIFT_STANDINS

    with torch.device("meta"):  # the stand-in flow.pt is this module's state dict (flow/loader.py)
        flow = CausalMaskedDiffWithDiT(REAL_FLOW_CONFIG)
    assert _shapes(flow.state_dict()) == _shapes(upstream_on_meta.flow_model.state_dict())
    assert CAUSAL_HIFT_STANDINS.shapes(reduced=False) == _shapes(upstream_on_meta.hift.state_dict())


def test_upstreams_strict_loader_rejects_the_reduced_stand_in(upstream_on_meta: Any, cv3_dir: Path) -> None:
    """Why the real-size variant exists: the reduced folder (DiT 2 x 64) is not upstream's model."""
    with pytest.raises(RuntimeError, match=r"(?s)Missing key\(s\).*transformer_blocks\.2\.") as info:
        upstream_on_meta.load_weights(str(cv3_dir), torch.device("cpu"))
    assert "size mismatch" in str(info.value)
