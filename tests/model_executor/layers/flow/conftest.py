# SPDX-License-Identifier: Apache-2.0
"""Stand-in flow assets for the flow tests: a reduced flow.yaml + seeded flow.pt, written once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.layers.flow import (
    CausalMaskedDiffWithXvec,
    load_flow,
    write_standin_flow,
)

STANDIN_SEED = 1234


@pytest.fixture(scope="session")
def reduced_flow_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_standin_flow(tmp_path_factory.mktemp("flow_reduced"), reduced=True, seed=STANDIN_SEED)


@pytest.fixture(scope="session")
def reduced_flow(reduced_flow_files: tuple[Path, Path]) -> CausalMaskedDiffWithXvec:
    """Shared read-only model; tests that change its state (noise) use `fresh_reduced_flow`."""
    return load_flow(reduced_flow_files, device="cpu")


@pytest.fixture
def fresh_reduced_flow(reduced_flow_files: tuple[Path, Path]) -> CausalMaskedDiffWithXvec:
    return load_flow(reduced_flow_files, device="cpu")


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():
        yield
