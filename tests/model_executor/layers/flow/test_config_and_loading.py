# SPDX-License-Identifier: Apache-2.0
"""flow.yaml reading, the checkpoint key layout, stand-ins and strict loading."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from tests.helpers.torch_state import process_default_dtype
from vllm_omni_token2wav.model_executor.layers.flow import (
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    build_flow,
    build_flow_from_yaml,
    ensure_standin_flow,
    load_flow,
    render_flow_yaml,
    write_standin_flow,
)
from vllm_omni_token2wav.model_executor.layers.flow.config import TAG_DIT

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

# Public facts about the Step-Audio2 / MiniCPM-o flow.pt (see shared notes): keys and parameters.
REAL_KEYS = 605
REAL_PARAMS = 155_802_352
CONFORMER_LAYER = (19, 3_415_552)
DIT_BLOCK = (24, 7_089_408)


def _count(state: dict[str, torch.Tensor], prefix: str) -> tuple[int, int]:
    keys = [k for k in state if k.startswith(prefix)]
    return len(keys), sum(state[k].numel() for k in keys)


def test_real_flow_yaml_builds_reference_layout_and_round_trips_strictly(tmp_path: Path) -> None:
    """The only full-size test: 605 keys / 155,802,352 params, written and loaded back with strict=True."""
    yaml_path, pt_path = tmp_path / "flow.yaml", tmp_path / "flow.pt"
    yaml_path.write_text(render_flow_yaml(REAL_FLOW_CONFIG))
    built = build_flow_from_yaml(yaml_path)
    state = built.state_dict()
    torch.save(state, pt_path)
    del built
    assert len(state) == REAL_KEYS
    assert sum(v.numel() for v in state.values()) == REAL_PARAMS
    assert _count(state, "encoder.encoders.0.") == CONFORMER_LAYER
    assert _count(state, "encoder.up_encoders.3.") == CONFORMER_LAYER
    assert _count(state, "decoder.estimator.blocks.15.") == DIT_BLOCK
    for key in (
        "input_embedding.weight",
        "spk_embed_affine_layer.weight",
        "encoder_proj.bias",
        "encoder.embed.out.0.weight",
        "encoder.embed.out.1.bias",
        "encoder.pre_lookahead_layer.conv1.weight",
        "encoder.encoders.5.self_attn.pos_bias_u",
        "encoder.encoders.5.self_attn.linear_pos.weight",
        "encoder.encoders.5.feed_forward.w_2.bias",
        "encoder.encoders.5.norm_mha.weight",
        "encoder.up_layer.conv.weight",
        "encoder.up_embed.out.0.weight",
        "encoder.after_norm.weight",
        "decoder.estimator.t_embedder.mlp.2.weight",
        "decoder.estimator.in_proj.weight",
        "decoder.estimator.blocks.0.conv.block.6.bias",
        "decoder.estimator.blocks.0.attn.q_norm.weight",
        "decoder.estimator.final_layer.adaLN_modulation.1.weight",
        "decoder.estimator.final_layer.linear.bias",
    ):
        assert key in state, key
    assert state["input_embedding.weight"].shape == (6561, 512)
    assert state["decoder.estimator.in_proj.weight"].shape == (512, 320)
    assert state["decoder.estimator.blocks.0.adaLN_modulation.1.weight"].shape == (9 * 512, 512)

    model = load_flow((yaml_path, pt_path), device="cpu")
    loaded = model.state_dict()
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in ("input_embedding.weight", "encoder_proj.weight"))
    buffers = {name for name, _ in model.named_buffers()}
    assert buffers == {"encoder.embed.pos_enc.pe", "encoder.up_embed.pos_enc.pe", "decoder.rand_noise"}
    assert not buffers & set(loaded), "non-persistent buffers must stay out of the state_dict"
    assert model.decoder.rand_noise.shape == (1, 80, 30000)
    del model, state, loaded
    gc.collect()


def test_reduced_config_uses_the_same_code_with_smaller_dims() -> None:
    model = build_flow(REDUCED_FLOW_CONFIG)
    state = model.state_dict()
    n_layers = REDUCED_FLOW_CONFIG["encoder"]["num_blocks"] + REDUCED_FLOW_CONFIG["encoder"]["num_up_blocks"]
    depth = REDUCED_FLOW_CONFIG["decoder"]["estimator"]["depth"]
    assert len(state) == 5 + 4 + 4 + 2 + 4 + 2 + 19 * n_layers + 4 + 2 + 24 * depth + 4
    assert state["encoder.embed.out.0.weight"].shape == (64, 64)


def test_construction_under_bf16_default_dtype_builds_float32_modules() -> None:
    with process_default_dtype(torch.bfloat16):
        model = build_flow(REDUCED_FLOW_CONFIG)
    dtypes = {t.dtype for t in model.state_dict().values()} | {b.dtype for b in model.buffers()}
    assert dtypes == {torch.float32}


def test_unknown_yaml_tag_is_an_error_naming_the_tag() -> None:
    text = render_flow_yaml(REDUCED_FLOW_CONFIG).replace(TAG_DIT, "!new:somepkg.evil.Estimator")
    with pytest.raises(ValueError, match=r"unknown tag '!new:somepkg\.evil\.Estimator'"):
        build_flow_from_yaml(text)


def test_yaml_without_flow_key_or_with_bad_arguments_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="top-level 'flow:'"):
        build_flow_from_yaml("model:\n  a: 1\n")
    bad = render_flow_yaml(REDUCED_FLOW_CONFIG).replace("hidden_size: 64", "hidden_size: 64\n            depht: 3")
    with pytest.raises(ValueError, match="depht"):
        build_flow_from_yaml(bad)
    unsupported = render_flow_yaml(REDUCED_FLOW_CONFIG).replace("input_layer: linear", "input_layer: conv2d")
    with pytest.raises(ValueError, match="input_layer='conv2d' is not supported"):
        build_flow_from_yaml(unsupported)
    with pytest.raises(FileNotFoundError, match="flow.yaml not found"):
        build_flow_from_yaml(tmp_path / "missing.yaml")


def test_standin_weights_are_deterministic_in_the_seed(tmp_path: Path) -> None:
    a = torch.load(write_standin_flow(tmp_path / "a", reduced=True, seed=7)[1], weights_only=True)
    b = torch.load(write_standin_flow(tmp_path / "b", reduced=True, seed=7)[1], weights_only=True)
    c = torch.load(write_standin_flow(tmp_path / "c", reduced=True, seed=8)[1], weights_only=True)
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["encoder_proj.weight"], c["encoder_proj.weight"])


def test_load_flow_names_missing_and_misshaped_keys(tmp_path: Path, reduced_flow_files: tuple[Path, Path]) -> None:
    yaml_path, pt_path = reduced_flow_files
    state = torch.load(pt_path, weights_only=True)
    dropped = dict(state)
    del dropped["encoder_proj.bias"]
    torch.save(dropped, tmp_path / "dropped.pt")
    with pytest.raises(ValueError, match=r"missing \['encoder_proj.bias'\]"):
        load_flow((yaml_path, tmp_path / "dropped.pt"), device="cpu")
    reshaped = dict(state)
    reshaped["encoder_proj.weight"] = torch.zeros(80, 32)
    torch.save(reshaped, tmp_path / "reshaped.pt")
    with pytest.raises(ValueError, match=r"'encoder_proj.weight' has shape \(80, 32\), expected \(80, 64\)"):
        load_flow((yaml_path, tmp_path / "reshaped.pt"), device="cpu")
    with pytest.raises(FileNotFoundError, match="flow.pt"):
        load_flow(tmp_path, device="cpu")


def test_float16_loading_halves_the_model_before_loading(reduced_flow_files: tuple[Path, Path]) -> None:
    model = load_flow(reduced_flow_files, device="cpu", float16=True)
    state = torch.load(reduced_flow_files[1], weights_only=True)
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    assert model.decoder.rand_noise.dtype == torch.float16
    assert torch.equal(model.encoder_proj.weight, state["encoder_proj.weight"].half())


def test_noise_buffer_is_seeded_and_can_be_set_from_outside(reduced_flow_files: tuple[Path, Path]) -> None:
    a = load_flow(reduced_flow_files, device="cpu", noise_seed=0)
    b = load_flow(reduced_flow_files, device="cpu", noise_seed=0)
    c = load_flow(reduced_flow_files, device="cpu", noise_seed=1)
    assert torch.equal(a.decoder.rand_noise, b.decoder.rand_noise)
    assert not torch.equal(a.decoder.rand_noise, c.decoder.rand_noise)
    expected = torch.Generator().manual_seed(0)
    assert torch.equal(a.decoder.rand_noise, torch.randn(1, 80, 30000, generator=expected))
    custom = torch.arange(80 * 50, dtype=torch.float32).reshape(1, 80, 50)
    c.decoder.set_noise(custom)
    assert torch.equal(c.decoder.rand_noise, custom)
    with pytest.raises(ValueError, match=r"expected \(1, 80, N\)"):
        c.decoder.set_noise(torch.zeros(80, 50))


def test_real_config_dict_renders_the_shipped_tags() -> None:
    text = render_flow_yaml(REAL_FLOW_CONFIG)
    assert text.count("!new:") == 4
    assert "flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec" in text


def test_ensure_standin_flow_writes_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path))
    directory = ensure_standin_flow(reduced=True, seed=4)
    assert directory.is_relative_to(tmp_path)
    mtime = (directory / "flow.pt").stat().st_mtime_ns
    assert ensure_standin_flow(reduced=True, seed=4) == directory
    assert (directory / "flow.pt").stat().st_mtime_ns == mtime
    model = load_flow(directory, device="cpu")
    direct = torch.load(write_standin_flow(tmp_path / "direct", reduced=True, seed=4)[1], weights_only=True)
    assert torch.equal(model.encoder_proj.weight, direct["encoder_proj.weight"])
