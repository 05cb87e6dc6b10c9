# SPDX-License-Identifier: Apache-2.0
"""Upstream's CosyVoice3 pipeline at toy size: its own talker and deploy YAML, our code2wav behind it.

vLLM-Omni 0.30 runs CosyVoice3 as talker (`CosyVoice3Model`, `model_stage: cosyvoice3_talker`) ->
code2wav (`cosyvoice3_code2wav`), from `vllm_omni/deploy/cosyvoice3.yaml`. With this plugin installed the
architecture `CosyVoice3Model` builds upstream's talker and our `CosyVoice3Code2Wav`
(`cosyvoice3/cosyvoice3_model.py`); with `VLLM_OMNI_TOKEN2WAV_OVERRIDES=0`, upstream's class for both.
`PIPELINE` makes that pipeline runnable on a CPU host without the real checkpoint:

| piece                   | what                                                                            |
|-------------------------|---------------------------------------------------------------------------------|
| `ensure_model_dir()`    | root `config.json` `{}` (vLLM-Omni patches in `CosyVoice3Config`, whose sizes    |
|                         | are hard-coded); the reduced stand-in code2wav assets (`flow.pt`, `hift.pt`,    |
|                         | `campplus.onnx`, `default_voice.wav` + tokens, `standin/cosyvoice3_dir.py`);         |
|                         | `CosyVoice-BlankEN/` with a toy Qwen2 config (`TALKER_CONFIG`: hidden 896, which |
|                         | the talker hard-codes, 1 layer) and a byte-level tokenizer. No `llm.pt`: the     |
|                         | talker runs with `load_format: dummy` (random weights).                          |
| `deployment()`          | the toy overlay every family shares (`standin/toy/__init__.py`, its table): only |
|                         | what a CPU host forces, the talker's `load_format: dummy`, `enforce_eager` on     |
|                         | both stages, `async_chunk` (one YAML, both modes), the caller's overrides.        |
| `offline_prompt()`      | upstream's offline request: text + voice prompt (reference audio and its text),  |
|                         | and per-stage sampling params fixing the random talker's reply length           |
|                         | (`min_tokens` = `max_tokens`: random weights sample the stop token at once).     |
| `http_request()`        | `POST /v1/audio/speech` with `ref_audio` as a data URL and `ref_text`.           |

The talker's processor needs s3tokenizer's speech tokenizer v3, which it downloads; `cosyvoice3_door.py`
supplies a seeded stand-in in toy runs only (the engine processes get it through `PYTHONPATH`:
`engine_env()`). Everything is deterministic and offline; the folder is cached under `envs.cache_dir()`.
"""

from __future__ import annotations

import base64
import io
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.standin.toy import UpstreamToyPipeline
from vllm_omni_token2wav.model_executor.models.standin.toy.tokenizer import write_toy_tokenizer

logger = init_logger(__name__)

VERSION: Final = 2
TALKER_SUBDIR: Final = "CosyVoice-BlankEN"
#: The talker's Qwen2 (`CosyVoice-BlankEN/config.json`). Hidden 896 and 14 / 2 heads: `CosyVoice3Config`
#: hard-codes `llm_input_size` 896 for the speech embedding and decoder around it.
TALKER_CONFIG: Final[Mapping[str, Any]] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    # >= 6761 (speech_token_size + 200): when a new request's prefill shares a step with decoding ones,
    # upstream's `embed_input_ids` (cosyvoice3.py:828) first looks every id up in this text table, the
    # decoding requests' codec ids (< 6761) included, and only then takes their speech embeddings.
    "vocab_size": 8192,
    "max_position_embeddings": 4096,
    "max_window_layers": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "hidden_act": "silu",
    "bos_token_id": 8189,
    "eos_token_id": 8189,
}
#: Special tokens of the toy tokenizer: Qwen's chat tokens and CosyVoice3's prompt separator, at the top
#: of the toy vocabulary (the real ids, 151643+, do not fit it). CosyVoice3's tokenizer wrapper adds its ~300
#: other specials itself (ids >= 8192: never produced by the toy's texts).
SPECIAL_TOKENS: Final[Mapping[str, int]] = {
    "<|endofprompt|>": 8188,
    "<|endoftext|>": 8189,
    "<|im_start|>": 8190,
    "<|im_end|>": 8191,
}
#: The reference text of the default voice (the stand-in clip's words do not matter to random weights).
DEFAULT_REF_TEXT: Final = "Hello, this is my voice."
#: Upstream's speech adapter caps a reply at 20x / floors it at 2x the text tokens; the toy fixes it to
#: `CODES_PER_TEXT_TOKEN` x (byte-level tokenizer: one token per UTF-8 byte) unless told otherwise.
CODES_PER_TEXT_TOKEN: Final = 2
TALKER_STAGE: Final = 0
CODE2WAV_STAGE: Final = 1


