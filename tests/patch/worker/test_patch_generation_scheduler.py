# SPDX-License-Identifier: Apache-2.0
"""The scheduler patch installs only where upstream still has the error-finish path it feeds.

`check_upstream` is run on stand-in scheduler classes (no engine): the complete shape passes; a scheduler
that no longer declares `_pending_input_timeout_outputs`, whose drain no longer reads it, or whose
`update_from_output` no longer drains, is refused with an error that names the attribute and the versions.
`take_request_errors` is checked on a stand-in model runner output. The real upstream class is
`tests/patch/test_real_upstream.py`'s.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import ERROR_KEY
from vllm_omni_token2wav.patch.checks import UpstreamMismatchError
from vllm_omni_token2wav.patch.worker import patch_generation_scheduler as patch

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


class _Mixin:
    _pending_input_timeout_outputs: dict[str, tuple[int, Any]]

    def _attach_finished_request_sets(self, outputs: Any) -> None:
        pending = getattr(self, "_pending_input_timeout_outputs", None)
        if pending:
            pending.clear()


class _Scheduler(_Mixin):
    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self._attach_finished_request_sets({})

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]:
        return []


def test_the_complete_upstream_shape_passes() -> None:
    patch.check_upstream(_Scheduler, "fake.Scheduler")


def test_a_scheduler_without_the_pending_attribute_is_refused_not_patched() -> None:
    class Renamed:  # what a rename upstream looks like: the queue has another name, nothing declares ours
        _pending_error_outputs: dict[str, tuple[int, Any]]

        def _attach_finished_request_sets(self, outputs: Any) -> None:
            getattr(self, "_pending_input_timeout_outputs", None)

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            self._attach_finished_request_sets({})

        def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]:
            return []

    with pytest.raises(UpstreamMismatchError) as info:
        patch.check_upstream(Renamed, "fake.Renamed")
    message = str(info.value)
    assert "fake.Renamed._pending_input_timeout_outputs" in message
    assert "vLLM-Omni " in message and patch.ROW.written_against in message
    assert not hasattr(Renamed, "_pending_input_timeout_outputs")


def test_a_drain_that_no_longer_reads_the_attribute_is_refused() -> None:
    class OtherDrain(_Scheduler):
        def _attach_finished_request_sets(self, outputs: Any) -> None:
            return None

    with pytest.raises(UpstreamMismatchError, match="_attach_finished_request_sets.*_pending_input_timeout_outputs"):
        patch.check_upstream(OtherDrain, "fake.OtherDrain")


def test_an_update_that_no_longer_drains_or_has_other_parameters_is_refused() -> None:
    class NoDrain(_Scheduler):
        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            return {}

    class NewSignature(_Scheduler):
        def update_from_output(self, model_runner_output: Any) -> Any:  # type: ignore[override]
            self._attach_finished_request_sets({})

    with pytest.raises(UpstreamMismatchError, match="update_from_output.*_attach_finished_request_sets"):
        patch.check_upstream(NoDrain, "fake.NoDrain")
    with pytest.raises(UpstreamMismatchError, match=r"parameters starting \(self, scheduler_output"):
        patch.check_upstream(NewSignature, "fake.NewSignature")


def test_take_request_errors_reads_and_strips_the_error_key() -> None:
    def message(text: str) -> torch.Tensor:
        return torch.tensor(list(text.encode()), dtype=torch.uint8)

    output = SimpleNamespace(
        req_ids=["a", "b", "c"],
        multimodal_outputs=[{ERROR_KEY: message("bad codes"), "audio": 1}, {ERROR_KEY: message("")}, {"audio": 2}],
        inter_stage_outputs=None,
    )
    assert patch.take_request_errors(output) == {"a": "bad codes"}
    assert all(ERROR_KEY not in payload for payload in output.multimodal_outputs)
