# SPDX-License-Identifier: Apache-2.0
"""HiFT vocoder: strict loading of hift.pt layouts, output length, NSF source, weight-norm folding, RNG."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.mark import hardware_test
from vllm_omni_token2wav.model_executor.layers.hift import (
    FULL_HIFT_CONFIG,
    FULL_HIFT_NUM_KEYS,
    FULL_HIFT_NUM_PARAMS,
    HiFTGenerator,
    HiFTLoadError,
    load_hift,
    write_standin_hift,
)
from vllm_omni_token2wav.model_executor.layers.hift.loader import expected_hift_shapes, load_hift_state_dict
from vllm_omni_token2wav.model_executor.layers.hift.source import SineGen, midpoint_downsample
from vllm_omni_token2wav.model_executor.layers.hift.standin import standin_hift_state_dict

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

SEED = 3


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hift")


@pytest.fixture(scope="module")
def reduced_path(standin_dir: Path) -> Path:
    return write_standin_hift(standin_dir / "hift.pt", reduced=True, seed=SEED)


@pytest.fixture(scope="module")
def reduced_model(reduced_path: Path) -> HiFTGenerator:
    return load_hift(reduced_path, device="cpu")


def _reference_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w = g * v / ||v||, the norm over every dim but 0 (independent of torch._weight_norm)."""
    norm = v.double().flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    return (g.double() * v.double() / norm).float()


