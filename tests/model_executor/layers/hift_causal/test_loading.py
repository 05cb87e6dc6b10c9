# SPDX-License-Identifier: Apache-2.0
"""Causal HiFT checkpoints: strict loads of both key schemes, full-size counts, float64 F0, mix-ups."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.model_executor.layers.hift_causal.conftest import NOISE, flow_like_mel
from vllm_omni_token2wav.model_executor.layers.hift import HiFTLoadError, load_hift, write_standin_hift
from vllm_omni_token2wav.model_executor.layers.hift.loader import expected_hift_shapes, load_hift_state_dict
from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    FULL_CAUSAL_HIFT_CONFIG,
    FULL_CAUSAL_HIFT_NUM_KEYS,
    FULL_CAUSAL_HIFT_NUM_PARAMS,
    CausalHiFTGenerator,
    load_causal_hift,
    standin_causal_hift_state_dict,
    write_standin_causal_hift,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _weight_norm64(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w = g * v / ||v|| over all dims but 0, in float64 (independent of torch._weight_norm)."""
    g, v = g.double(), v.double()
    return g * v / v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))


def test_full_size_layout_has_the_shipped_key_and_parameter_counts() -> None:
    with torch.device("meta"):
        model = CausalHiFTGenerator(FULL_CAUSAL_HIFT_CONFIG)
    shapes = expected_hift_shapes(model)
    assert len(shapes) == FULL_CAUSAL_HIFT_NUM_KEYS == 328
    assert sum(math.prod(s) for s in shapes.values()) == FULL_CAUSAL_HIFT_NUM_PARAMS == 20_779_887
    assert len(model.weight_norm_modules()) == 82
    # The causal layers' shapes (reference: CausalConv1d / CausalConv1dUpsample weights are (out, in, k)).
    assert shapes["conv_pre.parametrizations.weight.original1"] == (512, 80, 5)
    assert shapes["ups.0.parametrizations.weight.original1"] == (256, 512, 16)
    assert shapes["ups.0.parametrizations.weight.original0"] == (256, 1, 1)
    assert shapes["f0_predictor.condnet.0.parametrizations.weight.original1"] == (512, 80, 4)
    assert shapes["source_downs.0.weight"] == (256, 18, 30)
    # Nothing non-persistent in the state_dict, and no noise table tensor anywhere in it.
    assert set(model.state_dict()) == {k for k in shapes if "parametrizations" not in k} | {
        name + ".weight" for name, _ in model.weight_norm_modules()
    }


def test_full_size_standin_loads_strictly() -> None:
    state_dict = standin_causal_hift_state_dict(reduced=False, seed=1)
    assert len(state_dict) == FULL_CAUSAL_HIFT_NUM_KEYS
    assert sum(v.numel() for v in state_dict.values()) == FULL_CAUSAL_HIFT_NUM_PARAMS
    load_hift_state_dict(CausalHiFTGenerator(FULL_CAUSAL_HIFT_CONFIG), state_dict)


@pytest.mark.parametrize("key_scheme", ["new", "old"])
@pytest.mark.parametrize("prefix", [False, True])
def test_both_key_schemes_and_the_prefix_load_with_float64_f0(tmp_path: Path, key_scheme: str, prefix: bool) -> None:
    path = write_standin_causal_hift(tmp_path / "hift.pt", reduced=True, seed=2, key_scheme=key_scheme, prefix=prefix)
    raw = torch.load(path, weights_only=True)
    assert len(raw) == FULL_CAUSAL_HIFT_NUM_KEYS
    assert all(k.startswith("generator.") for k in raw) == prefix
    model = load_causal_hift(path, device="cpu", noise=NOISE)
    pre = "generator." if prefix else ""
    g_key, v_key = (
        (".weight_g", ".weight_v")
        if key_scheme == "old"
        else (
            ".parametrizations.weight.original0",
            ".parametrizations.weight.original1",
        )
    )
    # The decoder folds in float32 ...
    w = model.ups[2].weight
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, _weight_norm64(raw[pre + "ups.2" + g_key], raw[pre + "ups.2" + v_key]).float())
    # ... the F0 predictor in float64 from the float32 g and v, as the reference after .to(float64).
    f0w = model.f0_predictor.condnet[4].weight
    assert f0w.dtype == torch.float64
    expected = _weight_norm64(raw[pre + "f0_predictor.condnet.4" + g_key], raw[pre + "f0_predictor.condnet.4" + v_key])
    torch.testing.assert_close(f0w, expected, rtol=1e-15, atol=0)
    assert model.f0_predictor.classifier.weight.dtype == torch.float64


