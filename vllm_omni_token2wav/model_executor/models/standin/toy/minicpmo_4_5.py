# SPDX-License-Identifier: Apache-2.0
"""A toy MiniCPM-o 4.5 model folder that upstream's own thinker and talker classes run (random weights) on a CPU.

vLLM-Omni builds MiniCPM-o 4.5's thinker (`MiniCPMO45OmniLLMForConditionalGeneration`: SigLIP + resampler,
Whisper encoder + projector, a Qwen3 LLM) and talker (`MiniCPMO45OmniTTSForConditionalGeneration`: a Llama
codec LM over `tts_config`) from the folder's `config.json`. The toy keeps every id upstream's code hard-codes
and shrinks the rest (`shared/notes/upstream-pipelines-cpu.md`):

| what                  | toy                                      | why                                              |
|-----------------------|------------------------------------------|--------------------------------------------------|
| thinker (top level)   | Qwen3 (`attention_bias: false`):         | CPU speed; `load_format: dummy`                  |
|                       | hidden 128, intermediate 128, 1 layer,   |                                                  |
|                       | 2 heads / 1 KV, head dim 64,             |                                                  |
|                       | vocab 151748                             | covers the special ids below (151703/151704)     |
| `vision_config`       | SigLIP hidden 64, 2 layers (the last is  | built only with an image limit > 0 (the toy      |
|                       | dropped), 1 head, patch 14               | deployment sets 0); resampler heads hidden//128  |
| `audio_config`        | Whisper d_model 64, 1 encoder layer, 1   | always built; projector input = ffn // 4 = 64    |
|                       | head, ffn 256                            |                                                  |
| `tts_config`          | `minicpmtts`: Llama hidden 128, 1 layer, | `num_vq` 1 and EOS 6561 (= audio tokens - 1) are |
|                       | 2 heads, 1 KV head, `llm_dim` 128 (the   | hard-coded (`omni_tts.py`, the pipeline's stop   |
|                       | thinker's hidden), 6562 audio tokens,    | id); `num_text_tokens` >= thinker vocab          |
|                       | `num_text_tokens` 151748                 |                                                  |
| config class          | `configuration_minicpmo.py` subclassing  | vLLM-Omni registers `MiniCPMOConfig` with the    |
|                       | vLLM-Omni's `MiniCPMOConfig`             | image processor only; transformers 5 knows no    |
|                       | (`auto_map.AutoConfig`)                  | `minicpmo` (the YAML sets `trust_remote_code`)   |
| tokenizer             | `tokenizer.write_toy_tokenizer`, Qwen    | served chat renders through the template         |
|                       | chat template                            |                                                  |
| `model.safetensors`   | one marker tensor                        | the code2wav stage loads with the default loader |
| `assets/token2wav/`,  | the stand-in assets (upstream-compatible | both code2wav classes load them; default voice   |
| `assets/HT_ref_audio` | sizes, `folders.py`)                     |                                                  |

Special tokens: Qwen's `<|endoftext|>` 151643, `<|im_start|>` 151644, `<|im_end|>` 151645 and MiniCPM-o's
`<|tts_bos|>` 151703 / `<|tts_eos|>` 151704 (the thinker's stop ids and the talker's span,
`stage_input_processors/minicpmo_4_5_omni.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni_token2wav.model_executor.models.standin.model_dirs import marker_safetensors
from vllm_omni_token2wav.model_executor.models.standin.toy import UpstreamToyPipeline
from vllm_omni_token2wav.model_executor.models.standin.toy.folders import json_bytes, token2wav_assets, toy_cache_dir
from vllm_omni_token2wav.model_executor.models.standin.toy.tokenizer import toy_tokenizer_files

__all__ = [
    "CHAT_TEMPLATE",
    "CODEC_EOS",
    "PIPELINE",
    "REFERENCE_AUDIO_KEY",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "chat_prompt",
    "ensure_minicpmo_4_5_dir",
    "toy_config",
]

VERSION = 1
VOCAB_SIZE = 151748
NUM_AUDIO_TOKENS = 6562
CODEC_EOS = NUM_AUDIO_TOKENS - 1
SPECIAL_TOKENS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|tts_bos|>": 151703,
    "<|tts_eos|>": 151704,
}
#: The prompt key upstream's chat server puts the reference voice under (`(waveform, sample_rate)`), read by
#: its `llm2tts` bridge (vLLM-Omni's `MINICPMO45_REFERENCE_AUDIO_KEY`).
REFERENCE_AUDIO_KEY = "_minicpmo45_reference_audio"
CONFIG_MODULE = "configuration_minicpmo"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CONFIG_SOURCE = '''# SPDX-License-Identifier: Apache-2.0
"""Toy MiniCPM-o 4.5 config (vllm_omni_token2wav standin/toy): vLLM-Omni's MiniCPMOConfig, loadable by AutoConfig."""

from vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_omni_llm import MiniCPMOConfig


class MiniCPMOToyConfig(MiniCPMOConfig):
    def __init__(self, **kwargs):  # explicit: transformers 5 would generate one that leaves sub-configs dicts
        super().__init__(**kwargs)