@dataclass(frozen=True)
class ToyVoice:
    """A voice prompt: reference audio (mono float32 samples at `sample_rate`) and what it says."""

    audio: Any
    sample_rate: int
    text: str

    def wav_bytes(self) -> bytes:
        import numpy as np
        import soundfile

        buffer = io.BytesIO()
        soundfile.write(buffer, np.asarray(self.audio, dtype=np.float32), self.sample_rate, format="WAV")
        return buffer.getvalue()


def default_voice(seconds: float | None = None, *, start: float = 0.0) -> ToyVoice:
    """The stand-in default voice clip (24 kHz, 4 s), optionally `seconds` of it from `start`; `DEFAULT_REF_TEXT`."""
    import numpy as np
    import soundfile

    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import default_voice_wav

    audio, rate = soundfile.read(io.BytesIO(default_voice_wav()), dtype="float32")
    if audio.ndim == 2:
        audio = audio.mean(axis=1)
    audio = audio[int(start * rate) :]
    if seconds is not None:
        audio = audio[: int(seconds * rate)]
    return ToyVoice(np.ascontiguousarray(audio), int(rate), DEFAULT_REF_TEXT)


def _tokenizer_files() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        write_toy_tokenizer(Path(tmp), int(TALKER_CONFIG["vocab_size"]), SPECIAL_TOKENS)
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}


def _yaml(value: Mapping[str, Any]) -> str:
    return json.dumps(value, indent=1) + "\n"  # JSON is YAML


