# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni 0.30's own CosyVoice3 code2wav on our real-size stand-in folder, loaded without change.

Upstream's `CosyVoice3Code2Wav` takes every size from `CosyVoice3Config`, which hard-codes the real
model (flow DiT 22 x 1024, causal HiFT 512 channels) and never reads `cosyvoice3.yaml`; its
`load_weights(folder)` reads `flow.pt` and `hift.pt` (minus a `generator.` prefix) with
`load_state_dict(strict=True)`. So only the full-size stand-in (`ensure_standin_cosyvoice3_dir(reduced=False)`,
1.3 GB flow.pt) can be loaded by it; the reduced one is for our fast tests. Here upstream builds
itself outside the engine (it needs only the config), loads that folder, and runs one whole-utterance
forward on the CPU (2 Euler steps; upstream's serving path hard-codes 10); our own loaders read the
same folder and get the same flow weights and the same effective vocoder weights.

Level `advanced_model` (not in the default CI run): a few minutes on a 2-core CPU (the stand-in is
generated once, ~30 s, then cached; each of the two loads ~10 s; the forward ~20-60 s). Run with
`pytest -m advanced_model tests/model_executor/models/cosyvoice3/test_upstream_code2wav_full_size.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.advanced_model, pytest.mark.cpu, pytest.mark.engine, pytest.mark.slow]

require_engine("upstream's CosyVoice3 code2wav on the full-size stand-in")

N_TOKENS = 25  # 1 s of audio
PROMPT_TOKENS = 20
N_STEPS = 2
SAMPLES_PER_TOKEN = 960  # 24 kHz, 25 Hz tokens


@pytest.fixture(scope="module")
def full_dir() -> Path:
    from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

    return ensure_standin_cosyvoice3_dir(reduced=False)


@pytest.fixture(scope="module")
def upstream(full_dir: Path) -> Any:
    """Upstream's code2wav module as its `CosyVoice3Model` builds it for the code2wav stage, loaded from the folder."""
    from vllm_omni.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
    from vllm_omni.transformers_utils.configs.cosyvoice3 import CosyVoice3Config

    model = CosyVoice3Code2Wav(CosyVoice3Config())
    model.load_weights(str(full_dir), torch.device("cpu"))  # strict for both files
    return model


def test_upstream_loads_the_full_size_folder_strictly_and_our_loaders_read_the_same_flow(
    upstream: Any, full_dir: Path
) -> None:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import REAL_FLOW_CONFIG, load_flow

    ours = load_flow(full_dir, device="cpu")
    assert ours.config == REAL_FLOW_CONFIG
    theirs = upstream.flow_model.state_dict()
    mine = ours.state_dict()
    assert sorted(mine) == sorted(theirs) and len(mine) == 330
    for key, value in mine.items():
        assert torch.equal(value, theirs[key]), key
    assert sum(p.numel() for p in upstream.flow_model.parameters()) == 332_257_088


def _effective_conv_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`name -> weight` of every convolution, weight norm applied (either spelling, or folded)."""
    return {
        name: m.weight.detach().float()
        for name, m in module.named_modules()
        if isinstance(m, torch.nn.Conv1d | torch.nn.ConvTranspose1d)
    }


def test_upstream_and_our_loader_read_the_same_vocoder(upstream: Any, full_dir: Path) -> None:
    from vllm_omni_token2wav.model_executor.layers.hift_causal import FULL_CAUSAL_HIFT_CONFIG, load_causal_hift

    ours = load_causal_hift(full_dir / "hift.pt", device="cpu")
    assert ours.config == FULL_CAUSAL_HIFT_CONFIG
    assert sum(p.numel() for p in upstream.hift.parameters()) == 20_779_887
    theirs = _effective_conv_weights(upstream.hift)
    mine = _effective_conv_weights(ours)
    assert len(theirs) > 80 and sorted(mine) == sorted(theirs)
    for name, weight in theirs.items():
        torch.testing.assert_close(mine[name], weight, rtol=1e-6, atol=1e-7, msg=name)


def test_one_upstream_forward_on_the_cpu_gives_audio_of_the_requested_length(upstream: Any, full_dir: Path) -> None:
    """The prompt is our facade's (default voice, its stand-in tokens): what upstream's talker would hand over."""
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import read_prompt_tokens, voice_tokens_path

    wav = full_dir / "default_voice.wav"
    prompt = CosyVoice3Token2Wav(full_dir, device="cpu").prompt(
        str(wav), read_prompt_tokens(voice_tokens_path(wav))[:, :PROMPT_TOKENS]
    )
    tokens = torch.randint(0, 6561, (1, N_TOKENS), generator=torch.Generator().manual_seed(7))
    torch.manual_seed(0)  # upstream draws its flow noise from the global generator
    audio = upstream.forward(tokens, prompt.tokens, prompt.mel, prompt.embedding, n_timesteps=N_STEPS)
    assert audio.shape == (1, N_TOKENS * SAMPLES_PER_TOKEN)
    assert bool(torch.isfinite(audio).all())
    peak = float(audio.abs().max())
    assert 1e-4 < peak <= 0.99, peak  # sound (random weights: noise-like), within upstream's audio limit