'''


def toy_config() -> dict:
    """The folder's `config.json` (see the module table)."""
    tts = {
        "model_type": "minicpmtts",
        "llm_dim": 128,
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "max_position_embeddings": 4096,
        "num_audio_tokens": NUM_AUDIO_TOKENS,
        "num_text_tokens": VOCAB_SIZE,
        "num_vq": 1,
        "vocab_size": NUM_AUDIO_TOKENS,
        "eos_token_id": CODEC_EOS,
        "audio_bos_token_id": 151687,
        "text_eos_token_id": 151692,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "architectures": ["MiniCPMO45OmniForConditionalGeneration"],
        "torch_dtype": "float32",
    }
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_attention_heads": 1,
        "num_hidden_layers": 2,
        "patch_size": 14,
        "image_size": 980,
    }
    audio = {
        "model_type": "whisper",
        "d_model": 64,
        "encoder_layers": 1,
        "encoder_attention_heads": 1,
        "encoder_ffn_dim": 256,
        "decoder_layers": 1,
        "decoder_attention_heads": 1,
        "decoder_ffn_dim": 256,
        "num_mel_bins": 80,
        "max_source_positions": 1500,
    }
    return {
        "architectures": ["MiniCPMO"],
        "model_type": "minicpmo",
        "version": "4.5",
        "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.MiniCPMOToyConfig"},
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "attention_bias": False,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": SPECIAL_TOKENS["<|endoftext|>"],
        "eos_token_id": SPECIAL_TOKENS["<|im_end|>"],
        "torch_dtype": "float32",
        "query_num": 64,
        "image_size": 448,
        "vision_config": vision,
        "audio_config": audio,
        "tts_config": tts,
        "init_vision": True,
        "init_audio": True,
        "init_tts": True,
    }


def chat_prompt(text: str) -> str:
    """A one-turn chat prompt as `CHAT_TEMPLATE` renders it (what served chat completions send)."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ensure_minicpmo_4_5_dir(root: Path | None = None, *, seed: int = 0) -> Path:
    """The toy MiniCPM-o 4.5 folder (see the module table), assembled when missing or stale."""
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_assembled

    folder = toy_cache_dir("minicpmo_4_5", VERSION, seed, root)
    recipe = {"toy": "minicpmo_4_5", "version": VERSION, "seed": seed}
    assets = token2wav_assets(seed)
    ensure_assembled(folder / "assets" / "token2wav", assets, recipe, {})
    ensure_assembled(folder / "assets", {"HT_ref_audio.wav": assets["HT_ref_audio.wav"]}, recipe, {})
    files = {
        "config.json": json_bytes(toy_config()),
        f"{CONFIG_MODULE}.py": _CONFIG_SOURCE.encode(),
        "model.safetensors": marker_safetensors(),
        **toy_tokenizer_files(VOCAB_SIZE, SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE),
    }
    ensure_assembled(folder, {}, recipe, files)
    return folder


#: Reply lengths unless a request says otherwise: thinker text tokens, talker codes.
DEFAULT_TEXT_TOKENS = 12
DEFAULT_CODES = 70


@dataclass(frozen=True)
class MiniCPMO45ToyPipeline(UpstreamToyPipeline):
    """Upstream's MiniCPM-o 4.5 turn pipeline (thinker -> talker -> code2wav) over the toy folder."""

    def ensure_model_dir(self, root: Path | None = None) -> Path:
        return ensure_minicpmo_4_5_dir(root)

    def offline_prompt(
        self,
        text: str,
        *,
        voice: Any = None,
        codes: int = DEFAULT_CODES,
        text_tokens: int = DEFAULT_TEXT_TOKENS,
        seed: int = 0,
        async_chunk: bool = True,
    ) -> tuple[dict[str, Any], list[Any]]:
        """The chat prompt and per-stage params: a reply of exactly `text_tokens` tokens, `codes` codes.

        The thinker must not stop before `text_tokens` (`min_tokens`: random weights may sample a stop id at
        once, leaving the talker nothing to speak); the random talker never samples its EOS after the YAML's
        `min_tokens`, so `max_tokens` is its reply length (`min_tokens` capped to it). `voice`: a
        `(waveform, sample_rate)` reference the chat server would put under `REFERENCE_AUDIO_KEY`.
        """
        thinker = {"max_tokens": text_tokens, "min_tokens": text_tokens, "seed": seed}
        defaults = self.default_sampling(async_chunk=async_chunk)
        talker = {"max_tokens": codes, "min_tokens": min(codes, int(defaults[1].get("min_tokens", 0))), "seed": seed}
        params = self.sampling_params([thinker, talker, {}], async_chunk=async_chunk)
        prompt: dict[str, Any] = {"prompt": chat_prompt(text)}
        if voice is not None:
            waveform, rate = voice
            prompt[REFERENCE_AUDIO_KEY] = (np.asarray(waveform, dtype=np.float32), int(rate))
        return prompt, params

    def http_request(self, text: str, *, stream: bool, voice: Any = None) -> tuple[str, dict[str, Any]]:
        """`POST /v1/chat/completions` with text and audio out (upstream's MiniCPM-o chat serving)."""
        if voice is not None:
            raise NotImplementedError("a served reference voice (audio content part) is not wired for the toy")
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": text}],
            "modalities": ["text", "audio"],
            "max_tokens": DEFAULT_TEXT_TOKENS,
            "min_tokens": DEFAULT_TEXT_TOKENS,
            "stream": stream,
        }
        return "/v1/chat/completions", body


#: The stage keys a CPU host forces beyond the shared ones: the YAML's AR stages compile (`enforce_eager:
#: false`), and a text-only folder has no MiniCPM-o multimodal processor.
_TEXT_ONLY = {"limit_mm_per_prompt": {"image": 0, "audio": 0, "video": 0}}

PIPELINE = MiniCPMO45ToyPipeline(
    family="minicpmo_4_5",
    upstream_yaml={"async_chunk": "minicpmo_4_5_turn.yaml"},
    ar_stages=(0, 1),
    code2wav_stage=2,
    stage_keys={0: _TEXT_ONLY, 1: _TEXT_ONLY},
)
