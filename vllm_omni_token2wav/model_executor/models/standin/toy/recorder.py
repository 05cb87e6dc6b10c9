# SPDX-License-Identifier: Apache-2.0
"""Records what upstream's async-chunk functions hand the code2wav stage in a toy run (tests only).

TESTS AND TOY RUNS ONLY. Nothing in the plugin imports this module; it acts in a process that calls
`install()` or that starts with the toy's `SITE_DIR` on its `PYTHONPATH` (`standin/toy/__init__.py`; its
`sitecustomize.py` calls `install()`),
and only while `RECORD_ENV` names a folder. The toy pipeline tests set both for the engine processes they
spawn, so the chunks upstream's own function cut in the engine can be compared with what our code2wav stage
counted (MiniCPM-o's talker codes never reach the client: this is the only way to see them).

`install()` wraps `RECORDED` (upstream's `tts2code2wav_async_chunk` and `thinker2token2wav_async_chunk`) right
after their module is imported (`vllm_omni_token2wav/import_hooks.py`), or at once if it already is. Each call
that returns a payload appends one JSON line to `<RECORD_ENV>/<pid>.jsonl`: `{"function", "request_id", "codes",
"last", "chunk_seq"}` (`last`: MiniCPM-o's `meta.last_chunk`, Step-Audio2's `meta.finished`); the payload is returned
unchanged. `read_records(folder)` gathers every process's lines per request id.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from vllm_omni_token2wav.import_hooks import install_after_import

__all__ = ["RECORDED", "RECORD_ENV", "install", "read_records"]

RECORD_ENV: Final = "VLLM_OMNI_TOKEN2WAV_TOY_CHUNKS"
RECORDED: Final[dict[str, tuple[str, ...]]] = {
    "vllm_omni.model_executor.stage_input_processors.minicpmo_4_5_omni": ("tts2code2wav_async_chunk",),
    "vllm_omni.model_executor.stage_input_processors.step_audio2": ("thinker2token2wav_async_chunk",),
}
_MARK: Final = "_vllm_omni_token2wav_toy_recorder"


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _record(function: str, payload: Any, request: Any) -> None:
    folder = os.environ.get(RECORD_ENV)
    if not folder or payload is None:
        return
    codes = getattr(payload, "codes", None)
    meta = getattr(payload, "meta", None)
    audio = getattr(codes, "audio", None)
    last = getattr(meta, "last_chunk", None)
    if last is None:
        last = getattr(meta, "finished", None)
    line = {
        "function": function,
        "request_id": getattr(request, "external_req_id", None) or getattr(payload, "request_id", None),
        "codes": [int(c) for c in _plain(audio)] if audio is not None else [],
        "last": bool(_plain(last)) if last is not None else None,
        "chunk_seq": _plain(getattr(meta, "chunk_seq", None)),
    }
    path = Path(folder) / f"{os.getpid()}.jsonl"
    with path.open("a") as out:  # one write per line: lines of concurrent calls do not interleave
        out.write(json.dumps(line) + "\n")


def _wrap(function: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        payload = original(*args, **kwargs)
        request = args[2] if len(args) > 2 else kwargs.get("request")  # (transfer_manager, output, request, ...)
        _record(function, payload, request)
        return payload

    setattr(recorded, _MARK, original)
    return recorded


def _patch(module: ModuleType) -> None:
    for name in RECORDED.get(module.__name__, ()):
        original = getattr(module, name, None)
        if original is not None and not hasattr(original, _MARK):
            setattr(module, name, _wrap(name, original))


def install() -> None:
    """Wrap the recorded functions (now if imported, else on import); a no-op without `RECORD_ENV`."""
    if not os.environ.get(RECORD_ENV):
        return
    install_after_import("toy-chunk-recorder", dict.fromkeys(RECORDED, _patch))


def read_records(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every recorded payload per request id, in the order each process wrote them."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out.setdefault(str(record["request_id"]), []).append(record)
    return out
