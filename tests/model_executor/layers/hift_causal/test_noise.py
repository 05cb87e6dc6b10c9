# SPDX-License-Identifier: Apache-2.0
"""The causal HiFT's noise table: the values the reference draws, in its order, read window by window."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    FULL_CAUSAL_HIFT_CONFIG,
    REDUCED_CAUSAL_HIFT_CONFIG,
    CausalHiFTConfig,
    CausalHiFTGenerator,
    GeneratedNoiseTable,
    NoiseCursor,
    NoiseOrigin,
    TensorNoiseTable,
    load_causal_hift,
    write_standin_causal_hift,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.noise import f0_predictor_init_draws

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _build_f0_predictor_like_the_reference(config: CausalHiFTConfig) -> None:
    """Default-initialised layers of CausalConvRNNF0Predictor, in construction order (global RNG)."""
    c = config.f0_channels
    nn.Conv1d(config.in_channels, c, 4)
    for _ in range(config.f0_layers - 1):
        nn.Conv1d(c, c, 3)
    nn.Linear(c, 1)


def _sine_waves_after(build: Callable[[], None], rows: int) -> torch.Tensor:
    """What SineGen2(causal=True).__init__ draws after `build()` ran: rand(1, 9), then the table (first rows)."""
    with torch.random.fork_rng():
        build()
        torch.rand(1, 9)  # rand_ini
        return torch.rand(1, rows, 9)[0]


@pytest.mark.parametrize("config", [REDUCED_CAUSAL_HIFT_CONFIG, FULL_CAUSAL_HIFT_CONFIG], ids=["reduced", "full"])
def test_cosyvoice3_origin_is_what_the_reference_loader_draws(config: CausalHiFTConfig) -> None:
    """cosyvoice3.yaml: the CFM reseeds 0 and draws its noise, the flow builds two layers, then the vocoder."""

    def build() -> None:
        torch.manual_seed(0)  # CausalConditionalCFM.__init__: set_all_random_seed(0)
        torch.randn([1, 80, 50 * 300])  # ... self.rand_noise
        nn.Embedding(6561, 80)  # CausalMaskedDiffWithDiT.input_embedding
        nn.Linear(192, 80)  # ... spk_embed_affine_layer
        _build_f0_predictor_like_the_reference(config)

    expected = _sine_waves_after(build, 3000)
    table = GeneratedNoiseTable.for_config(config, NoiseOrigin.cosyvoice3(config))
    assert torch.equal(table.window(0, 3000), expected)
    assert (table.length, table.harmonics) == (300 * 24000, 9)


def test_vocoder_yaml_origin_is_seed_1986_then_the_f0_predictor() -> None:
    config = REDUCED_CAUSAL_HIFT_CONFIG

    def build() -> None:
        torch.manual_seed(1986)  # __set_seed3: !apply:torch.manual_seed [1986]
        _build_f0_predictor_like_the_reference(config)

    expected = _sine_waves_after(build, 500)
    assert torch.equal(
        GeneratedNoiseTable.for_config(config, NoiseOrigin.vocoder_yaml(config)).window(0, 500), expected
    )
    full = f0_predictor_init_draws(FULL_CAUSAL_HIFT_CONFIG)
    assert full == 80 * 512 * 4 + 512 + 4 * (512 * 512 * 3 + 512) + 512 + 1 == 3_312_641


def test_table_equals_one_literal_draw_of_the_reference_shape_everywhere() -> None:
    """torch.rand(1, 7_200_000, 9) in one call (288 MB with the unused uv table; 259 MB here) vs windows."""
    origin = NoiseOrigin(seed=42, draws_before=1000)
    with torch.random.fork_rng():
        torch.manual_seed(42)
        torch.rand(1000)
        torch.rand(1, 9)
        literal = torch.rand(1, 300 * 24000, 9)[0]
    table = GeneratedNoiseTable.for_config(FULL_CAUSAL_HIFT_CONFIG, origin)
    cursor = table.start()
    for start, rows in ((0, 4800), (4800, 1), (4801, 123_457), (3_000_000, 480), (300 * 24000 - 960, 960)):
        if start == cursor.position:
            window, cursor = table.read(cursor, rows)  # streaming reads
        else:
            window = table.window(start, rows)  # random access
        assert torch.equal(window, literal[start : start + rows]), start
    del literal


def test_values_are_the_mt19937_stream_mapped_to_24_bits() -> None:
    """torch.rand(float32) = (u32 & 0xFFFFFF) * 2**-24 of MT19937 (numpy's, same seed): an independent check."""
    origin = NoiseOrigin(seed=1986, draws_before=17)
    raw = np.random.RandomState(1986)._bit_generator.random_raw(17 + 9 + 9 * 50)[17 + 9 :]
    expected = torch.from_numpy(((raw & 0xFFFFFF).astype(np.float64) * 2.0**-24).astype(np.float32)).view(50, 9)
    assert torch.equal(GeneratedNoiseTable(origin, length=100, harmonics=9).window(0, 50), expected)


def test_reads_wrap_to_the_table_start_and_cursors_carry_the_stream() -> None:
    origin = NoiseOrigin(seed=3)
    table = GeneratedNoiseTable(origin, length=1000, harmonics=9)
    with torch.random.fork_rng():
        torch.manual_seed(3)
        torch.rand(1, 9)
        literal = torch.rand(1, 1000, 9)[0]
    cursor = table.start()
    pieces = []
    for rows in (7, 993, 0, 1500, 301):  # ends exactly at the wrap, crosses it, wraps twice
        values, cursor = table.read(cursor, rows)
        pieces.append(values)
    got = torch.cat(pieces)
    assert cursor.position == 2801
    assert torch.equal(got, literal[torch.arange(2801) % 1000])
    assert torch.equal(table.window(2500, 700), literal[torch.arange(2500, 3200) % 1000])
    with pytest.raises(ValueError, match="-1 samples"):
        table.read(cursor, -1)


def test_tensor_table_wraps_and_rejects_bad_shapes() -> None:
    values = torch.arange(30, dtype=torch.float32).view(1, 10, 3)
    table = TensorNoiseTable(values, label="copy")
    got, cursor = table.read(NoiseCursor(8), 5)
    assert torch.equal(got, values[0, [8, 9, 0, 1, 2]]) and cursor.position == 13
    assert table.identity == "tensor[10x3] copy"
    with pytest.raises(ValueError, match=r"\[1, L, H\] or \[L, H\]"):
        TensorNoiseTable(torch.zeros(2, 3, 4))


def test_no_instance_holds_a_table_and_instances_share_the_start_state() -> None:
    """The reference keeps 288 MB per vocoder; here each instance keeps a 5 KB generator state, shared."""
    config = dataclasses.replace(REDUCED_CAUSAL_HIFT_CONFIG, base_channels=8, f0_channels=8)
    a, b = CausalHiFTGenerator(config), CausalHiFTGenerator(config)
    start_a, start_b = a.noise.start(), b.noise.start()
    assert start_a.rng_state is start_b.rng_state
    assert start_a.rng_state is not None and start_a.rng_state.numel() < 8 * 1024
    held = [v for v in vars(a.noise).values() if isinstance(v, torch.Tensor)]
    assert held == []
    with pytest.raises(ValueError, match="draws_before must be >= 0"):
        NoiseOrigin(seed=1, draws_before=-1)


def test_the_loader_takes_a_preset_and_applies_it_to_the_files_config(tmp_path: Path) -> None:
    path = write_standin_causal_hift(tmp_path / "hift.pt", reduced=True, seed=1)
    model = load_causal_hift(path, device="cpu", noise=NoiseOrigin.vocoder_yaml)
    assert isinstance(model.noise, GeneratedNoiseTable)
    assert model.noise.origin == NoiseOrigin.vocoder_yaml(REDUCED_CAUSAL_HIFT_CONFIG)
    default = load_causal_hift(path, device="cpu")
    assert isinstance(default.noise, GeneratedNoiseTable)
    assert default.noise.origin == NoiseOrigin.cosyvoice3(REDUCED_CAUSAL_HIFT_CONFIG)
    with pytest.raises(ValueError, match="noise table has 3 harmonics, the vocoder makes 9"):
        load_causal_hift(path, device="cpu", noise=TensorNoiseTable(torch.zeros(10, 3)))
