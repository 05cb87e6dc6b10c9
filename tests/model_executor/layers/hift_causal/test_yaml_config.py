# SPDX-License-Identifier: Apache-2.0
"""The vocoder yaml reader: hyperparameters with the reference defaults, the seed before `hift`, mel settings."""

from __future__ import annotations

import logging

import pytest

from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    FULL_CAUSAL_HIFT_CONFIG,
    REDUCED_CAUSAL_HIFT_CONFIG,
    NoiseOrigin,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.yaml_config import read_vocoder_yaml, render_vocoder_yaml

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

MEL = {"n_fft": 1920, "num_mels": 80, "sampling_rate": 24000, "hop_size": 480, "fmax": 8000, "center": False}

MINIMAL = """\
__set_seed1: !apply:random.seed [7]
__set_seed3: !apply:torch.manual_seed [7]
hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        in_channels: 80
"""


@pytest.mark.parametrize("config", [FULL_CAUSAL_HIFT_CONFIG, REDUCED_CAUSAL_HIFT_CONFIG], ids=["full", "reduced"])
def test_rendered_yaml_reads_back_as_the_same_vocoder_and_seed(config) -> None:  # type: ignore[no-untyped-def]
    text = render_vocoder_yaml(config, seed=1986, feat_extractor=MEL)
    read = read_vocoder_yaml(text)
    assert read.config == config and read.seed == 1986 and read.built_between == ()
    assert read.feat_extractor == MEL
    assert read.noise_origin() == NoiseOrigin.vocoder_yaml(config, 1986)


def test_missing_arguments_take_the_reference_constructor_defaults() -> None:
    read = read_vocoder_yaml(MINIMAL)
    cfg = read.config
    # CausalHiFTGenerator's own defaults are 22.05 kHz with two x8 stages, not the 24 kHz vocoder.
    assert (cfg.sampling_rate, cfg.upsample_rates, cfg.upsample_kernel_sizes) == (22050, (8, 8), (16, 16))
    assert (cfg.base_channels, cfg.f0_channels, cfg.source_resblock_kernel_sizes) == (512, 512, (7, 11))
    assert read.seed == 7 and read.feat_extractor is None


def test_references_are_resolved_and_the_last_seed_before_hift_counts() -> None:
    text = (
        "__set_seed3: !apply:torch.manual_seed [1]\n"
        "rate: 24000\n"
        "__reseed: !apply:torch.manual_seed [5]\n"
        + render_vocoder_yaml(REDUCED_CAUSAL_HIFT_CONFIG, seed=5).split("\n", 5)[5]
        + "late: !apply:torch.manual_seed [9]\n"
    )
    read = read_vocoder_yaml(text)
    assert read.seed == 5 and read.config == REDUCED_CAUSAL_HIFT_CONFIG


def test_objects_built_between_the_seed_and_the_vocoder_make_the_noise_unknowable() -> None:
    text = MINIMAL.replace(
        "hift:", "other: !new:torch.nn.Linear [4, 4]\nhifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan {}\nhift:"
    )
    read = read_vocoder_yaml(text)
    assert read.built_between == ("`other`",)  # `hifigan` is overridden with None by the reference loader
    with pytest.raises(ValueError, match=r"`other` are built after torch.manual_seed and before `hift`"):
        read.noise_origin()
    before_seed = "other: !new:torch.nn.Linear [4, 4]\n" + MINIMAL
    assert read_vocoder_yaml(before_seed).built_between == ()


def test_a_file_without_a_seed_falls_back_to_cosyvoices_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    text = "\n".join(line for line in MINIMAL.splitlines() if "seed" not in line) + "\n"
    read = read_vocoder_yaml(text)
    with caplog.at_level(logging.WARNING):
        origin = read.noise_origin()
    assert origin == NoiseOrigin.vocoder_yaml(read.config, 1986) and "seeds nothing" in caplog.text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("sample_rate: 24000\n", "expected a top-level `hift:` entry"),
        ("hift: !new:cosyvoice.hifigan.generator.HiFTGenerator {}\n", "must be tagged .*CausalHiFTGenerator"),
        (
            MINIMAL.replace("in_channels: 80", "cond_channels: 64\n    upsample_ratio: 2"),
            r"unknown arguments \['upsample_ratio'\]",
        ),
        ("hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator\n    base_channels: 64\n", "has no f0_predictor"),
        (MINIMAL.replace("in_channels: 80", "in_channels: 64"), "the vocoder needs 1 and its own in_channels 80"),
        (MINIMAL.replace("[7]\nhift", "[7.5]\nhift"), "needs one integer"),
        (MINIMAL + "feat_extractor: 3\n", "`feat_extractor` must be a !name: function"),
    ],
)
def test_bad_vocoder_yaml_is_a_clear_error(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_vocoder_yaml(text)
