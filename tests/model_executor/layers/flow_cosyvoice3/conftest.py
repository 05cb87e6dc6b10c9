# SPDX-License-Identifier: Apache-2.0
"""Reduced CosyVoice3 flow stand-ins for the flow tests (written once per session); one intra-op thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
    CausalMaskedDiffWithDiT,
    load_flow,
    write_standin_flow,
)

STANDIN_SEED = 1234


@pytest.fixture(scope="session")
def cv3_flow_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(cosyvoice3.yaml, flow.pt) of the reduced stand-in."""
    return write_standin_flow(tmp_path_factory.mktemp("cv3_flow_reduced"), reduced=True, seed=STANDIN_SEED)


@pytest.fixture(scope="session")
def cv3_flow(cv3_flow_files: tuple[Path, Path]) -> CausalMaskedDiffWithDiT:
    """Shared read-only reduced flow on the CPU."""
    return load_flow(cv3_flow_files[0].parent, device="cpu")


@pytest.fixture(scope="session")
def cv3_weights(cv3_flow: CausalMaskedDiffWithDiT) -> dict[str, torch.Tensor]:
    """The same weights as a plain dict, for the independent reference."""
    return {k: v.detach().clone() for k, v in cv3_flow.state_dict().items()}


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():
        yield
