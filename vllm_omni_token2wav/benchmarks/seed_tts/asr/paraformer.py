# SPDX-License-Identifier: Apache-2.0
"""Chinese transcription with Paraformer-zh (funasr) followed by zhconv to simplified, as the zh protocol does.

funasr pulls a large dependency tree and downloads its model from ModelScope, so it is not part of the
bench extra: selecting it without funasr installed raises an error that says how to enable it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_omni_token2wav.benchmarks.seed_tts.asr.hf_whisper import check_asr_audio

DEFAULT_PARAFORMER_MODEL = "paraformer-zh"


@dataclass
class ParaformerBackend:
    model: Any
    model_id: str
    device: str = "cpu"
    locale: str = "zh"
    name: str = "paraformer"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, audio: np.ndarray) -> str:
        import zhconv

        x = check_asr_audio(audio)
        with self._lock:
            result = self.model.generate(input=x, batch_size_s=300)
        text = result[0]["text"] if result else ""
        return zhconv.convert(str(text), "zh-cn").strip()


def load_paraformer(model: str | None, device: str) -> ParaformerBackend:
    try:
        import zhconv
        from funasr import AutoModel
    except ImportError as exc:
        raise ImportError(
            "the zh ASR backend (paraformer) needs funasr and zhconv, which are not in the bench extra: "
            "pip install funasr zhconv modelscope (the model downloads from ModelScope on first use)"
        ) from exc
    del zhconv  # imported above only to fail early with the install hint
    model_id = model or DEFAULT_PARAFORMER_MODEL
    asr = AutoModel(model=model_id, device=device, disable_update=True)
    return ParaformerBackend(model=asr, model_id=model_id, device=device)
