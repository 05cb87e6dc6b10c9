# SPDX-License-Identifier: Apache-2.0
"""Keep our stage classes registered after vLLM-Omni re-registers its own (register row:
`platform.patch_omni_model_registration`).

vLLM-Omni resolves a stage's class by architecture name in two registries: `OmniModelRegistry` and vLLM's
`ModelRegistry` (what vLLM's `ModelConfig` validation inspects, in a subprocess, before the stage exists).
vLLM-Omni re-registers its whole table into vLLM's registry every time it creates a stage's model config
(`vllm_omni.engine.arg_utils.register_omni_models_to_vllm`), which would put upstream's classes back under
the names our plugin serves (`plugins/overrides.py`). `install(reregister)` replaces that module attribute
with a wrapper that calls the stock function and then `reregister` (the plugin passes its own registration,
so this module does not import the plugin layer). Callers that bound the function by name before the
install keep the stock one; vLLM-Omni 0.30 calls it through the module (`arg_utils.py`), which this covers.

Installed by `plugins.overrides.apply_overrides()` on every `register()` call, i.e. in every process that
loads our general plugins (the orchestrator / API server, where stage configs are built, included).
Before it touches anything it checks that the attribute exists and takes no arguments (the wrapper calls it
with none); otherwise `checks.UpstreamMismatchError` names the symbol and the installed versions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from vllm_omni_token2wav.patch.checks import UpstreamMismatchError, expect_callable, resolve
from vllm_omni_token2wav.patch.register import entry

__all__ = ["MARK", "ROW", "install", "uninstall"]

ROW = entry(__name__)
MARK = "_token2wav_wrapped"
_MODULE = "vllm_omni.engine.arg_utils"
_NAME = "register_omni_models_to_vllm"


def _module_and_stock() -> tuple[object, Callable[[], None]]:
    patch, version = ROW.module, ROW.written_against
    module = resolve(patch, version, _MODULE)
    stock = expect_callable(patch, version, ROW.target, resolve(patch, version, ROW.target))
    if getattr(stock, MARK, False):
        return module, stock
    required = [
        p.name
        for p in inspect.signature(stock).parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise UpstreamMismatchError(
            f"patch {patch}: upstream {ROW.target} now requires argument(s) {', '.join(required)} "
            f"(expected none: the wrapper calls it with none); written against {version}. Update or remove "
            "the patch (vllm_omni_token2wav/patch/register.py, docs/design/patches.md)."
        )
    return module, stock


def install(reregister: Callable[[], None]) -> None:
    """Wrap `register_omni_models_to_vllm` so each later call is followed by `reregister()`. Idempotent."""
    module, stock = _module_and_stock()
    if getattr(stock, MARK, False):
        return

    def register_omni_models_then_ours() -> None:
        stock()
        reregister()

    setattr(register_omni_models_then_ours, MARK, True)
    register_omni_models_then_ours.__wrapped__ = stock  # type: ignore[attr-defined]
    setattr(module, _NAME, register_omni_models_then_ours)


def uninstall() -> None:
    """Restore the stock function (tests)."""
    module, current = _module_and_stock()
    if getattr(current, MARK, False):
        setattr(module, _NAME, current.__wrapped__)  # type: ignore[attr-defined]
