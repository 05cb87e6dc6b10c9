# SPDX-License-Identifier: Apache-2.0
"""Times every put / get of vLLM-Omni's stage connectors in a served engine's processes (`--engine --edge`).

`bench token2wav-serve --engine --edge` compares the code2wav edge on `SharedMemoryConnector` and on
`MooncakeTransferEngineConnector`; neither connector reports how long one transfer takes, so the benchmark puts
this folder first on the server's `PYTHONPATH` and sets `VLLM_OMNI_TOKEN2WAV_BENCH_TRANSFERS` to a folder. Python
imports `sitecustomize` at start-up in every engine process; this one wraps both connectors' `put` and `get` as
their modules are imported (`vllm_omni_token2wav/import_hooks.py`: importing vLLM-Omni here would run before
the plugin loads). Each put and each get appends one JSON line to `<folder>/<pid>.jsonl`: `{"op", "key", "ok",
"ms", "start", "end", "bytes", "connector"}` (`start` / `end`: `time.time()`, so a put and the get of the same key
in two processes give the hand-off delay too); a get that returned nothing (the receiver polls before the chunk is
there) is `"op": "miss"`: not a transfer, but time the receiver's scheduler spent asking.
Without the variable it does nothing. Standard library and `vllm_omni_token2wav.import_hooks` only (importing
the package is cheap and patches nothing).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from vllm_omni_token2wav.import_hooks import install_after_import

ENV = "VLLM_OMNI_TOKEN2WAV_BENCH_TRANSFERS"
_PACKAGE = "vllm_omni.distributed.omni_connectors.connectors."
#: module -> connector class whose put / get are timed
CONNECTORS = {
    _PACKAGE + "shm_connector": "SharedMemoryConnector",
    _PACKAGE + "mooncake_transfer_engine_connector": "MooncakeTransferEngineConnector",
}
_MARK = "_token2wav_bench_timed"
_LOCK = threading.Lock()


def _write(line: dict[str, Any]) -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return
    with _LOCK, (Path(folder) / f"{os.getpid()}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


def _size(op: str, result: Any) -> int | None:
    if isinstance(result, tuple) and len(result) >= 2 and isinstance(result[1], int):
        return result[1]  # put: (ok, size, meta); get: (data, size)
    return None


def _wrap(op: str, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        start_wall, start = time.time(), time.perf_counter()
        result = original(self, *args, **kwargs)
        elapsed = time.perf_counter() - start
        miss = op == "get" and result is None
        ok = bool(result[0]) if op == "put" and isinstance(result, tuple) else not miss
        key = kwargs.get("put_key") or kwargs.get("get_key") or (args[2] if len(args) > 2 else None)
        _write(
            {
                "op": "miss" if miss else op,
                "key": str(key),
                "ok": ok,
                "ms": 1e3 * elapsed,
                "start": start_wall,
                "end": start_wall + elapsed,
                "bytes": _size(op, result),
                "connector": name,
            }
        )
        return result

    setattr(timed, _MARK, True)
    return timed


def _patch(module: ModuleType, *, name: str) -> None:
    cls = getattr(module, name, None)
    if cls is None:
        return
    for op in ("put", "get"):
        method = getattr(cls, op, None)
        if method is not None and not getattr(method, _MARK, False):
            setattr(cls, op, _wrap(op, name, method))


if os.environ.get(ENV):
    install_after_import(
        "bench-transfer-timer", {module: functools.partial(_patch, name=name) for module, name in CONNECTORS.items()}
    )
