# SPDX-License-Identifier: Apache-2.0
"""The two Mooncake edge patches and the system-library loader, without starting an engine.

- `patch_async_chunk_sender`: the model runner builds no payload connector for a sender stage with `async_chunk`
  on a Mooncake TE edge (the chunk adapter owns it), and upstream's answer everywhere else; the installed wrapper
  on the real upstream module answers so, and `uninstall()` restores the stock function.
- `patch_mooncake_connectors`: `memory_pool_device: cpu` (or unset) becomes `cpu:0` only without an accelerator;
  the real TE connector, built with its engine / pool / listener set-up stubbed, gets its `stage_id` from the config
  and the host pool device; the install refuses (UpstreamMismatchError) when the chunk adapter no longer reads
  `stage_id`; a connector module that imported before the libraries loaded gets `TransferEngine` late.
- Both are outside their version gate (not vLLM-Omni 0.30.x, or no `mooncake`): `install()` touches nothing.
- `mooncake_libs`: finds the unpacked packages' library folders, loads nothing where there are none.

The tests that touch upstream need vLLM-Omni installed (skipped without it, an error in CI: `require_engine`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_omni_token2wav.patch import checks, mooncake_libs
from vllm_omni_token2wav.patch.worker import patch_async_chunk_sender as sender
from vllm_omni_token2wav.patch.worker import patch_mooncake_connectors as connectors

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _stage(name: str, role: str, *, async_chunk: bool = True, as_dict: bool = True) -> SimpleNamespace:
    extra = {"role": role, "stage_id": 0}
    config: Any = {"name": name, "extra": extra} if as_dict else SimpleNamespace(name=name, extra=extra)
    return SimpleNamespace(
        stage_connector_config=config, async_chunk=async_chunk, custom_process_next_stage_input_func="pkg.f"
    )


@pytest.mark.parametrize(
    ("name", "role", "async_chunk", "as_dict", "owned"),
    [
        ("MooncakeTransferEngineConnector", "sender", True, True, True),
        ("MooncakeTransferEngineConnector", "sender", True, False, True),
        ("MooncakeTransferEngineConnector", "receiver", True, True, False),
        ("MooncakeTransferEngineConnector", "sender", False, True, False),
        ("SharedMemoryConnector", "sender", True, True, False),
        ("MooncakeStoreConnector", "sender", True, True, False),
    ],
)
def test_only_an_async_chunk_sender_on_mooncake_te_is_left_to_the_chunk_adapter(
    name: str, role: str, async_chunk: bool, as_dict: bool, owned: bool
) -> None:
    assert sender.owned_by_chunk_adapter(_stage(name, role, async_chunk=async_chunk, as_dict=as_dict)) is owned


def test_no_connector_config_is_not_owned() -> None:
    assert not sender.owned_by_chunk_adapter(SimpleNamespace(async_chunk=True))


@pytest.mark.parametrize(
    ("config", "accelerator", "device"),
    [
        ({"memory_pool_device": "cpu"}, False, "cpu:0"),
        ({}, False, "cpu:0"),  # upstream's default is `cpu`
        ({"memory_pool_device": "cpu:0"}, False, "cpu:0"),
        ({"memory_pool_device": "cpu"}, True, "cpu"),  # pinning works where an accelerator is
        ({"memory_pool_device": "cuda:0"}, True, "cuda:0"),
    ],
)
def test_a_cpu_pool_is_unpinned_cpu_0_only_without_an_accelerator(
    config: dict[str, Any], accelerator: bool, device: str
) -> None:
    out = connectors.host_pool_device(dict(config), accelerator=accelerator)
    assert out.get(connectors.POOL_DEVICE_KEY, "cpu") == device


def test_the_version_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {"vllm-omni": "0.30.1"}

    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(checks.importlib.metadata, "version", version)
    assert checks.within_version("vllm-omni", "0.30")
    assert not checks.within_version("vllm-omni", "0.3")  # 0.30.1 is not of the 0.3 series
    assert not checks.within_version("vllm", "0.30")  # not installed
    versions["vllm-omni"] = "0.31.0"
    assert not checks.within_version("vllm-omni", "0.30")
    assert not sender.applies() and not connectors.applies()


def test_outside_the_gate_install_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sender, "applies", lambda: False)
    monkeypatch.setattr(connectors, "applies", lambda: False)
    monkeypatch.setattr(sender, "resolve", _must_not_run)
    monkeypatch.setattr(connectors, "resolve", _must_not_run)
    sender.install()
    connectors.install()


def _must_not_run(*args: Any) -> Any:
    raise AssertionError(f"resolved {args} outside the version gate")


def test_library_dirs_and_the_default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert mooncake_libs.library_dirs(tmp_path / "missing") == []
    lib = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libfoo.so.1").write_bytes(b"")
    assert mooncake_libs.library_dirs(tmp_path) == [lib]
    monkeypatch.delenv(mooncake_libs.ENV, raising=False)
    assert mooncake_libs.default_folder().parts[-2:] == ("lib", "token2wav-system-libs")
    monkeypatch.setenv(mooncake_libs.ENV, str(tmp_path))
    assert mooncake_libs.default_folder() == tmp_path


# --- against the installed upstream -----------------------------------------------------------------------------


@pytest.fixture
def upstream() -> None:
    from tests.helpers.engine import require_engine

    require_engine("the Mooncake patches against the installed vLLM-Omni")


@pytest.fixture
def installed_sender(upstream: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    module = importlib.import_module(sender.TARGET_MODULE)
    before = module._should_create_payload_connector
    # an engine-patch run earlier in this process (the plugin's apply_engine_patches) may have installed it already
    stock = before.__wrapped__ if getattr(before, sender._MARK, False) else before
    sender.uninstall()
    assert module._should_create_payload_connector is stock
    monkeypatch.setattr(sender, "applies", lambda: True)  # whether or not mooncake is installed here
    sender.install()
    sender.install()  # idempotent
    try:
        yield module
    finally:
        sender.uninstall()
        assert module._should_create_payload_connector is stock
        module._should_create_payload_connector = before  # the process as it was


def test_the_installed_runtime_builds_no_second_sender_for_the_chunk_adapters_edge(installed_sender: Any) -> None:
    gate = installed_sender._should_create_payload_connector
    stock = gate.__wrapped__
    assert not hasattr(stock, "__wrapped__")  # wrapped once
    mooncake = _stage("MooncakeTransferEngineConnector", "sender")
    assert stock(mooncake) is True  # upstream would build the second, port-binding sender
    assert gate(mooncake) is False
    for other in (_stage("SharedMemoryConnector", "sender"), _stage("MooncakeTransferEngineConnector", "receiver")):
        assert gate(other) is stock(other)


@pytest.fixture
def te_module(upstream: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The TE connector's module with engine, pool and listener set-up stubbed, and the patch installed."""
    module = importlib.import_module(
        "vllm_omni.distributed.omni_connectors.connectors.mooncake_transfer_engine_connector"
    )
    cls = module.MooncakeTransferEngineConnector
    classes = [
        connectors.resolve(connectors.ROW.module, connectors.ROW.written_against, d) for d, _ in connectors.CONNECTORS
    ]
    before = [c.__init__ for c in classes]
    connectors.uninstall()  # an engine-patch run earlier in this process may have installed it already
    stock = cls.__init__
    assert not getattr(stock, connectors._MARK, False)
    monkeypatch.setattr(connectors, "applies", lambda: True)
    monkeypatch.setattr(connectors, "_accelerator_present", lambda: False)
    connectors.install()  # checks the real upstream methods before they are stubbed below
    connectors.install()  # idempotent
    monkeypatch.setattr(module, "TransferEngine", object)
    for name in ("_init_engine", "_init_pool", "_init_listener"):
        monkeypatch.setattr(cls, name, lambda self, *a: None)
    monkeypatch.setattr(cls, "close", lambda self: None)
    try:
        yield module
    finally:
        connectors.uninstall()
        assert cls.__init__ is stock
        for connector_cls, init in zip(classes, before, strict=True):  # the process as it was
            connector_cls.__init__ = init


