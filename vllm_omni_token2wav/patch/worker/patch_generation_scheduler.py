# SPDX-License-Identifier: Apache-2.0
"""A request our stage cannot serve fails alone: FinishReason.ERROR with the stage's message.

Register row: `worker.patch_generation_scheduler` (patches
`vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler.update_from_output`).

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

The queue is vLLM-Omni's private attribute, so `install()` refuses (`checks.UpstreamMismatchError`, naming the
attribute and the installed versions) unless upstream still has the whole path: `update_from_output(self,
scheduler_output, model_runner_output)`, `finish_requests(self, request_ids, finished_status)`, a class of the
scheduler's MRO that declares `_pending_input_timeout_outputs` (upstream annotates it on `OmniSchedulerMixin`
and creates the dict lazily on the instance, in `_finish_input_timeout_requests`), `_attach_finished_request_sets`
reading it and `update_from_output` calling that, `OmniEngineCoreOutput` with the fields we fill,
`FinishReason.ERROR` and `RequestStatus.FINISHED_ERROR`. So a rename upstream fails the plugin at start-up
instead of finishing failed requests with no output. At run time the patch creates the instance's dict the
way upstream's own lazy creator does (the install check proved upstream declares and drains it).

The same wrapper takes the stage's measured cost model (`token2wav_stage/cost_model.py`, key `COST_KEY`) off
every payload and keeps the latest on the scheduler instance (`COST_MODEL_ATTR`), where the latency-planning
patch of `schedule` (`patch_latency_planning.py`) reads it, and each stream chunk's new audio seconds
(`token2wav_stage/playback.py`, key `PLAYBACK_KEY`) into the scheduler's `PlaybackClock` (`PLAYBACK_ATTR`,
created on the first published value; requests no longer live are dropped after each step), from which that
patch orders due stream chunks first. None of these keys reaches the orchestrator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import COST_KEY, CostModel
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import ERROR_KEY, decode_error
from vllm_omni_token2wav.model_executor.models.token2wav_stage.playback import (
    PLAYBACK_KEY,
    PlaybackClock,
    decode_seconds,
)
from vllm_omni_token2wav.patch.checks import (
    UpstreamMismatchError,
    expect_attribute,
    expect_callable,
    expect_declared_attribute,
    expect_reads,
    resolve,
)
from vllm_omni_token2wav.patch.register import entry

logger = init_logger(__name__)

__all__ = [
    "COST_MODEL_ATTR",
    "PLAYBACK_ATTR",
    "ROW",
    "check_upstream",
    "install",
    "take_cost_model",
    "take_playback",
    "take_request_errors",
    "uninstall",
]

ROW = entry(__name__)
#: vLLM-Omni's private queue of error outputs that `update_from_output` attaches to the step's outputs.
PENDING_ATTR = "_pending_input_timeout_outputs"
_OUTPUT_FIELDS = ("request_id", "new_token_ids", "finish_reason", "stop_reason")

_MARK = "_token2wav_request_errors"
#: The scheduler instance's attribute holding the stage's latest published `CostModel` (ours, not upstream's).
COST_MODEL_ATTR = "_token2wav_cost_model"
#: The scheduler instance's `PlaybackClock` of its streams (ours, not upstream's); absent until our stage publishes.
PLAYBACK_ATTR = "_token2wav_playback"


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


def take_cost_model(model_runner_output: Any) -> CostModel | None:
    """The stage's published cost model of this step (None if none); removes `COST_KEY` from every payload."""
    found: CostModel | None = None
    for attr in ("multimodal_outputs", "inter_stage_outputs"):
        for payload in getattr(model_runner_output, attr, None) or ():
            if isinstance(payload, dict) and COST_KEY in payload:
                model = CostModel.decode(payload.pop(COST_KEY))
                found = found or model
    return found


def take_playback(model_runner_output: Any) -> dict[str, float]:
    """`{request id: new audio seconds}` of the step's stream chunks; removes `PLAYBACK_KEY` from every payload."""
    req_ids = list(getattr(model_runner_output, "req_ids", None) or [])
    served: dict[str, float] = {}
    for attr in ("multimodal_outputs", "inter_stage_outputs"):
        for index, payload in enumerate(getattr(model_runner_output, attr, None) or ()):
            if not isinstance(payload, dict) or PLAYBACK_KEY not in payload:
                continue
            seconds = decode_seconds(payload.pop(PLAYBACK_KEY))
            if seconds is not None and index < len(req_ids):
                served.setdefault(str(req_ids[index]), seconds)
    return served


def _record_playback(scheduler: Any, served: dict[str, float]) -> None:
    clock: PlaybackClock | None = getattr(scheduler, PLAYBACK_ATTR, None)
    if clock is None:
        if not served:
            return
        clock = PlaybackClock()
        setattr(scheduler, PLAYBACK_ATTR, clock)
    for rid, seconds in served.items():
        clock.served(rid, seconds)