def test_folded_and_parametrised_weight_norm_give_the_same_audio(
    reduced_path: Path, model: CausalHiFTGenerator
) -> None:
    unfolded = load_causal_hift(reduced_path, device="cpu", fold_weight_norm=False, noise=NOISE)
    assert hasattr(unfolded.conv_pre, "parametrizations") and hasattr(
        unfolded.f0_predictor.condnet[0], "parametrizations"
    )
    mel = flow_like_mel(20, seed=3)
    with torch.inference_mode():
        torch.testing.assert_close(unfolded.inference(mel), model.inference(mel), rtol=0, atol=1e-7)


def test_casts_and_moves_keep_the_f0_predictor_in_float64(reduced_path: Path) -> None:
    model = load_causal_hift(reduced_path, device="cpu", noise=NOISE)
    before = model.f0_predictor.condnet[2].weight.clone()
    model.to(torch.bfloat16)
    assert model.conv_pre.weight.dtype == torch.bfloat16
    assert model.f0_predictor.condnet[2].weight.dtype == torch.float64
    model.float()
    assert torch.equal(model.f0_predictor.condnet[2].weight, before)
    model.place_f0_predictor("cpu")
    assert model.predictor_device == torch.device("cpu") and model.f0_device == torch.device("cpu")


def test_a_default_dtype_change_does_not_leak_into_the_model(reduced_path: Path) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what vLLM does around model init
    try:
        model = load_causal_hift(reduced_path, device="cpu", noise=NOISE)
    finally:
        torch.set_default_dtype(previous)
    assert model.conv_post.weight.dtype == torch.float32 and model.stft_window.dtype == torch.float32


def test_loading_the_other_vocoder_names_the_mix_up(tmp_path: Path, reduced_path: Path) -> None:
    non_causal = write_standin_hift(tmp_path / "hift_original.pt", reduced=True, seed=1)
    with pytest.raises(HiFTLoadError, match=r"conv_pre kernel is 7, expected 5: the file holds the non-causal HiFT"):
        load_causal_hift(non_causal, device="cpu")
    with pytest.raises(HiFTLoadError, match=r"conv_pre kernel is 5, expected 7: the file holds CosyVoice3's causal"):
        load_hift(reduced_path, device="cpu")


def test_broken_causal_checkpoints_are_rejected(tmp_path: Path) -> None:
    state_dict = standin_causal_hift_state_dict(reduced=True, seed=2)
    state_dict["f0_predictor.condnet.2.parametrizations.weight.original1"] = torch.ones(32, 32, 5)
    torch.save(state_dict, tmp_path / "shape.pt")
    with pytest.raises(HiFTLoadError, match=r"condnet\.2\..*file \(32, 32, 5\) vs model \(32, 32, 3\)"):
        load_causal_hift(tmp_path / "shape.pt", device="cpu")
    state_dict = standin_causal_hift_state_dict(reduced=True, seed=2)
    del state_dict["source_downs.1.bias"]
    torch.save(state_dict, tmp_path / "missing.pt")
    with pytest.raises(
        HiFTLoadError, match=r"CausalHiFTGenerator\(base_channels=32\).*1 missing \[source_downs\.1\.bias"
    ):
        load_causal_hift(tmp_path / "missing.pt", device="cpu")
    with pytest.raises(FileNotFoundError, match="hift.pt not found"):
        load_causal_hift(tmp_path / "absent.pt", device="cpu")
