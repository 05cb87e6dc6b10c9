# SPDX-License-Identifier: Apache-2.0
"""TESTS ONLY: records every put / get of vLLM-Omni's `MooncakeTransferEngineConnector` in an engine process.

`tests/patch/worker/test_patch_mooncake_engine.py` puts this folder first on the `PYTHONPATH` of the engine it
starts and sets `TOKEN2WAV_TEST_MOONCAKE_RECORD` to a folder; Python imports this `sitecustomize` at start-up in
every engine process, which wraps the connector's `put` and `get` right after its module is imported (a
`sys.meta_path` finder: importing vLLM-Omni here would run before the plugin loads). Each put and each get that
returned data appends one JSON line to `<folder>/<pid>.jsonl`: `{"op", "key", "ok", "ms", "class"}`, so the test
sees that the chunks crossed Mooncake (the receiver's gets) and how long each transfer took. Without the variable
it does nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "TOKEN2WAV_TEST_MOONCAKE_RECORD"
MODULE = "vllm_omni.distributed.omni_connectors.connectors.mooncake_transfer_engine_connector"
CLASS = "MooncakeTransferEngineConnector"
_MARK = "_token2wav_test_recorded"


def _write(line: dict[str, Any]) -> None:
    folder = os.environ.get(ENV)
    if folder:
        with (Path(folder) / f"{os.getpid()}.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")


def _wrap(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original(self, *args, **kwargs)
        if op == "get" and result is None:  # the receiver polls: a miss is not a transfer
            return result
        ok = bool(result[0]) if op == "put" and isinstance(result, tuple) else True
        key = kwargs.get("put_key") or kwargs.get("get_key") or (args[2] if len(args) > 2 else None)
        _write({"op": op, "key": str(key), "ok": ok, "ms": 1e3 * (time.perf_counter() - start), "class": CLASS})
        return result

    setattr(recorded, _MARK, True)
    return recorded


def _patch(module: ModuleType) -> None:
    cls = getattr(module, CLASS, None)
    if cls is None:
        return
    for op in ("put", "get"):
        method = getattr(cls, op)
        if not getattr(method, _MARK, False):
            setattr(cls, op, _wrap(op, method))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if os.environ.get(ENV):
    if MODULE in sys.modules:
        _patch(sys.modules[MODULE])
    sys.meta_path.insert(0, _Finder())
