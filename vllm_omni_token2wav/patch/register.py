# SPDX-License-Identifier: Apache-2.0
"""The register of every patch this plugin applies to an upstream object: one row per patch module.

`PATCHES` is the table; docs/design/patches.md holds the same table rendered by `render_table()` between
its `BEGIN/END PATCH TABLE` markers (`tests/patch/test_register.py` checks that they agree, and that every
module under `patch/platform/` and `patch/worker/` has exactly one row). Each patch module reads its own row
(`entry(module)`) so that its install-time check (`checks.py`) names the version it was written against.

Groups, after vLLM-Ascend's `patch/platform/` and `patch/worker/`: `platform` patches matter in every
process that loads the plugin (the API server / orchestrator included); `worker` patches act in the engine
processes (the engine core, where the scheduler runs, or the model-runner workers, where graphs are
captured). Both groups are installed by the plugin's `register()`, which vLLM and vLLM-Omni call in every
process they start, never on import: the `platform` patch through `plugins.overrides.apply_overrides()`, the
`worker` patches through `patch.apply_engine_patches()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["PATCHES", "PatchEntry", "entry", "render_table"]

#: The upstream versions the patches were written against (the engine this repository pins and tests).
VLLM_OMNI_0_30: Final = "vLLM 0.30.0 / vLLM-Omni 0.30.0"


@dataclass(frozen=True)
class PatchEntry:
    """One patch: what it patches, why, how, upstream's tracking item, when to remove it, what it was written for."""

    module: str  # relative to `vllm_omni_token2wav.patch`, e.g. "worker.patch_generation_scheduler"
    target: str  # the patched upstream object, dotted path
    why: str
    how: str
    upstream: str  # the upstream issue / PR, or why there is none
    remove_when: str
    written_against: str
    group: Literal["platform", "worker"]

    @property
    def path(self) -> str:
        """The module's file, relative to the repository root."""
        return "vllm_omni_token2wav/patch/" + self.module.replace(".", "/") + ".py"


