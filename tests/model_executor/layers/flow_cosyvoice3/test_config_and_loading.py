# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow: the real flow.pt layout (counted on the meta device), cosyvoice3.yaml, stand-ins, strict loading."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.helpers.torch_state import process_default_dtype
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
    NOISE_FRAMES,
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    CausalMaskedDiffWithDiT,
    CosyVoice3FlowConfig,
    ensure_standin_flow,
    flow_config_from_yaml,
    load_flow,
    noise_table,
    render_cosyvoice3_yaml,
    write_standin_flow,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.config import TAG_DIT

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

# Public facts about Fun-CosyVoice3-0.5B's flow.pt (shared notes, counted from the reference modules).
REAL_KEYS = 330
REAL_PARAMS = 332_257_088
ESTIMATOR_PARAMS = 331_142_224
BLOCK = (14, 14_693_376)


def _real_layout() -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        return CausalMaskedDiffWithDiT(REAL_FLOW_CONFIG).state_dict()


def test_full_size_layout_has_the_real_key_set_and_parameter_count() -> None:
    state = _real_layout()
    buffers = {"decoder.estimator.rotary_embed.inv_freq"}
    assert len(state) == REAL_KEYS
    assert sum(v.numel() for k, v in state.items() if k not in buffers) == REAL_PARAMS
    estimator = [k for k in state if k.startswith("decoder.estimator.") and k not in buffers]
    assert sum(state[k].numel() for k in estimator) == ESTIMATOR_PARAMS
    block = [k for k in state if k.startswith("decoder.estimator.transformer_blocks.21.")]
    assert (len(block), sum(state[k].numel() for k in block)) == BLOCK
    shapes = {
        "input_embedding.weight": (6561, 80),
        "spk_embed_affine_layer.weight": (80, 192),
        "pre_lookahead_layer.conv1.weight": (1024, 80, 4),
        "pre_lookahead_layer.conv2.weight": (80, 1024, 3),
        "decoder.estimator.time_embed.time_mlp.0.weight": (1024, 256),
        "decoder.estimator.input_embed.proj.weight": (1024, 320),
        "decoder.estimator.input_embed.conv_pos_embed.conv1.0.weight": (1024, 64, 31),
        "decoder.estimator.input_embed.conv_pos_embed.conv2.0.bias": (1024,),
        "decoder.estimator.transformer_blocks.0.attn_norm.linear.weight": (6144, 1024),
        "decoder.estimator.transformer_blocks.0.attn.to_q.bias": (1024,),
        "decoder.estimator.transformer_blocks.0.attn.to_out.0.weight": (1024, 1024),
        "decoder.estimator.transformer_blocks.0.ff.ff.0.0.weight": (2048, 1024),
        "decoder.estimator.transformer_blocks.0.ff.ff.2.weight": (1024, 2048),
        "decoder.estimator.norm_out.linear.weight": (2048, 1024),
        "decoder.estimator.proj_out.weight": (80, 1024),
        "decoder.estimator.rotary_embed.inv_freq": (32,),
    }
    for key, shape in shapes.items():
        assert tuple(state[key].shape) == shape, key
    assert not any("transformer_blocks.22." in k for k in state)


def test_rope_inv_freq_is_a_persistent_buffer_with_the_theta_1e4_frequencies() -> None:
    model = CausalMaskedDiffWithDiT(REDUCED_FLOW_CONFIG)
    inv = model.state_dict()["decoder.estimator.rotary_embed.inv_freq"]
    expected = torch.tensor([10000.0 ** (-2 * i / 16) for i in range(8)])
    torch.testing.assert_close(inv, expected, rtol=1e-6, atol=0)
    model.half()
    assert model.decoder.estimator.rotary_embed.inv_freq.dtype == torch.float32, "RoPE frequencies stay float32"
    assert model.spk_embed_affine_layer.weight.dtype == torch.float16


def test_construction_under_a_bf16_default_dtype_builds_float32_modules() -> None:
    with process_default_dtype(torch.bfloat16):
        model = CausalMaskedDiffWithDiT(REDUCED_FLOW_CONFIG)
    assert {t.dtype for t in model.state_dict().values()} == {torch.float32}


def test_yaml_round_trips_both_configs_and_resolves_refs() -> None:
    for config in (REAL_FLOW_CONFIG, REDUCED_FLOW_CONFIG):
        text = render_cosyvoice3_yaml(config)
        assert "static_chunk_size: !ref <chunk_size> * <token_mel_ratio>" in text
        assert flow_config_from_yaml(text) == config


