# SPDX-License-Identifier: Apache-2.0
"""English transcription with a transformers Whisper checkpoint, robust to English-only (`*.en`) models.

Upstream's Seed-TTS scorer always called `generate(..., language="english", task="transcribe")`; on an
English-only checkpoint (generation config `is_multilingual == False`) transformers >= 4.36 raises
"Cannot specify `task` or `language` for an English-only model", and older versions or outdated generation
configs raise "The generation config is outdated ...", so the WER gate could not run at all. This module
tries, in order, and keeps `attention_mask` (and `return_timestamps=True` for audio over 30 s) on EVERY try:

| attempt              | what generate gets                                      | rejected by                     |
|----------------------|---------------------------------------------------------|---------------------------------|
| `forced_decoder_ids` | generation-config copy forcing <|en|> <|transcribe|>    | English-only / outdated configs |
|                      | (honoured only with language = task = None)             | and releases refusing forced ids|
| `language_task`      | `language="english", task="transcribe"`                 | English-only / outdated configs |
| `bare`               | nothing (an English-only model transcribes English)     | -                               |

Only errors ABOUT these prompt arguments move on to the next attempt; anything else (out of memory, shape
errors, a broken checkpoint) propagates. The attempt that worked is tried first on later calls.

Numerics: the model is forced to float32 (transformers v5 `from_pretrained` defaults to dtype "auto", which
would meet fp32 features with fp16 weights). Audio over 30 s is featurised with `truncation=False,
padding="longest"` (the processor otherwise silently keeps the first 30 s) and decoded long-form.
"""

from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_omni_token2wav.benchmarks.seed_tts.asr.audio import ASR_SAMPLE_RATE
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

HF_WHISPER_MODEL_ENV = "SEED_TTS_HF_WHISPER_MODEL"
DEFAULT_HF_WHISPER_MODEL = "openai/whisper-large-v3"
LONG_FORM_SECONDS = 30.0

ATTEMPTS = ("forced_decoder_ids", "language_task", "bare")

# Substrings of the ValueErrors transformers raises about the prompt arguments (language / task / forced ids)
# across 4.3x - 5.x. Anything else is a real failure and propagates.
_PROMPT_ERROR_MARKERS = (
    "forced_decoder_ids",
    "English-only",
    "is_multilingual",
    "generation config is outdated",
    "lang_to_id",
    "task_to_id",
    "`language`",
    "`task`",
)


class PromptPathUnavailableError(ValueError):
    """The forced-decoder-ids attempt does not apply to this checkpoint (English-only or outdated config)."""


def _is_prompt_argument_error(exc: BaseException) -> bool:
    if isinstance(exc, PromptPathUnavailableError):
        return True
    return isinstance(exc, (ValueError, TypeError)) and any(m in str(exc) for m in _PROMPT_ERROR_MARKERS)


def english_prompt_ids(generation_config: Any, long_form: bool) -> list[tuple[int, int]]:
    """Forced decoder ids for "<|en|> <|transcribe|> [<|notimestamps|>]" from a multilingual generation config."""
    if getattr(generation_config, "is_multilingual", None) is False:
        raise PromptPathUnavailableError("forced_decoder_ids: English-only checkpoint (is_multilingual=False)")
    lang_to_id = getattr(generation_config, "lang_to_id", None)
    task_to_id = getattr(generation_config, "task_to_id", None)
    if not lang_to_id or not task_to_id or "<|en|>" not in lang_to_id or "transcribe" not in task_to_id:
        raise PromptPathUnavailableError(
            "forced_decoder_ids: generation config has no lang_to_id/task_to_id for English"
        )
    ids = [(1, int(lang_to_id["<|en|>"])), (2, int(task_to_id["transcribe"]))]
    no_ts = getattr(generation_config, "no_timestamps_token_id", None)
    if not long_form and no_ts is not None:
        ids.append((3, int(no_ts)))
    return ids


def _attempt_kwargs(name: str, model: Any, long_form: bool) -> dict[str, Any]:
    if name == "forced_decoder_ids":
        ids = english_prompt_ids(model.generation_config, long_form)
        config = copy.deepcopy(model.generation_config)
        # forced ids are only honoured when neither language nor task is set on the config.
        config.language = None
        config.task = None
        config.forced_decoder_ids = ids
        return {"generation_config": config}
    if name == "language_task":
        return {"language": "english", "task": "transcribe"}
    if name == "bare":
        return {}
    raise ValueError(f"unknown attempt {name!r}; expected one of {ATTEMPTS}")


def _sequences(out: Any) -> Any:
    if isinstance(out, dict) or hasattr(out, "sequences"):
        return out["sequences"]
    return out


def check_asr_audio(audio: np.ndarray) -> np.ndarray:
    """The ASR input contract: 1-D finite float32 at 16 kHz, non-empty."""
    x = np.asarray(audio)
    if x.ndim != 1:
        raise ValueError(f"ASR audio must be mono [samples] float32 at 16 kHz, got shape {x.shape}")
    if x.size == 0:
        raise ValueError("ASR audio is empty (0 samples)")
    if x.dtype != np.float32:
        raise ValueError(f"ASR audio must be float32, got {x.dtype}; convert with read_audio_for_asr()")
    if not np.isfinite(x).all():
        raise ValueError("ASR audio contains NaN or Inf samples")
    return x