@pytest.mark.parametrize("key_scheme", ["new", "old"])
@pytest.mark.parametrize("prefix", [False, True])
def test_standin_loads_strictly_in_both_key_schemes_and_with_prefix(
    standin_dir: Path, key_scheme: str, prefix: bool
) -> None:
    path = write_standin_hift(
        standin_dir / f"hift_{key_scheme}_{prefix}.pt", reduced=True, seed=SEED, key_scheme=key_scheme, prefix=prefix
    )
    raw = torch.load(path, weights_only=True)
    assert len(raw) == FULL_HIFT_NUM_KEYS
    assert all(k.startswith("generator.") for k in raw) == prefix
    g_suffix, v_suffix = (
        (".weight_g", ".weight_v") if key_scheme == "old" else (".parametrizations.weight.original0", ".original1")
    )
    assert sum(k.endswith(g_suffix) for k in raw) == 82

    model = load_hift(path, device="cpu")
    pre = "generator." if prefix else ""
    if key_scheme == "old":
        g, v = raw[f"{pre}ups.1.weight_g"], raw[f"{pre}ups.1.weight_v"]
    else:
        g = raw[f"{pre}ups.1.parametrizations.weight.original0"]
        v = raw[f"{pre}ups.1.parametrizations.weight.original1"]
    torch.testing.assert_close(model.ups[1].weight, _reference_weight_norm(g, v), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(model.source_downs[0].weight, raw[f"{pre}source_downs.0.weight"], rtol=0, atol=0)
    torch.testing.assert_close(model.m_source.l_linear.bias, raw[f"{pre}m_source.l_linear.bias"], rtol=0, atol=0)


def test_full_size_layout_has_the_shipped_key_and_parameter_counts() -> None:
    with torch.device("meta"):
        model = HiFTGenerator(FULL_HIFT_CONFIG)
    shapes = expected_hift_shapes(model)
    assert len(shapes) == FULL_HIFT_NUM_KEYS == 328
    assert sum(math.prod(s) for s in shapes.values()) == FULL_HIFT_NUM_PARAMS == 20_821_295
    assert len(model.weight_norm_modules()) == 82
    # Nothing non-persistent may leak into the state_dict (strict loading of the real file).
    assert "stft_window" not in model.state_dict()


def test_full_size_standin_loads_strictly_into_a_full_size_model() -> None:
    state_dict = standin_hift_state_dict(reduced=False, seed=SEED)
    assert len(state_dict) == FULL_HIFT_NUM_KEYS
    assert sum(v.numel() for v in state_dict.values()) == FULL_HIFT_NUM_PARAMS
    model = HiFTGenerator(FULL_HIFT_CONFIG)
    load_hift_state_dict(model, state_dict)


@pytest.mark.parametrize("frames", [1, 7, 24])
def test_output_has_exactly_480_samples_per_mel_frame(reduced_model: HiFTGenerator, frames: int) -> None:
    mel = torch.randn(2, 80, frames, generator=torch.Generator().manual_seed(frames))
    with torch.inference_mode():
        speech, source = reduced_model(mel, generator=torch.Generator().manual_seed(0))
    assert speech.shape == (2, 480 * frames)
    assert source.shape == (2, 1, 480 * frames)
    assert torch.isfinite(speech).all()
    assert speech.abs().max() <= 0.99
    assert speech.std() > 0


@pytest.mark.parametrize("scale", [480, 3, 2])
def test_midpoint_downsample_equals_linear_interpolation(scale: int) -> None:
    x = torch.randn(2, 9, scale * 11, generator=torch.Generator().manual_seed(scale))
    reference = F.interpolate(x, scale_factor=1.0 / scale, mode="linear")
    torch.testing.assert_close(midpoint_downsample(x, scale), reference, rtol=0, atol=1e-6)


def test_midpoint_source_equals_interpolation_form_to_1e6() -> None:
    """The Ascend-safe sine generator gives the same excitation as the reference F.interpolate form."""
    cfg = FULL_HIFT_CONFIG
    args = (cfg.sampling_rate, 480, cfg.nb_harmonics, cfg.nsf_alpha, cfg.nsf_sigma, cfg.nsf_voiced_threshold)
    # 2 s of a gliding F0 with an unvoiced gap, at the waveform rate.
    frames = 100
    f0_frames = torch.linspace(80.0, 320.0, frames)
    f0_frames[40:55] = 0.0
    f0 = f0_frames.repeat_interleave(480)[None, :, None]
    midpoint, uv_m = SineGen(*args)(f0, torch.Generator().manual_seed(1))
    interp, uv_i = SineGen(*args, use_interpolate=True)(f0, torch.Generator().manual_seed(1))
    torch.testing.assert_close(midpoint, interp, rtol=0, atol=1e-6)
    assert torch.equal(uv_m, uv_i)
    assert uv_m.sum() == (frames - 15) * 480


@pytest.mark.parametrize("scale", [480, 5])
def test_frame_rate_phase_is_bit_equal_to_the_sample_rate_form(scale: int) -> None:
    """HiFT's f0 repeats each frame `scale` times: the frame-rate phase path gives the same bits and
    draws the same random numbers, in the same order, as the sample-rate path."""
    cfg = FULL_HIFT_CONFIG
    args = (cfg.sampling_rate, scale, cfg.nb_harmonics, cfg.nsf_alpha, cfg.nsf_sigma, cfg.nsf_voiced_threshold)
    gen = torch.Generator().manual_seed(scale)
    f0_frames = (torch.rand(2, 37, 1, generator=gen) * 400.0).abs()
    f0_frames[:, 10:14] = 0.0  # unvoiced frames
    f0 = f0_frames.repeat_interleave(scale, dim=1)
    sample_gen, frame_gen = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    sample_rate, uv_s = SineGen(*args)(f0, sample_gen)
    frame_rate, uv_f = SineGen(*args)(f0, frame_gen, f0_frames=f0_frames)
    assert torch.equal(sample_rate, frame_rate) and torch.equal(uv_s, uv_f)
    assert torch.equal(sample_gen.get_state(), frame_gen.get_state())


def test_folded_weight_norm_gives_identical_output(reduced_path: Path, reduced_model: HiFTGenerator) -> None:
    unfolded = load_hift(reduced_path, device="cpu", fold_weight_norm=False)
    assert hasattr(unfolded.conv_pre, "parametrizations")
    assert not hasattr(reduced_model.conv_pre, "parametrizations")
    mel = torch.randn(1, 80, 9, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        folded_out, _ = reduced_model(mel, generator=torch.Generator().manual_seed(7))
        unfolded_out, _ = unfolded(mel, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(folded_out, unfolded_out, rtol=0, atol=1e-7)


def test_generator_argument_makes_output_reproducible(reduced_model: HiFTGenerator) -> None:
    mel = torch.randn(1, 80, 6, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        a, _ = reduced_model(mel, generator=torch.Generator().manual_seed(11))
        b, _ = reduced_model(mel, generator=torch.Generator().manual_seed(11))
        c, _ = reduced_model(mel, generator=torch.Generator().manual_seed(12))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_rng_is_consumed_in_reference_order(reduced_model: HiFTGenerator) -> None:
    """rand(B, 9), randn_like of the [B, 9, L]-strided sines, randn(B, L, 1) per call: the stream stays in step."""
    frames, batch = 3, 2
    length = 480 * frames
    mel = torch.randn(batch, 80, frames)
    gen = torch.Generator().manual_seed(21)
    with torch.inference_mode():
        reduced_model(mel, generator=gen)
    after_call = torch.rand(4, generator=gen)
    ref = torch.Generator().manual_seed(21)
    torch.rand(batch, 9, generator=ref)
    torch.empty(batch, 9, length).transpose(1, 2).normal_(generator=ref)  # randn_like of the transposed sines
    torch.randn(batch, length, 1, generator=ref)
    assert torch.equal(after_call, torch.rand(4, generator=ref))


def test_harmonics_noise_is_the_references_randn_like_of_its_transposed_sines() -> None:
    """Unvoiced f0 leaves only noise: it must be the values the reference's `randn_like(sines)` draws.

    The reference's sines are a transposed [B, 9, L] tensor and `randn_like` fills that layout by
    torch's non-contiguous path, which gives other values than `randn(B, L, 9)` (measured against
    vLLM-Omni 0.30's HiFT: relative L2 0.3 of the audio before this was matched, 0 after).
    """
    frames, batch, scale = 2, 2, 480
    gen = SineGen(24000, scale, 8, sine_amp=0.1, noise_std=0.003, voiced_threshold=10.0)
    f0 = torch.zeros(batch, frames * scale, 1)
    sines, uv = gen(f0, torch.Generator().manual_seed(5))
    assert not uv.any()
    torch.manual_seed(5)
    torch.rand(batch, 9)  # the initial phases
    reference = torch.randn_like(torch.empty(batch, 9, frames * scale).transpose(1, 2))
    assert torch.equal(sines, (0.1 / 3) * reference)
    contiguous = torch.randn(batch, frames * scale, 9, generator=torch.Generator().manual_seed(5))
    assert not torch.equal(sines, (0.1 / 3) * contiguous)


def test_cache_source_overwrites_the_first_source_samples(reduced_model: HiFTGenerator) -> None:
    mel = torch.randn(1, 80, 10)
    cache = torch.linspace(-0.5, 0.5, 3840)[None, None]
    with torch.inference_mode():
        _, source = reduced_model(mel, cache_source=cache, generator=torch.Generator().manual_seed(0))
        _, fresh = reduced_model(mel, generator=torch.Generator().manual_seed(0))
    assert torch.equal(source[:, :, :3840], cache)
    assert torch.equal(source[:, :, 3840:], fresh[:, :, 3840:])


def test_bad_mel_and_cache_shapes_raise_clear_errors(reduced_model: HiFTGenerator) -> None:
    with pytest.raises(ValueError, match=r"mel \[B, 80, T\].*transposed"):
        reduced_model(torch.randn(1, 10, 80))
    with pytest.raises(ValueError, match="0 frames"):
        reduced_model(torch.randn(1, 80, 0))
    with pytest.raises(ValueError, match="too short for the cached source"):
        reduced_model(torch.randn(1, 80, 2), cache_source=torch.zeros(1, 1, 3840))


def test_missing_and_unexpected_keys_are_listed(standin_dir: Path) -> None:
    state_dict = standin_hift_state_dict(reduced=True, seed=SEED)
    del state_dict["resblocks.4.convs2.1.parametrizations.weight.original1"]
    state_dict["resblocks.9.alpha"] = torch.ones(4)
    path = standin_dir / "broken.pt"
    torch.save(state_dict, path)
    with pytest.raises(HiFTLoadError, match=r"1 missing \[resblocks\.4\.convs2\.1.*1 unexpected \[resblocks\.9\.alpha"):
        load_hift(path, device="cpu")


def test_wrong_shape_and_mixed_prefix_and_foreign_files_are_rejected(standin_dir: Path) -> None:
    state_dict = standin_hift_state_dict(reduced=True, seed=SEED)
    state_dict["m_source.l_linear.weight"] = torch.ones(1, 5)
    torch.save(state_dict, standin_dir / "shape.pt")
    with pytest.raises(HiFTLoadError, match=r"m_source\.l_linear\.weight: file \(1, 5\) vs model \(1, 9\)"):
        load_hift(standin_dir / "shape.pt", device="cpu")

    state_dict = standin_hift_state_dict(reduced=True, seed=SEED)
    state_dict = {("generator." + k if i % 2 else k): v for i, (k, v) in enumerate(state_dict.items())}
    torch.save(state_dict, standin_dir / "mixed.pt")
    with pytest.raises(HiFTLoadError, match="expected all or none to carry the prefix"):
        load_hift(standin_dir / "mixed.pt", device="cpu")

    torch.save({"encoder.weight": torch.ones(3)}, standin_dir / "foreign.pt")
    with pytest.raises(HiFTLoadError, match="not a HiFT vocoder state_dict"):
        load_hift(standin_dir / "foreign.pt", device="cpu")

    (standin_dir / "garbage.pt").write_bytes(b"not a zip file")
    with pytest.raises(HiFTLoadError, match="cannot be read as a torch state_dict"):
        load_hift(standin_dir / "garbage.pt", device="cpu")

    with pytest.raises(FileNotFoundError, match="hift.pt not found"):
        load_hift(standin_dir / "absent.pt", device="cpu")


def test_model_is_fp32_under_a_bf16_default_dtype(reduced_path: Path) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what vLLM's set_default_torch_dtype does around model init
    try:
        model = load_hift(reduced_path, device="cpu")
    finally:
        torch.set_default_dtype(previous)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.stft_window.dtype == torch.float32


@hardware_test(res={"cuda": "H100", "npu": "A2"}, num_cards=1)
def test_device_output_matches_cpu_for_the_same_source(reduced_path: Path, reduced_model: HiFTGenerator) -> None:
    """Midpoint source + iSTFT run on the accelerator; with the source pinned, speech matches the CPU run."""
    device_model = load_hift(reduced_path)  # the serving device
    assert device_model.conv_pre.weight.device.type != "cpu"
    mel = torch.randn(1, 80, 12, generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        cpu_speech, cpu_source = reduced_model(mel, generator=torch.Generator().manual_seed(0))
        device_mel = mel.to(device_model.conv_pre.weight.device)
        _, device_source = device_model(device_mel)  # device RNG: its own noise, same shape and finite
        speech, _ = device_model(device_mel, cache_source=cpu_source.to(device_mel.device))
    assert device_source.shape == cpu_source.shape and torch.isfinite(device_source).all()
    torch.testing.assert_close(speech.cpu(), cpu_speech, rtol=1e-3, atol=1e-4)


def test_per_row_generators_give_each_row_its_solo_noise_and_source(reduced_model: HiFTGenerator) -> None:
    """A batch of independent requests: row i draws exactly what a batch-1 call with its generator draws."""
    mel = torch.randn(3, 80, 10, generator=torch.Generator().manual_seed(4))
    cache = torch.randn(3, 1, 960, generator=torch.Generator().manual_seed(5)) * 0.1
    gens = [torch.Generator().manual_seed(s) for s in (7, 8, 9)]
    with torch.inference_mode():
        speech, source = reduced_model(mel, cache, generator=gens)
        for i, seed in enumerate((7, 8, 9)):
            solo_gen = torch.Generator().manual_seed(seed)
            solo_speech, solo_source = reduced_model(mel[i : i + 1], cache[i : i + 1], generator=solo_gen)
            # F0 per row: the phase integral sees the solo F0, so the source differs by rounding only.
            torch.testing.assert_close(source[i], solo_source[0], rtol=0, atol=1e-6)
            torch.testing.assert_close(speech[i], solo_speech[0], rtol=0, atol=1e-6)
            assert torch.equal(gens[i].get_state(), solo_gen.get_state())  # same RNG consumption, same order


def test_padding_rows_without_a_generator_get_zero_noise(reduced_model: HiFTGenerator) -> None:
    mel = torch.zeros(2, 80, 4)
    with torch.inference_mode():
        noise = reduced_model.m_source.l_sin_gen(torch.zeros(2, 1920, 1), [torch.Generator().manual_seed(0), None])[0]
    assert bool(noise[0].abs().sum() > 0) and not bool(noise[1].any())
    with pytest.raises(ValueError, match="2 per-row generators for a batch of 1 rows"):
        reduced_model(mel[:1], generator=[torch.Generator(), torch.Generator()])