def test_yaml_parts_the_flow_never_builds_are_read_as_data() -> None:
    """Tags outside `flow:` (seeding calls, the LLM, !name: samplers) are never imported or called."""
    extra = (
        "__set_seed3: !apply:torch.manual_seed [1986]\n"
        "llm: !new:cosyvoice.llm.llm.CosyVoice3LM\n"
        "    llm: !new:cosyvoice.llm.llm.Qwen2Encoder\n"
        "        pretrain_path: ''\n"
        "    sampling: !name:cosyvoice.utils.common.ras_sampling\n"
        "        top_k: 25\n"
    )
    before = torch.random.get_rng_state()
    config = flow_config_from_yaml(extra + render_cosyvoice3_yaml(REDUCED_FLOW_CONFIG))
    assert config == REDUCED_FLOW_CONFIG
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t.replace(TAG_DIT, "!new:somepkg.evil.Estimator"), r"must be tagged .*DiT, got !new:somepkg"),
        (lambda t: t.replace("            depth: 2\n", "            depht: 2\n"), r"unknown arguments \['depht'\]"),
        (lambda t: t.replace("            heads: 4\n", ""), "lacks 'heads'"),
        (lambda t: t.replace("solver: 'euler'", "solver: 'midpoint'"), "Euler solver on the cosine schedule only"),
        (
            lambda t: t.replace("            mu_dim: 80\n", "            mu_dim: 96\n"),
            r"estimator.mu_dim=96 \(expected 80\)",
        ),
        (lambda t: t.replace("<chunk_size> * <token_mel_ratio>", "<chunk_size> * <nope>"), "names no entry"),
        (lambda t: t.replace("<chunk_size> * <token_mel_ratio>", "__import__('os')"), "holds no <reference>"),
        (lambda t: t.replace("flow: !new", "model: !new"), "top-level 'flow:'"),
        (lambda t: t.replace("            dim: 64\n", "            dim: 72\n"), "multiple of the conv position"),
    ],
)
def test_bad_cosyvoice3_yaml_is_an_error_naming_the_problem(edit, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        flow_config_from_yaml(edit(render_cosyvoice3_yaml(REDUCED_FLOW_CONFIG)))


def test_config_rejects_inconsistent_sizes() -> None:
    with pytest.raises(ValueError, match="static_chunk_size=49 must be a positive multiple"):
        dataclasses.replace(REAL_FLOW_CONFIG, static_chunk_size=49)
    with pytest.raises(ValueError, match="dim_head=7 must be even"):
        dataclasses.replace(REAL_FLOW_CONFIG, dim_head=7)
    assert REAL_FLOW_CONFIG.chunk_tokens == 25 and REAL_FLOW_CONFIG.ff_inner == 2048


def test_standin_is_deterministic_and_loads_strictly(tmp_path: Path, cv3_flow_files: tuple[Path, Path]) -> None:
    a = torch.load(write_standin_flow(tmp_path / "a", reduced=True, seed=7)[1], weights_only=True)
    b = torch.load(write_standin_flow(tmp_path / "b", reduced=True, seed=7)[1], weights_only=True)
    c = torch.load(write_standin_flow(tmp_path / "c", reduced=True, seed=8)[1], weights_only=True)
    assert a.keys() == b.keys() == c.keys() == CausalMaskedDiffWithDiT(REDUCED_FLOW_CONFIG).state_dict().keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_embedding.weight"], c["input_embedding.weight"])
    assert torch.equal(a["decoder.estimator.rotary_embed.inv_freq"], c["decoder.estimator.rotary_embed.inv_freq"])
    model = load_flow(tmp_path / "a", device="cpu")
    assert model.config == REDUCED_FLOW_CONFIG
    assert all(torch.equal(v, a[k]) for k, v in model.state_dict().items())


def test_load_names_missing_and_misshaped_keys_and_missing_files(
    tmp_path: Path, cv3_flow_files: tuple[Path, Path]
) -> None:
    yaml_path, pt_path = cv3_flow_files
    state = torch.load(pt_path, weights_only=True)
    dropped = {k: v for k, v in state.items() if k != "decoder.estimator.rotary_embed.inv_freq"}
    torch.save(dropped, tmp_path / "dropped.pt")
    with pytest.raises(ValueError, match=r"missing \['decoder.estimator.rotary_embed.inv_freq'\]"):
        load_flow((yaml_path, tmp_path / "dropped.pt"), device="cpu")
    reshaped = {**state, "spk_embed_affine_layer.weight": torch.zeros(80, 80)}
    torch.save(reshaped, tmp_path / "reshaped.pt")
    with pytest.raises(ValueError, match=r"'spk_embed_affine_layer.weight' has shape \(80, 80\), expected \(80, 192\)"):
        load_flow((yaml_path, tmp_path / "reshaped.pt"), device="cpu")
    # a reduced flow.pt without its yaml is checked against the real config, and says so
    with pytest.raises(ValueError, match="REAL_FLOW_CONFIG"):
        load_flow((None, pt_path), device="cpu")
    with pytest.raises(FileNotFoundError, match="flow.pt"):
        load_flow(tmp_path, device="cpu")


def test_float16_load_halves_weights_but_keeps_rope_float32(cv3_flow_files: tuple[Path, Path]) -> None:
    model = load_flow(cv3_flow_files[0].parent, device="cpu", float16=True)
    assert model.input_embedding.weight.dtype == torch.float16
    assert model.decoder.estimator.rotary_embed.inv_freq.dtype == torch.float32


def test_ensure_standin_flow_writes_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path))
    directory = ensure_standin_flow(reduced=True, seed=4)
    assert directory.is_relative_to(tmp_path)
    mtime = (directory / "flow.pt").stat().st_mtime_ns
    assert ensure_standin_flow(reduced=True, seed=4) == directory
    assert (directory / "flow.pt").stat().st_mtime_ns == mtime
    assert flow_config_from_yaml(directory / "cosyvoice3.yaml") == REDUCED_FLOW_CONFIG


def test_noise_table_seed_0_is_upstreams_table_drawn_after_seeding_the_global_rng() -> None:
    """Upstream: `set_all_random_seed(0)` then `torch.randn([1, 80, 50 * 300])`; ours uses a private generator."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        upstream = torch.randn([1, 80, 50 * 300])
    before = torch.random.get_rng_state()
    table = noise_table(0)
    assert torch.equal(torch.random.get_rng_state(), before), "drawing a table must not touch the global RNG"
    assert table.shape == (1, 80, NOISE_FRAMES) and torch.equal(table, upstream)
    assert noise_table(0) is table, "tables are cached"
    other = noise_table(5)
    assert not torch.equal(other[..., :50], table[..., :50])
    with pytest.raises(ValueError, match="seed must be an int"):
        noise_table(-1)


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        REAL_FLOW_CONFIG.depth = 3  # type: ignore[misc]
    assert isinstance(REDUCED_FLOW_CONFIG, CosyVoice3FlowConfig)
