# SPDX-License-Identifier: Apache-2.0
"""A toy Step-Audio2 model folder that upstream's own thinker class runs (random weights) at CPU speed.

vLLM-Omni builds Step-Audio2's thinker (`StepAudio2ThinkerForConditionalGeneration`: a Whisper-style
audio encoder, an adaptor and a Qwen2 LLM) from the folder's `config.json`. The toy keeps every id the
upstream code hard-codes and shrinks everything else (`shared/notes/upstream-pipelines-cpu.md`):

| what                   | toy                                   | why                                                 |
|------------------------|---------------------------------------|-----------------------------------------------------|
| `text_config` (Qwen2)  | hidden 128, intermediate 128,         | CPU speed; the thinker runs with                    |
|                        | 1 layer, 2 heads, 1 KV head, tied     | `load_format: dummy` (random weights)               |
|                        | embeddings, max positions 4096        |                                                     |
| `vocab_size`           | 158720 (unchanged)                    | audio ids are absolute: `<audio_i>` = 151696+i,     |
|                        |                                       | EOS 6561 (`step_audio2_constants.py`)               |
| `audio_encoder_config` | state 64, 1 head, 1 layer, `llm_dim`  | only built, never run (text prompts);               |
|                        | 128; `n_mels` 128, `n_audio_ctx` 1500 | `n_mels`, `n_audio_ctx` stay (the processor's mels) |
| config class           | `configuration_step_audio_2.py`       | transformers knows no `step_audio_2`;               |
|                        | (`auto_map.AutoConfig`)               | the YAML sets `trust_remote_code`; `text_config`    |
|                        |                                       | must be a `Qwen2Config` (the thinker checks)        |
| tokenizer              | `tokenizer.write_toy_tokenizer`       | byte-level, specials at their ids                   |
| `model.safetensors`    | one marker tensor                     | the code2wav stage's default loader                 |
| `token2wav/`           | the stand-in assets (upstream-        | what both code2wav classes load                     |
|                        | compatible sizes, `folders.py`)       |                                                     |

Special tokens: `<|endoftext|>` 151643, `<|im_start|>` 151644, `<|im_end|>` 151645 (Qwen2's), `<audio_patch>`
151690 (`step_audio2_constants.py`); `<tts_start>` / `<tts_end>` sit in the reserved range 151689-151695 at
151693 / 151694 (upstream's serving adapter only names `<tts_start>` as text; no upstream code reads their ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.model_executor.models.standin.model_dirs import marker_safetensors
from vllm_omni_token2wav.model_executor.models.standin.toy import UpstreamToyPipeline
from vllm_omni_token2wav.model_executor.models.standin.toy.folders import json_bytes, token2wav_assets, toy_cache_dir
from vllm_omni_token2wav.model_executor.models.standin.toy.tokenizer import toy_tokenizer_files

__all__ = [
    "AUDIO_EOS",
    "AUDIO_START",
    "PIPELINE",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "ensure_step_audio2_dir",
    "speech_prompt",
    "toy_config",
]

VERSION = 1
VOCAB_SIZE = 158720
AUDIO_START = 151696
AUDIO_EOS = 6561  # relative to AUDIO_START
SPECIAL_TOKENS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<audio_patch>": 151690,
    "<tts_start>": 151693,
    "<tts_end>": 151694,
}
CONFIG_MODULE = "configuration_step_audio_2"

_CONFIG_SOURCE = '''# SPDX-License-Identifier: Apache-2.0
"""Toy Step-Audio2 config (vllm_omni_token2wav standin/toy): `text_config` as a Qwen2Config."""

from transformers import PretrainedConfig, Qwen2Config


class StepAudio2ToyConfig(PretrainedConfig):
    model_type = "step_audio_2"

    def __init__(self, text_config=None, audio_encoder_config=None, **kwargs):
        if isinstance(text_config, dict):
            text_config = Qwen2Config(**text_config)
        self.text_config = text_config
        self.audio_encoder_config = audio_encoder_config or {}
        super().__init__(**kwargs)
'''


def toy_config() -> dict:
    """The folder's `config.json` (see the module table)."""
    text = {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": SPECIAL_TOKENS["<|endoftext|>"],
        "eos_token_id": SPECIAL_TOKENS["<|im_end|>"],
    }
    audio = {
        "n_mels": 128,
        "n_audio_ctx": 1500,
        "n_audio_state": 64,
        "n_audio_head": 1,
        "n_audio_layer": 1,
        "llm_dim": 128,
        "kernel_size": 3,
        "adapter_stride": 2,
    }
    return {
        "architectures": ["StepAudio2ForCausalLM"],
        "model_type": "step_audio_2",
        "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.StepAudio2ToyConfig"},
        "text_config": text,
        "audio_encoder_config": audio,
        "torch_dtype": "float32",
    }