@dataclass
class HFWhisperBackend:
    """A loaded transformers Whisper (model + feature extractor + tokenizer) that transcribes English."""

    model: Any
    feature_extractor: Any
    tokenizer: Any
    device: str = "cpu"
    model_id: str = ""
    locale: str = "en"
    name: str = "hf-whisper"
    attempt_order: list[str] = field(default_factory=lambda: list(ATTEMPTS))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, audio: np.ndarray) -> str:
        with self._lock:
            return self._transcribe(check_asr_audio(audio))

    def _transcribe(self, audio: np.ndarray) -> str:
        import torch

        long_form = audio.shape[0] > LONG_FORM_SECONDS * ASR_SAMPLE_RATE
        fe_kwargs: dict[str, Any] = {"truncation": False, "padding": "longest"} if long_form else {}
        inputs = self.feature_extractor(
            audio, sampling_rate=ASR_SAMPLE_RATE, return_tensors="pt", return_attention_mask=True, **fe_kwargs
        )
        features = inputs["input_features"].to(device=self.device, dtype=torch.float32)
        base: dict[str, Any] = {"attention_mask": inputs["attention_mask"].to(self.device)}
        if long_form:
            base["return_timestamps"] = True

        failures: list[str] = []
        for name in list(self.attempt_order):
            try:
                kwargs = _attempt_kwargs(name, self.model, long_form)
                with torch.inference_mode():
                    out = self.model.generate(features, **base, **kwargs)
            except (ValueError, TypeError) as exc:
                if not _is_prompt_argument_error(exc):
                    raise
                logger.debug("hf-whisper %s: attempt %s rejected: %s", self.model_id, name, exc)
                failures.append(f"{name}: {exc}")
                continue
            if self.attempt_order[0] != name:
                # Sticky: the same checkpoint will reject the same arguments on every call.
                logger.info_once("hf-whisper %s: transcribing with the %s path", self.model_id, name)
                self.attempt_order.remove(name)
                self.attempt_order.insert(0, name)
            text = self.tokenizer.batch_decode(_sequences(out), skip_special_tokens=True)[0]
            return str(text).strip()
        raise RuntimeError(f"hf-whisper {self.model_id}: every prompt variant was rejected: " + " | ".join(failures))


def load_hf_whisper(model_id: str, device: str) -> HFWhisperBackend:
    """Load a transformers Whisper checkpoint (hub id or local folder) in float32 on `device`."""
    try:
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor
    except ImportError as exc:
        raise ImportError(
            "the hf-whisper ASR backend needs transformers: pip install 'transformers>=5.5.3' "
            "(or use --asr faster-whisper for the offline tiny.en model)"
        ) from exc
    processor = WhisperProcessor.from_pretrained(model_id)
    model = WhisperForConditionalGeneration.from_pretrained(model_id, dtype=torch.float32)
    model = model.to(device=device, dtype=torch.float32).eval()
    logger.info("loaded hf-whisper %s on %s (float32)", model_id, device)
    return HFWhisperBackend(
        model=model,
        feature_extractor=processor.feature_extractor,
        tokenizer=processor.tokenizer,
        device=device,
        model_id=model_id,
    )


# Process-wide cache of loaded checkpoints: a large-v3 load takes ~10 s and 6 GB, and every caller of
# `_transcribe_en_f32_16k` in the process must share one copy. Guarded by a lock so concurrent first calls
# load once.
_loaded_lock = threading.Lock()
_loaded: dict[tuple[str, str], HFWhisperBackend] = {}


def get_hf_whisper(model_id: str | None = None, device: str | None = None) -> HFWhisperBackend:
    """The process's backend for (`model_id`, `device`); defaults from `SEED_TTS_HF_WHISPER_MODEL` / device rules."""
    from vllm_omni_token2wav.benchmarks.seed_tts.asr.device import resolve_asr_device

    mid = model_id or os.environ.get(HF_WHISPER_MODEL_ENV) or DEFAULT_HF_WHISPER_MODEL
    dev = resolve_asr_device(device)
    with _loaded_lock:
        backend = _loaded.get((mid, dev))
        if backend is None:
            backend = load_hf_whisper(mid, dev)
            _loaded[(mid, dev)] = backend
    return backend


def register_hf_whisper(backend: HFWhisperBackend) -> None:
    """Put an already-built backend into the process cache (tests, or callers that load weights themselves)."""
    with _loaded_lock:
        _loaded[(backend.model_id, backend.device)] = backend


def clear_hf_whisper_cache() -> None:
    with _loaded_lock:
        _loaded.clear()


def _transcribe_en_f32_16k(audio: np.ndarray) -> str:
    """Transcribe mono float32 16 kHz English `audio` with the configured checkpoint (upstream's entry point).

    The checkpoint comes from `SEED_TTS_HF_WHISPER_MODEL` (default openai/whisper-large-v3) and is loaded
    once per process; calls are serialised per backend, so this is safe from several threads.
    """
    return get_hf_whisper()(audio)
