# SPDX-License-Identifier: Apache-2.0
"""A complete deterministic stand-in Fun-CosyVoice3 directory for the code2wav stage, reduced or full size.

The real `FunAudioLLM/Fun-CosyVoice3-0.5B-2512` files cannot be downloaded on the build machines. This
module assembles the part of that directory the code2wav stage reads, from the per-model stand-in
generators (each reproduces the shipped file's layout with seeded weights):

| file                   | generator                                               | reduced size          |
|------------------------|---------------------------------------------------------|-----------------------|
| `cosyvoice3.yaml`      | `flow.render_cosyvoice3_yaml` + `hift.config.render_hift_section` | the sizes below |
| `flow.pt`              | `flow.ensure_standin_flow` (330 keys, 332,257,088 params) | DiT 2 x 64, 4 heads |
| `hift.pt`              | `hift.cached_standin_causal_hift` (328 keys)             | 32 base channels      |
| `campplus.onnx`        | `campplus.standin.ensure_standin_campplus_onnx`         | full size (192-d)     |
| `default_voice.wav`    | the shipped CMU ARCTIC clip, 24 kHz 16-bit PCM          | same                  |
| `default_voice.tokens` | its "speech tokens": seeded random ids, 25 per second   | same                  |

The stage's default voice is `default_voice.wav` with the ids in `default_voice.tokens` (text, ids
separated by spaces / commas / newlines): CosyVoice3 needs a prompt's speech tokens and the
tokenizer v3 is not in-tree, so a real directory needs that file written by whoever tokenised the clip
(CosyVoice's front end, or the talker's `embed.speech_token`). Here the ids are random: with random
weights nothing depends on them being the clip's real tokens. Weights are random too: the audio is
noise-like, never speech; costs and shapes are real.

`ensure_standin_cosyvoice3_dir(reduced=..., seed=...)` keeps one cached directory per option set;
`write_standin_cosyvoice3_dir(directory, ...)` fills a directory of the caller's choice.
CLI: `python -m vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir [--reduced] [--seed N] [--out DIR]`.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import voice_tokens_path

logger = init_logger(__name__)

#: Bump when the recipe changes so cached directories are rebuilt.
STANDIN_DIR_VERSION = 1
CONFIG_YAML = "cosyvoice3.yaml"
DEFAULT_VOICE_WAV = "default_voice.wav"
TOKEN_RATE = 25


def standin_voice_tokens(seconds: float, seed: int) -> list[int]:
    """Deterministic stand-in prompt ids for a clip of `seconds`: 25 per second, uniform over [0, 6561)."""
    count = int(seconds * TOKEN_RATE)
    return torch.randint(0, 6561, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _config_text(reduced: bool) -> str:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
        REAL_FLOW_CONFIG,
        REDUCED_FLOW_CONFIG,
        render_cosyvoice3_yaml,
    )
    from vllm_omni_token2wav.model_executor.layers.hift_causal import (
        FULL_CAUSAL_HIFT_CONFIG,
        REDUCED_CAUSAL_HIFT_CONFIG,
    )
    from vllm_omni_token2wav.model_executor.layers.hift_causal.config import render_hift_section

    flow = render_cosyvoice3_yaml(REDUCED_FLOW_CONFIG if reduced else REAL_FLOW_CONFIG)
    hift = render_hift_section(REDUCED_CAUSAL_HIFT_CONFIG if reduced else FULL_CAUSAL_HIFT_CONFIG)
    return f"{flow}\n{hift}"


def _component_files(*, reduced: bool, seed: int) -> dict[str, Path]:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import ensure_standin_flow
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.loader import FLOW_PT
    from vllm_omni_token2wav.model_executor.layers.hift_causal import cached_standin_causal_hift
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    return {
        # CAM++ stays full size: the reduced stand-in has a 64-d embedding, the flow needs 192.
        "campplus.onnx": ensure_standin_campplus_onnx(seed=seed),
        "flow.pt": ensure_standin_flow(reduced=reduced, seed=seed) / FLOW_PT,
        "hift.pt": cached_standin_causal_hift(reduced=reduced, seed=seed),
    }


def _generated_files(reduced: bool, seed: int) -> dict[str, bytes]:
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import default_voice_wav

    voice = default_voice_wav()
    # the standard library reads the PCM WAV just written: the accelerator images have no soundfile
    with wave.open(io.BytesIO(voice), "rb") as f:
        seconds = f.getnframes() / f.getframerate()
    tokens = standin_voice_tokens(seconds, seed)
    return {
        CONFIG_YAML: _config_text(reduced).encode(),
        DEFAULT_VOICE_WAV: voice,
        voice_tokens_path(DEFAULT_VOICE_WAV).name: (" ".join(str(t) for t in tokens) + "\n").encode(),
    }


def write_standin_cosyvoice3_dir(directory: str | Path, *, reduced: bool, seed: int = 0) -> Path:
    """Fill `directory` with a complete stand-in CosyVoice3 code2wav set (files of those names are replaced)."""
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import fill_standin_dir

    directory = Path(directory)
    fill_standin_dir(directory, _component_files(reduced=reduced, seed=seed), _generated_files(reduced, seed))
    size = "reduced" if reduced else "full"
    logger.info("wrote %s stand-in CosyVoice3 directory (seed %d) to %s", size, seed, directory)
    return directory


def standin_cosyvoice3_dir(*, reduced: bool, seed: int = 0) -> Path:
    """Cache folder of the stand-in directory for these options (under `vllm_omni_token2wav.envs.cache_dir`)."""
    from vllm_omni_token2wav import envs

    size = "reduced" if reduced else "full"
    return envs.cache_dir("standins", f"cosyvoice3-v{STANDIN_DIR_VERSION}-{size}-seed{seed}")


def ensure_standin_cosyvoice3_dir(*, reduced: bool, seed: int = 0) -> Path:
    """The cached stand-in CosyVoice3 directory, assembled first if missing or stale (safe across processes)."""
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_assembled

    directory = standin_cosyvoice3_dir(reduced=reduced, seed=seed)
    recipe = {"family": "cosyvoice3", "version": STANDIN_DIR_VERSION, "reduced": reduced, "seed": seed}
    sources = _component_files(reduced=reduced, seed=seed)
    return ensure_assembled(directory, sources, recipe, _generated_files(reduced, seed))


def main(argv: list[str] | None = None) -> int:
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import standin_main

    return standin_main(
        argv,
        prog="python -m vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir",
        what="CosyVoice3 directory",
        write=write_standin_cosyvoice3_dir,
        ensure=ensure_standin_cosyvoice3_dir,
    )


if __name__ == "__main__":
    raise SystemExit(main())