def _forget_finished(scheduler: Any) -> None:
    clock: PlaybackClock | None = getattr(scheduler, PLAYBACK_ATTR, None)
    live = getattr(scheduler, "requests", None)
    if clock is not None and len(clock) and isinstance(live, dict):
        clock.forget_except(live)


def _fail(scheduler: Any, errors: dict[str, str]) -> list[str]:
    from vllm.v1.engine import FinishReason
    from vllm.v1.request import RequestStatus
    from vllm_omni.engine import OmniEngineCoreOutput

    failed = [rid for rid in errors if (req := scheduler.requests.get(rid)) is not None and not req.is_finished()]
    if not failed:
        return []
    pending = getattr(scheduler, PENDING_ATTR, None)
    if pending is None:  # declared by upstream and created lazily there too (checked at install)
        pending = {}
        setattr(scheduler, PENDING_ATTR, pending)
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


_SCHEDULER = "vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler"


def check_upstream(cls: type, dotted: str = _SCHEDULER) -> None:
    """Refuse (`UpstreamMismatchError`) unless `cls` has the error-finish path the patch feeds (module docstring)."""
    patch, version = ROW.module, ROW.written_against
    update = expect_callable(
        patch,
        version,
        f"{dotted}.update_from_output",
        getattr(cls, "update_from_output", None),
        parameters=("self", "scheduler_output", "model_runner_output"),
    )
    expect_callable(
        patch,
        version,
        f"{dotted}.finish_requests",
        getattr(cls, "finish_requests", None),
        parameters=("self", "request_ids", "finished_status"),
    )
    expect_declared_attribute(patch, version, cls, dotted, PENDING_ATTR)
    drain = expect_callable(
        patch, version, f"{dotted}._attach_finished_request_sets", getattr(cls, "_attach_finished_request_sets", None)
    )
    expect_reads(patch, version, drain, f"{dotted}._attach_finished_request_sets", PENDING_ATTR)
    expect_reads(patch, version, update, f"{dotted}.update_from_output", "_attach_finished_request_sets")


def _check_engine_types() -> None:
    patch, version = ROW.module, ROW.written_against
    output = resolve(patch, version, "vllm_omni.engine.OmniEngineCoreOutput")
    fields = getattr(output, "__struct_fields__", None) or getattr(output, "__dataclass_fields__", None) or ()
    missing = [name for name in _OUTPUT_FIELDS if name not in fields]
    if missing:
        raise UpstreamMismatchError(
            f"patch {patch}: upstream vllm_omni.engine.OmniEngineCoreOutput has no field(s) {', '.join(missing)} "
            f"(expected {', '.join(_OUTPUT_FIELDS)}); written against {version}"
        )
    finish_reason = resolve(patch, version, "vllm.v1.engine.FinishReason")
    expect_attribute(patch, version, finish_reason, "vllm.v1.engine.FinishReason", "ERROR")
    status = resolve(patch, version, "vllm.v1.request.RequestStatus")
    expect_attribute(patch, version, status, "vllm.v1.request.RequestStatus", "FINISHED_ERROR")


def _scheduler_classes() -> Iterable[type]:
    return (resolve(ROW.module, ROW.written_against, _SCHEDULER),)


def install() -> None:
    """Check upstream, then wrap `update_from_output` of vLLM-Omni's generation scheduler. Idempotent."""
    classes = tuple(_scheduler_classes())
    _check_engine_types()
    for cls in classes:
        stock = cls.update_from_output
        if getattr(stock, _MARK, False):
            continue
        check_upstream(cls)

        def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any, _stock: Any = stock) -> Any:
            errors = take_request_errors(model_runner_output)
            costs = take_cost_model(model_runner_output)
            _record_playback(self, take_playback(model_runner_output))
            if costs is not None:
                if getattr(self, COST_MODEL_ATTR, None) is None or costs.samples % 50 == 0:
                    logger.info("token2wav stage's cost model: %s", costs)
                setattr(self, COST_MODEL_ATTR, costs)
            if errors:
                _fail(self, errors)
            try:
                return _stock(self, scheduler_output, model_runner_output)
            finally:
                _forget_finished(self)

        setattr(update_from_output, _MARK, True)
        update_from_output.__wrapped__ = stock  # type: ignore[attr-defined]
        cls.update_from_output = update_from_output


def uninstall() -> None:
    """Restore the stock `update_from_output` (tests)."""
    for cls in _scheduler_classes():
        current = cls.update_from_output
        if getattr(current, _MARK, False):
            cls.update_from_output = current.__wrapped__