PATCHES: Final[tuple[PatchEntry, ...]] = (
    PatchEntry(
        module="platform.patch_omni_model_registration",
        target="vllm_omni.engine.arg_utils.register_omni_models_to_vllm",
        why=(
            "vLLM-Omni re-registers its whole model table into vLLM's `ModelRegistry` each time it builds a "
            "stage's model config, overwriting our classes under upstream's architecture names, so vLLM would "
            "inspect upstream's class (which fails where its module cannot import)"
        ),
        how=(
            "replace the module attribute with a wrapper that calls the stock function, then our registration "
            "(`plugins/overrides.py`: `_register(active_table())`); marker `_token2wav_wrapped`, `__wrapped__` kept"
        ),
        upstream=(
            "none filed: vLLM-Omni has no hook for an out-of-tree plugin to override a registered architecture; "
            "the fix upstream would be to re-register only what is missing, or a plugin-override hook"
        ),
        remove_when=(
            "vLLM-Omni stops overwriting vLLM's registry entries on every stage config, or gives plugins a way "
            "to take precedence"
        ),
        written_against=VLLM_OMNI_0_30,
        group="platform",
    ),
    PatchEntry(
        module="worker.patch_generation_scheduler",
        target="vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler.update_from_output",
        why=(
            "vLLM-Omni gives a generation stage no way to fail one request: an exception in `forward` kills the "
            "engine core and every request in flight; our stage reports a request's error beside its audio"
        ),
        how=(
            "wrap the method: take the `token2wav_error` messages off the model runner's output, finish those "
            "requests with `FINISHED_ERROR` and queue an `OmniEngineCoreOutput(finish_reason=ERROR)` on "
            "`_pending_input_timeout_outputs`, which upstream's `_attach_finished_request_sets` drains into the "
            "step's outputs; refuses to install when upstream no longer declares or drains that attribute; also "
            "takes the stage's published cost model (`token2wav_cost`) and its streams' new audio seconds "
            "(`token2wav_audio_s`) off the output and keeps them on the scheduler for "
            "`worker.patch_latency_planning`"
        ),
        upstream=(
            "none filed: the error-finish path exists only for input timeouts "
            "(`OmniSchedulerMixin._finish_input_timeout_requests`); the fix upstream would be a per-request "
            "error field in the model runner output"
        ),
        remove_when=(
            "vLLM-Omni lets a generation model runner fail one request (a per-request error in its output) "
            "without killing the engine core"
        ),
        written_against=VLLM_OMNI_0_30,
        group="worker",
    ),
    PatchEntry(
        module="worker.patch_latency_planning",
        target="vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler.schedule",
        why=(
            "vLLM-Omni admits waiting whole (non-streamed) requests up to `max_num_seqs` per step and finishes "
            "them all at its end; where an extra row costs nearly a request alone (a CPU) the first request "
            "waits for the whole batch (c=8: median TTFP 2x upstream's one at a time); only the scheduler can "
            "choose how many run (a request the stage skipped would finish with no audio)"
        ),
        how=(
            "wrap the method: where our stage published a cost model (`token2wav_stage/cost_model.py`, kept by "
            "`worker.patch_generation_scheduler`), no async chunk moves and no queued request carries stream "
            "meta, lower `max_num_running_reqs` for this call to the running requests plus "
            "`whole_rows_to_admit` (arrival order; one more row while it does not raise the batch's summed "
            "completion time) and restore it; with more requests waiting than free slots, refill the waiting "
            "stream chunks' places in order of when their listeners' audio runs out (`token2wav_stage/"
            "playback.py`); counts its decisions next to the stage stats (`planner_stats.py`); off with "
            "`additional_config: token2wav_latency_planning: false`; refuses to install when `schedule` no longer "
            "reads `max_num_running_reqs`"
        ),
        upstream=(
            "none filed: vLLM-Omni's generation scheduler has no per-step admission hook or cost model; the fix "
            "upstream would be a pluggable admission policy for one-shot generation requests"
        ),
        remove_when=(
            "vLLM-Omni schedules one-shot generation requests by predicted completion time, or lets a stage "
            "plug in its admission policy"
        ),
        written_against=VLLM_OMNI_0_30,
        group="worker",
    ),
    PatchEntry(
        module="worker.patch_cuda_graph_wrapper",
        target="vllm.compilation.cuda_graph.CUDAGraphWrapper.__call__",
        why=(
            "after the capture window a descriptor that was never captured reaches the stock capture path and "
            "raises 'CUDA graph capturing detected at an inappropriate time', fatal for the engine"
        ),
        how=(
            "replace `__call__` with the guard of `platforms/graph_capture_guard.py`: such a step runs the "
            "runnable eager (counted, warned once); capture-window and captured steps take the stock call; "
            "installed only where the platform object says CUDA"
        ),
        upstream=(
            "none filed: vLLM treats a capture after startup as a bug of the caller; our stage's shapes can "
            "reach an uncaptured descriptor that vLLM cannot predict"
        ),
        remove_when=(
            "vLLM runs an uncaptured descriptor eager after the capture window instead of raising, or our "
            "stages capture every descriptor they can reach"
        ),
        written_against=VLLM_OMNI_0_30,
        group="worker",
    ),
    PatchEntry(
        module="worker.patch_acl_graph_wrapper",
        target="vllm_ascend.compilation.acl_graph.ACLGraphWrapper.__call__",
        why=(
            "an earlier static-shape patch bypassed the stock call, so piecewise graphs were never captured and "
            "every decode step ran eager while the runner reported PIECEWISE; a step that reaches capture "
            "after the window must not fail"
        ),
        how=(
            "the same guard as on CUDA (`concrete_aclgraph_entries`, `aclgraph`), plus per-capacity entries "
            "for static-shape decode; installed where `vllm_ascend.compilation.acl_graph` imports"
        ),
        upstream="none filed: the same reason as the CUDA guard; vLLM-Ascend follows vLLM's wrapper",
        remove_when="as the CUDA guard, for vLLM-Ascend's wrapper",
        written_against=(
            f"{VLLM_OMNI_0_30}; vLLM-Ascend: version not recorded (not installed here; tested against fakes "
            "of the wrapper's control flow, the hardware test has not run)"
        ),
        group="worker",
    ),
    PatchEntry(
        module="worker.patch_async_chunk_sender",
        target="vllm_omni.distributed.omni_connectors.model_runner.omni_connector_runtime._should_create_payload_connector",
        why=(
            "with `async_chunk`, a sender stage's model runner (`omni_connector_runtime.py:186`, gate :54) and its "
            "scheduler's chunk adapter (`chunk_transfer_adapter.py:174`) each build a connector for the same "
            "edge; the runner's is never used for chunks (the adapter sends them), and a "
            "`MooncakeTransferEngineConnector` sender binds its ZMQ port, so the second one fails with "
            "`ZMQError: Address already in use` (`mooncake_transfer_engine_connector.py:243`) and the engine "
            "does not start"
        ),
        how=(
            "replace the module function with a wrapper: False for a sender stage with `async_chunk` whose edge "
            "is a `MooncakeTransferEngineConnector` (the chunk adapter owns that edge), the stock answer "
            "otherwise; installed only for vLLM-Omni 0.30.x and only where `mooncake` imports"
        ),
        upstream=(
            "none filed: the fix upstream would be one owner per edge (the runner skips its payload connector "
            "when the scheduler's chunk adapter sends), or connectors that share one listener per port"
        ),
        remove_when=(
            "vLLM-Omni builds one sender per async-chunk edge (a stage with `async_chunk` and a Mooncake TE edge "
            "starts without this patch); the version gate drops it outside 0.30.x"
        ),
        written_against=VLLM_OMNI_0_30,
        group="worker",
    ),
    PatchEntry(
        module="worker.patch_mooncake_connectors",
        target=(
            "vllm_omni.distributed.omni_connectors.connectors.mooncake_transfer_engine_connector"
            ".MooncakeTransferEngineConnector.__init__ (and MooncakeStoreConnector.__init__)"
        ),
        why=(
            "the chunk adapter reads `connector.stage_id` (`chunk_transfer_adapter.py:327,496,774`), which the "
            "Mooncake connectors never set (SharedMemory, Nixl and Mori do; it arrives as `extra['stage_id']`): "
            "the first chunk raises AttributeError; and `memory_pool_device: cpu` (the default) pins the pool "
            "(`mooncake_transfer_engine_connector.py:204`), which raises 'Cannot access accelerator device' on a "
            "host without an accelerator"
        ),
        how=(
            "wrap `__init__`: where no accelerator is present, a pool device `cpu` becomes `cpu:0` (plain host "
            "memory, the same bytes; one info log) before the stock call; after it, `stage_id` is set from the "
            "config's `stage_id` where the stock one left none; installed only for vLLM-Omni 0.30.x and only "
            "where `mooncake` imports"
        ),
        upstream=(
            "none filed: the fix upstream would be `self.stage_id = config.get('stage_id')` in both connectors "
            "(as the others have) and pinning only where an accelerator is present"
        ),
        remove_when=(
            "both Mooncake connectors set `stage_id` and the TE connector allocates an unpinned pool without an "
            "accelerator; the version gate drops it outside 0.30.x"
        ),
        written_against=VLLM_OMNI_0_30,
        group="worker",
    ),
)

_COLUMNS: Final = (
    ("module", "patch module (`vllm_omni_token2wav/patch/`)"),
    ("target", "patched upstream object"),
    ("why", "why"),
    ("how", "how"),
    ("upstream", "upstream issue / PR"),
    ("remove_when", "remove when"),
    ("written_against", "written against"),
)


def entry(module: str) -> PatchEntry:
    """The row of `module` (`"worker.patch_generation_scheduler"`, or the full dotted module name)."""
    short = module.removeprefix("vllm_omni_token2wav.patch.")
    for row in PATCHES:
        if row.module == short:
            return row
    raise KeyError(f"no row for patch module {module!r} in vllm_omni_token2wav/patch/register.py:PATCHES")


def _cell(row: PatchEntry, field: str) -> str:
    value = getattr(row, field)
    if field in ("module", "target"):
        value = f"`{value}`"
    return value.replace("|", "\\|")


def render_table() -> str:
    """`PATCHES` as the Markdown table of docs/design/patches.md (one line per patch)."""
    lines = [
        "| " + " | ".join(title for _, title in _COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
    ]
    lines += ["| " + " | ".join(_cell(row, field) for field, _ in _COLUMNS) + " |" for row in PATCHES]
    return "\n".join(lines)
