# SPDX-License-Identifier: Apache-2.0
"""The Mooncake connectors as the chunk adapter needs them: a `stage_id`, and a host pool without an accelerator.

Register row: `worker.patch_mooncake_connectors` (patches `__init__` of vLLM-Omni 0.30's
`MooncakeTransferEngineConnector` and `MooncakeStoreConnector`, `distributed/omni_connectors/connectors/`).

Two upstream gaps stop a Mooncake edge from carrying async chunks to our code2wav stage:

- vLLM-Omni's chunk adapter reads `connector.stage_id` (`transfer_adapter/chunk_transfer_adapter.py:327,496,774`)
  to build its keys; SharedMemory, Nixl and Mori set it from the config's `stage_id` (which
  `resolve_connector_spec` always fills), the two Mooncake connectors never do, so the first chunk raises
  AttributeError. The patch sets it from the config after the stock `__init__`, where the stock code left none.
- `MooncakeTransferEngineConnector` pins its pool when `memory_pool_device` is `cpu`, its default
  (`mooncake_transfer_engine_connector.py:204`); pinning needs an accelerator, so on a CPU host the connector
  raises "Cannot access accelerator device". Decision: make it work. Where no accelerator is present
  (`torch.accelerator.is_available()`), `cpu` becomes `cpu:0` before the stock `__init__` (the same host bytes,
  allocated unpinned; :207) and one info line says so. `cpu:0` itself, and every accelerator host, are untouched.

Installs only for vLLM-Omni 0.30.x (`checks.within_version`) and only where `mooncake` imports (without it the
connectors cannot be built). Remove it when both connectors set `stage_id` and the TE connector pins only where
an accelerator is present.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.patch import mooncake_libs
from vllm_omni_token2wav.patch.checks import expect_callable, expect_reads, resolve, within_version
from vllm_omni_token2wav.patch.register import entry

logger = init_logger(__name__)

__all__ = ["CONNECTORS", "POOL_DEVICE_KEY", "ROW", "applies", "host_pool_device", "install", "uninstall"]

ROW = entry(__name__)
_PACKAGE = "vllm_omni.distributed.omni_connectors.connectors"
#: The patched classes (dotted) and whether they allocate a transfer pool (`memory_pool_device`).
CONNECTORS: tuple[tuple[str, bool], ...] = (
    (f"{_PACKAGE}.mooncake_transfer_engine_connector.MooncakeTransferEngineConnector", True),
    (f"{_PACKAGE}.mooncake_store_connector.MooncakeStoreConnector", False),
)
POOL_DEVICE_KEY = "memory_pool_device"
_ADAPTER_INIT = "vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter.OmniChunkTransferAdapter"
_MARK = "_token2wav_mooncake_init"


def applies() -> bool:
    """The version gate: vLLM-Omni 0.30.x with `mooncake` importable."""
    return within_version("vllm-omni", "0.30") and importlib.util.find_spec("mooncake") is not None


def _accelerator_present() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())


def host_pool_device(config: dict[str, Any], *, accelerator: bool) -> dict[str, Any]:
    """`config` with `memory_pool_device: cpu` (or unset, upstream's default) as `cpu:0` where no accelerator is."""
    if accelerator or str(config.get(POOL_DEVICE_KEY, "cpu")) != "cpu":
        return config
    logger.info_once(
        "%s: cpu on a host without an accelerator: using cpu:0 (host memory, unpinned; pinning needs an "
        "accelerator) (patch %s)",
        POOL_DEVICE_KEY,
        ROW.module,
    )
    return {**config, POOL_DEVICE_KEY: "cpu:0"}


def _late_transfer_engine(cls: type) -> None:
    """Import `mooncake.engine` now where the connector's module imported before the system libraries were loaded.

    The connector module binds `TransferEngine = None` when `from mooncake.engine import TransferEngine` fails at its
    import (`mooncake_transfer_engine_connector.py:25`), e.g. `libibverbs.so.1` not yet loaded; its `__init__` then
    raises "Mooncake not available". Loading the libraries (`mooncake_libs.preload`) and importing again fixes that.
    """
    module = sys.modules.get(cls.__module__)
    if module is None or getattr(module, "TransferEngine", True) is not None:
        return
    mooncake_libs.preload()
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise ImportError(
            f"MooncakeTransferEngineConnector: `mooncake.engine` does not import ({exc}). Install the system "
            f"libraries {' '.join(mooncake_libs.DEBIAN_PACKAGES)} (Debian), or without root unpack them with "
            f"`bash tools/fetch_multinode_libs.sh DEST` and set {mooncake_libs.ENV}=DEST"
        ) from exc
    module.TransferEngine = TransferEngine


def _wrap(cls: type, *, pools: bool) -> None:
    stock = cls.__init__

    def init(self: Any, config: dict[str, Any], *args: Any, _stock: Any = stock, **kwargs: Any) -> None:
        if pools:
            _late_transfer_engine(cls)
        if pools and isinstance(config, dict):
            config = host_pool_device(config, accelerator=_accelerator_present())
        _stock(self, config, *args, **kwargs)
        if getattr(self, "stage_id", None) is None and isinstance(config, dict) and "stage_id" in config:
            self.stage_id = int(config["stage_id"])

    init.__name__ = init.__qualname__ = "__init__"
    setattr(init, _MARK, True)
    init.__wrapped__ = stock  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[method-assign]


def install() -> None:
    """Check upstream, then wrap both connectors' `__init__` (idempotent). Nothing outside the version gate."""
    if not applies():
        return
    patch, version = ROW.module, ROW.written_against
    mooncake_libs.preload()  # before the connector modules import `mooncake.engine`
    # The consumer of `stage_id` must still read it, or setting it would feed nothing.
    adapter = resolve(patch, version, _ADAPTER_INIT)
    expect_reads(patch, version, adapter._poll_single_request, f"{_ADAPTER_INIT}._poll_single_request", "stage_id")
    for dotted, pools in CONNECTORS:
        cls = resolve(patch, version, dotted)
        if getattr(cls.__init__, _MARK, False):
            continue
        expect_callable(patch, version, f"{dotted}.__init__", cls.__init__, parameters=("self", "config"))
        if pools:
            expect_reads(patch, version, cls._init_pool, f"{dotted}._init_pool", "pin_memory")
        _wrap(cls, pools=pools)


def uninstall() -> None:
    """Restore the stock `__init__`s (tests)."""
    for dotted, _ in CONNECTORS:
        cls = resolve(ROW.module, ROW.written_against, dotted)
        if getattr(cls.__init__, _MARK, False):
            cls.__init__ = cls.__init__.__wrapped__  # type: ignore[method-assign]
