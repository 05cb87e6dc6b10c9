# SPDX-License-Identifier: Apache-2.0
"""A request our stage cannot serve fails alone: FinishReason.ERROR with the stage's message.

vLLM-Omni 0.30 gives a generation stage no way to fail one request: an exception in `forward` kills
the engine core and aborts every request in flight (that is what upstream's code2wav stages do on
bad codes). Our stage never raises for a request's input; it returns, per segment, the message
under `token2wav_error` (a uint8 UTF-8 tensor, empty when fine: `token2wav_stage/errors.py`) next to
the audio. This patch, installed in the engine-core process (where the scheduler runs), reads those
messages off the model runner's output before `OmniGenerationScheduler.update_from_output` handles
the step, removes the key from every payload, and finishes each failed request the way vLLM-Omni
finishes requests that timed out waiting for input: `finish_requests(..., FINISHED_ERROR)` plus an
`OmniEngineCoreOutput(finish_reason=ERROR, stop_reason=<message>)` queued on the scheduler's
`_pending_input_timeout_outputs`, which `update_from_output` attaches to the step's outputs. The
orchestrator turns that into an error for that request only (offline `AsyncOmni`: its generator
raises with the message; served: an HTTP error carrying it); the other requests of the step keep
their audio and the stage frees the failed request's stream through `on_requests_finished`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import ERROR_KEY, decode_error

logger = init_logger(__name__)

__all__ = ["install_request_errors", "take_request_errors", "uninstall_request_errors"]

_MARK = "_token2wav_request_errors"


def take_request_errors(model_runner_output: Any) -> dict[str, str]:
    """`{request id: message}` of the step's failed requests; removes `ERROR_KEY` from every payload."""
    req_ids = list(getattr(model_runner_output, "req_ids", None) or [])
    errors: dict[str, str] = {}
    for attr in ("multimodal_outputs", "inter_stage_outputs"):
        payloads = getattr(model_runner_output, attr, None)
        if not payloads:
            continue
        for index, payload in enumerate(payloads):
            if not isinstance(payload, dict) or ERROR_KEY not in payload:
                continue
            message = decode_error(payload.pop(ERROR_KEY))
            if message and index < len(req_ids):
                errors.setdefault(str(req_ids[index]), message)
    return errors


def _fail(scheduler: Any, errors: dict[str, str]) -> list[str]:
    from vllm.v1.engine import FinishReason
    from vllm.v1.request import RequestStatus
    from vllm_omni.engine import OmniEngineCoreOutput

    failed = [rid for rid in errors if (req := scheduler.requests.get(rid)) is not None and not req.is_finished()]
    if not failed:
        return []
    pending = getattr(scheduler, "_pending_input_timeout_outputs", None)
    if pending is None:
        pending = scheduler._pending_input_timeout_outputs = {}
    for rid in failed:
        request = scheduler.requests[rid]
        request.stop_reason = errors[rid]
        pending[rid] = (
            request.client_index,
            OmniEngineCoreOutput(
                request_id=rid, new_token_ids=[], finish_reason=FinishReason.ERROR, stop_reason=errors[rid]
            ),
        )
        logger.warning("request %s failed in the token2wav stage: %s", rid, errors[rid])
    scheduler.finish_requests(failed, RequestStatus.FINISHED_ERROR)
    return failed


def _scheduler_classes() -> Iterable[type]:
    from vllm_omni.core.sched.omni_generation_scheduler import OmniGenerationScheduler

    return (OmniGenerationScheduler,)


def install_request_errors() -> None:
    """Wrap `update_from_output` of vLLM-Omni's generation scheduler (see the module docstring). Idempotent."""
    for cls in _scheduler_classes():
        stock = cls.update_from_output
        if getattr(stock, _MARK, False):
            continue

        def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any, _stock: Any = stock) -> Any:
            errors = take_request_errors(model_runner_output)
            if errors:
                _fail(self, errors)
            return _stock(self, scheduler_output, model_runner_output)

        setattr(update_from_output, _MARK, True)
        update_from_output.__wrapped__ = stock  # type: ignore[attr-defined]
        cls.update_from_output = update_from_output


def uninstall_request_errors() -> None:
    """Restore the stock `update_from_output` (tests)."""
    for cls in _scheduler_classes():
        current = cls.update_from_output
        if getattr(current, _MARK, False):
            cls.update_from_output = current.__wrapped__