@dataclass(frozen=True)
class CosyVoice3ToyPipeline(UpstreamToyPipeline):
    """Upstream's CosyVoice3 pipeline at toy size (module docstring): the shared overlay of `UpstreamToyPipeline`
    over `cosyvoice3.yaml` (one YAML for both modes: the overlay sets `async_chunk`), enforce-eager code2wav."""

    seed: int = 0

    # ---- the model folder ----------------------------------------------------------------------------
    def ensure_model_dir(self, root: Path | None = None, *, full_size_code2wav: bool = False) -> Path:
        """The toy model folder (cached under `envs.cache_dir()` unless `root`), assembled when missing or stale.

        `full_size_code2wav`: the code2wav assets at the real sizes (a 1.3 GB flow), which upstream's own
        code2wav class needs (`CosyVoice3Config` hard-codes them); ours runs on the reduced ones.
        """
        from vllm_omni_token2wav import envs
        from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir
        from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_assembled

        if root is None:
            size = "-full-code2wav" if full_size_code2wav else ""
            root = envs.cache_dir("standins", f"toy-{self.family}-v{VERSION}{size}-seed{self.seed}")
        recipe = {"toy": self.family, "version": VERSION, "seed": self.seed, "full_size_code2wav": full_size_code2wav}
        assets_dir = ensure_standin_cosyvoice3_dir(reduced=not full_size_code2wav, seed=self.seed)
        assets = {p.name: p for p in sorted(assets_dir.iterdir()) if p.is_file() and not p.name.startswith(".")}
        talker = {"config.json": _yaml(TALKER_CONFIG).encode(), **_tokenizer_files()}
        ensure_assembled(root / TALKER_SUBDIR, {}, recipe, talker)
        ensure_assembled(root, assets, recipe, {"config.json": b"{}\n"})
        return root

    # ---- the deployment ------------------------------------------------------------------------------
    def deployment(
        self,
        model_dir: Path,
        out_dir: Path,
        *,
        async_chunk: bool,
        stage_overrides: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> Path:
        """The shared overlay (`UpstreamToyPipeline.deployment`); `model_dir` is not written into the YAML (the
        engine takes the model separately) but checked to be a toy folder, so a deployment is never paired with
        the wrong one by mistake."""
        if not (Path(model_dir) / TALKER_SUBDIR / "config.json").is_file():
            raise FileNotFoundError(f"{model_dir} is not a toy CosyVoice3 folder (no {TALKER_SUBDIR}/config.json)")
        return super().deployment(model_dir, out_dir, async_chunk=async_chunk, stage_overrides=stage_overrides)

    def engine_env(self, record_dir: Path | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for the engine's processes: the toy door on `PYTHONPATH` (+ the recorder's folder)."""
        from vllm_omni_token2wav.model_executor.models.standin.toy import site_pythonpath
        from vllm_omni_token2wav.model_executor.models.standin.toy.cosyvoice3_door import RECORD_ENV

        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = site_pythonpath(env.get("PYTHONPATH"))
        if record_dir is not None:
            env[RECORD_ENV] = str(record_dir)
        return env

    # ---- requests ------------------------------------------------------------------------------------
    def reply_codes(self, text: str) -> int:
        return max(1, CODES_PER_TEXT_TOKEN * len(text.encode()))

    def offline_prompt(
        self, text: str, *, voice: ToyVoice | None = None, codes: int | None = None
    ) -> tuple[dict[str, Any], list[Any]]:
        """Upstream's offline request and sampling params: the talker replies with exactly `codes` codec ids
        (default `reply_codes(text)`), the code2wav stage with upstream's defaults."""
        from vllm import SamplingParams

        voice = voice or default_voice()
        n = self.reply_codes(text) if codes is None else int(codes)
        prompt = {
            "prompt": text,
            "multi_modal_data": {"audio": (voice.audio, voice.sample_rate)},
            "mm_processor_kwargs": {"prompt_text": voice.text, "sample_rate": voice.sample_rate},
        }
        talker = SamplingParams(min_tokens=n, max_tokens=n, top_k=25, top_p=0.8, repetition_penalty=1.0001)
        code2wav = SamplingParams(max_tokens=2048)
        return prompt, [talker, code2wav]

    def http_request(
        self, text: str, *, stream: bool, voice: ToyVoice | None = None, codes: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """`("/v1/audio/speech", body)`: the voice as a WAV data URL; streamed as raw PCM, else one WAV."""
        voice = voice or default_voice()
        body: dict[str, Any] = {
            "input": text,
            "ref_audio": "data:audio/wav;base64," + base64.b64encode(voice.wav_bytes()).decode("ascii"),
            "ref_text": voice.text,
            "response_format": "pcm" if stream else "wav",
            "max_new_tokens": self.reply_codes(text) if codes is None else int(codes),
        }
        if stream:
            body.update(stream=True, stream_format="audio")
        return "/v1/audio/speech", body


PIPELINE: Final = CosyVoice3ToyPipeline(
    family="cosyvoice3",
    upstream_yaml={"async_chunk": "cosyvoice3.yaml", "sync": "cosyvoice3.yaml"},
    ar_stages=(TALKER_STAGE,),
    code2wav_stage=CODE2WAV_STAGE,
    stage_keys={CODE2WAV_STAGE: {"enforce_eager": True}},
    sets_async_chunk=True,
)

__all__ = [
    "CODE2WAV_STAGE",
    "PIPELINE",
    "SPECIAL_TOKENS",
    "TALKER_CONFIG",
    "TALKER_STAGE",
    "CosyVoice3ToyPipeline",
    "ToyVoice",
    "default_voice",
]
