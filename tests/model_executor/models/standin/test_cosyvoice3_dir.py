# SPDX-License-Identifier: Apache-2.0
"""The stand-in Fun-CosyVoice3 directory: complete, read by the real readers and loaders, deterministic, cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni_token2wav.model_executor.models.standin import cosyvoice3_dir as standin

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

FILES = {"campplus.onnx", "cosyvoice3.yaml", "flow.pt", "hift.pt", "default_voice.wav", "default_voice.tokens"}


def test_reduced_directory_is_complete_and_loads_with_the_strict_loaders(cv3_dir: Path) -> None:
    import soundfile

    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
        REDUCED_FLOW_CONFIG,
        flow_config_from_yaml,
        load_flow,
    )
    from vllm_omni_token2wav.model_executor.layers.hift_causal import REDUCED_CAUSAL_HIFT_CONFIG, load_causal_hift
    from vllm_omni_token2wav.model_executor.layers.hift_causal.config import hift_config_from_yaml
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import read_prompt_tokens

    assert FILES <= {p.name for p in cv3_dir.iterdir()}
    assert standin.ensure_standin_cosyvoice3_dir(reduced=True) == cv3_dir  # cached
    yaml = cv3_dir / "cosyvoice3.yaml"
    assert flow_config_from_yaml(yaml) == REDUCED_FLOW_CONFIG
    assert hift_config_from_yaml(yaml) == REDUCED_CAUSAL_HIFT_CONFIG
    assert load_flow(cv3_dir, device="cpu").config == REDUCED_FLOW_CONFIG
    assert load_causal_hift(cv3_dir / "hift.pt", device="cpu").config == REDUCED_CAUSAL_HIFT_CONFIG
    info = soundfile.info(str(cv3_dir / "default_voice.wav"))
    tokens = read_prompt_tokens(cv3_dir / "default_voice.tokens")
    assert info.samplerate == 24000 and tokens.shape == (1, int(info.duration * 25))


def test_write_fills_a_directory_of_the_callers_choice_with_the_same_bytes(tmp_path: Path, cv3_dir: Path) -> None:
    target = standin.write_standin_cosyvoice3_dir(tmp_path / "cv3", reduced=True)
    assert {p.name for p in target.iterdir()} == FILES
    for name in FILES:
        assert (target / name).read_bytes() == (cv3_dir / name).read_bytes(), name


def test_the_stand_in_tokens_are_seeded() -> None:
    assert standin.standin_voice_tokens(2.0, seed=1) == standin.standin_voice_tokens(2.0, seed=1)
    assert standin.standin_voice_tokens(2.0, seed=1) != standin.standin_voice_tokens(2.0, seed=2)
    assert len(standin.standin_voice_tokens(2.0, seed=1)) == 50
