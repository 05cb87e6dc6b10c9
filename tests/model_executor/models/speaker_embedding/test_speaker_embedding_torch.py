# SPDX-License-Identifier: Apache-2.0
"""The process cache of the torch CAM++ never serves weights of an older version of the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.token2wav import rewrite_in_place_same_size
from tests.model_executor.models.speaker_embedding.campplus.helpers import (
    max_abs_and_cosine,
    ort_embed,
    ort_session,
    speaker_feats,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as set_

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture
def own_copy(tmp_path: Path) -> Path:
    """A private copy of the reduced stand-in (the cached original must not be edited)."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    copy = tmp_path / "campplus.onnx"
    shutil.copyfile(ensure_standin_campplus_onnx(reduced=True), copy)
    return copy


def test_a_same_size_in_place_rewrite_with_the_mtime_restored_is_rebuilt(own_copy: Path) -> None:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import ort_seg_pool_mode

    set_.clear_campplus_cache()
    mode = ort_seg_pool_mode()
    before = set_.get_campplus_torch(own_copy, "cpu", seg_pool_mode=mode)
    assert set_.get_campplus_torch(own_copy, "cpu", seg_pool_mode=mode) is before
    feats = speaker_feats(97)
    old = before(feats).numpy()

    rewrite_in_place_same_size(own_copy)
    after = set_.get_campplus_torch(own_copy, "cpu", seg_pool_mode=mode)
    assert after is not before
    # The rebuilt model computes what onnxruntime computes from the file as it is now.
    expected = ort_embed(ort_session(own_copy), feats)
    got = after(feats).numpy()
    diff, cos = max_abs_and_cosine(got, expected)
    assert cos >= 0.999999 and np.linalg.norm(got - expected) <= 1e-4 * np.linalg.norm(expected), (diff, cos)
    assert not np.allclose(old, expected, rtol=1e-3)  # the edit really changed the embedding
    # The old version's entry is dropped from the cache; whoever holds `before` keeps a working model.
    assert np.array_equal(before(feats).numpy(), old)
    set_.clear_campplus_cache()