def speech_prompt(text: str, system: str = "You are a voice assistant. Read the text aloud.") -> str:
    """The prompt upstream's Step-Audio2 speech adapter builds (`tts_adapters/step_audio2.py`)."""
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        f"<|im_start|>user\n{text}<|im_end|>\n"
        "<|im_start|>assistant\n<tts_start>"
    )


def ensure_step_audio2_dir(root: Path | None = None, *, seed: int = 0) -> Path:
    """The toy Step-Audio2 folder (see the module table), assembled when missing or stale."""
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_assembled

    folder = toy_cache_dir("step_audio2", VERSION, seed, root)
    recipe = {"toy": "step_audio2", "version": VERSION, "seed": seed}
    ensure_assembled(folder / "token2wav", token2wav_assets(seed), recipe, {})
    files = {
        "config.json": json_bytes(toy_config()),
        f"{CONFIG_MODULE}.py": _CONFIG_SOURCE.encode(),
        "model.safetensors": marker_safetensors(),
        **toy_tokenizer_files(VOCAB_SIZE, SPECIAL_TOKENS),
    }
    ensure_assembled(folder, {}, recipe, files)
    return folder


#: Reply length (codes) of a request unless it says otherwise.
DEFAULT_CODES = 60


@dataclass(frozen=True)
class StepAudio2ToyPipeline(UpstreamToyPipeline):
    """Upstream's Step-Audio2 pipeline (thinker -> token2wav) over the toy folder."""

    def ensure_model_dir(self, root: Path | None = None) -> Path:
        return ensure_step_audio2_dir(root)

    def offline_prompt(
        self, text: str, *, voice: Any = None, codes: int = DEFAULT_CODES, seed: int = 0, async_chunk: bool = True
    ) -> tuple[dict[str, Any], list[Any]]:
        """The speech adapter's prompt and per-stage params making the reply exactly `codes` audio tokens.

        The thinker may sample only codec ids below the audio EOS (`allowed_token_ids`), so every generated
        token is a code upstream's processors forward, and it runs to `max_tokens` (no stop id allowed).
        Upstream's Step-Audio2 pipeline carries no per-request voice to the code2wav stage.
        """
        if voice is not None:
            raise ValueError("Step-Audio2's upstream pipeline carries no per-request voice (default voice only)")
        thinker = {
            "max_tokens": codes,
            "allowed_token_ids": list(range(AUDIO_START, AUDIO_START + AUDIO_EOS)),
            "seed": seed,
        }
        params = self.sampling_params([thinker, {}], async_chunk=async_chunk)
        return {"prompt": speech_prompt(text)}, params

    def http_request(self, text: str, *, stream: bool, voice: Any = None) -> tuple[str, dict[str, Any]]:
        """`POST /v1/audio/speech` (upstream's Step-Audio2 speech adapter); streamed as raw PCM."""
        if voice is not None:
            raise ValueError("Step-Audio2's speech adapter takes no reference voice")
        body: dict[str, Any] = {"input": text, "response_format": "pcm" if stream else "wav"}
        if stream:
            body |= {"stream": True, "stream_format": "audio"}
        return "/v1/audio/speech", body


PIPELINE = StepAudio2ToyPipeline(
    family="step_audio2",
    upstream_yaml={"async_chunk": "step_audio_2_async_chunk.yaml", "sync": "step_audio_2.yaml"},
    ar_stages=(0,),
    code2wav_stage=1,
)