def test_the_te_connector_gets_its_stage_id_and_a_host_pool(te_module: Any) -> None:
    cls = te_module.MooncakeTransferEngineConnector
    assert not hasattr(cls.__init__.__wrapped__, "__wrapped__")  # wrapped once
    built = cls({"stage_id": 1, "role": "receiver", "host": "127.0.0.1"})
    assert built.stage_id == 1  # what the chunk adapter reads (chunk_transfer_adapter.py:327)
    assert built.pool_device == "cpu:0"
    pinned = cls({"stage_id": 0, "role": "receiver", "host": "127.0.0.1", "memory_pool_device": "cuda:1"})
    assert pinned.pool_device == "cuda:1" and pinned.stage_id == 0


def test_stock_te_connector_leaves_stage_id_unset(upstream: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug the patch works around still exists in the installed upstream (else: remove the patch)."""
    module = importlib.import_module(
        "vllm_omni.distributed.omni_connectors.connectors.mooncake_transfer_engine_connector"
    )
    cls = module.MooncakeTransferEngineConnector
    monkeypatch.setattr(module, "TransferEngine", object)
    for name in ("_init_engine", "_init_pool", "_init_listener"):
        monkeypatch.setattr(cls, name, lambda self, *a: None)
    monkeypatch.setattr(cls, "close", lambda self: None)
    built = cls.__init__.__wrapped__ if hasattr(cls.__init__, "__wrapped__") else cls.__init__
    obj = cls.__new__(cls)
    built(obj, {"stage_id": 1, "role": "receiver", "host": "127.0.0.1"})
    assert getattr(obj, "stage_id", None) is None and obj.pool_device == "cpu"


def test_install_refuses_when_the_chunk_adapter_no_longer_reads_stage_id(
    upstream: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = importlib.import_module(
        "vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter"
    ).OmniChunkTransferAdapter

    def _poll_single_request(self: Any, request: Any) -> None:  # a future upstream that keys chunks otherwise
        return None

    monkeypatch.setattr(adapter, "_poll_single_request", _poll_single_request)
    monkeypatch.setattr(connectors, "applies", lambda: True)
    with pytest.raises(checks.UpstreamMismatchError, match="stage_id"):
        connectors.install()


def test_a_connector_module_imported_before_the_libraries_gets_transfer_engine_late(
    te_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("mooncake") is None:
        pytest.skip("mooncake is not installed (the multinode extra)")
    if not mooncake_libs.preload():
        try:
            import mooncake.engine  # noqa: F401
        except ImportError:
            pytest.skip("mooncake's system libraries are not loadable here")
    monkeypatch.setattr(te_module, "TransferEngine", None)
    te_module.MooncakeTransferEngineConnector({"stage_id": 1, "role": "receiver", "host": "127.0.0.1"})
    from mooncake.engine import TransferEngine

    assert te_module.TransferEngine is TransferEngine
