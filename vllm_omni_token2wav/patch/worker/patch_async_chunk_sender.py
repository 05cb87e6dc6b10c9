# SPDX-License-Identifier: Apache-2.0
"""One sender per async-chunk edge on Mooncake TE: the model runner leaves the edge to the scheduler's chunk adapter.

Register row: `worker.patch_async_chunk_sender` (patches vLLM-Omni 0.30's
`distributed/omni_connectors/model_runner/omni_connector_runtime.py:_should_create_payload_connector`).

With `async_chunk: true`, a producer stage's chunks leave through its scheduler's chunk adapter
(`transfer_adapter/chunk_transfer_adapter.py:174` builds that connector; `core/sched/omni_ar_scheduler.py:777`
calls its `save_async`). The stage's model runner builds a second connector for the same edge
(`omni_connector_runtime.py:186`, gated by `_should_create_payload_connector`, :54: a sender stage that names a
`custom_process_next_stage_input_func`), which it never uses for chunks under `async_chunk` (its full-payload path is
off there, `should_accumulate_full_payload_output`). A SharedMemory edge tolerates the spare connector; a
`MooncakeTransferEngineConnector` sender binds its ZMQ listener on the edge's port
(`mooncake_transfer_engine_connector.py:243`), so whichever of the two comes second fails with
`ZMQError: Address already in use` and the engine does not start.

The patch answers False for exactly that case (sender role, `async_chunk`, a Mooncake TE edge) and the stock
answer otherwise, so every other edge keeps upstream's behaviour. It installs only for vLLM-Omni 0.30.x
(`checks.within_version`) and only where `mooncake` imports (without it no such edge can be built).
Remove it when vLLM-Omni builds one sender per async-chunk edge.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.patch.checks import expect_callable, expect_reads, resolve, within_version
from vllm_omni_token2wav.patch.register import entry

logger = init_logger(__name__)

__all__ = ["ROW", "TARGET_MODULE", "applies", "install", "owned_by_chunk_adapter", "uninstall"]

ROW = entry(__name__)
TARGET_MODULE = "vllm_omni.distributed.omni_connectors.model_runner.omni_connector_runtime"
_FUNCTION = "_should_create_payload_connector"
#: The connectors that bind a listener per sender on the edge's port (the ones a second sender breaks).
PORT_BOUND_CONNECTORS = frozenset({"MooncakeTransferEngineConnector"})
_MARK = "_token2wav_single_sender"


def applies() -> bool:
    """The version gate: vLLM-Omni 0.30.x with `mooncake` importable (a Mooncake TE edge can exist)."""
    return within_version("vllm-omni", "0.30") and importlib.util.find_spec("mooncake") is not None


def _connector_config(model_config: Any) -> tuple[str | None, dict[str, Any]]:
    config = getattr(model_config, "stage_connector_config", None)
    if config is None:
        return None, {}
    if isinstance(config, dict):
        name, extra = config.get("name"), config.get("extra")
    else:
        name, extra = getattr(config, "name", None), getattr(config, "extra", None)
    return (name.strip() if isinstance(name, str) else None), (extra if isinstance(extra, dict) else {})


def owned_by_chunk_adapter(model_config: Any) -> bool:
    """A sender stage under `async_chunk` whose edge binds a port: the scheduler's chunk adapter owns that edge."""
    name, extra = _connector_config(model_config)
    return (
        bool(getattr(model_config, "async_chunk", False))
        and extra.get("role") == "sender"
        and name in PORT_BOUND_CONNECTORS
    )


def install() -> None:
    """Check upstream, then wrap the module function (idempotent). Nothing outside the version gate."""
    if not applies():
        return
    module = resolve(ROW.module, ROW.written_against, TARGET_MODULE)
    stock = getattr(module, _FUNCTION, None)
    if getattr(stock, _MARK, False):
        return
    dotted = f"{TARGET_MODULE}.{_FUNCTION}"
    expect_callable(ROW.module, ROW.written_against, dotted, stock, parameters=("model_config",))
    init = resolve(ROW.module, ROW.written_against, f"{TARGET_MODULE}._OmniConnectorRuntimeMixin.init_omni_connectors")
    expect_reads(ROW.module, ROW.written_against, init, f"{TARGET_MODULE}.init_omni_connectors", _FUNCTION)

    def should_create_payload_connector(model_config: Any, _stock: Any = stock) -> bool:
        if owned_by_chunk_adapter(model_config):
            logger.info_once(
                "async_chunk sender on %s: the scheduler's chunk adapter owns the edge, the model runner builds "
                "no second sender on its port (patch %s)",
                _connector_config(model_config)[0],
                ROW.module,
            )
            return False
        return bool(_stock(model_config))

    setattr(should_create_payload_connector, _MARK, True)
    should_create_payload_connector.__wrapped__ = stock  # type: ignore[attr-defined]
    setattr(module, _FUNCTION, should_create_payload_connector)


def uninstall() -> None:
    """Restore the stock function (tests)."""
    module = resolve(ROW.module, ROW.written_against, TARGET_MODULE)
    current = getattr(module, _FUNCTION)
    if getattr(current, _MARK, False):
        setattr(module, _FUNCTION, current.__wrapped__)
