# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav stage as vLLM-Omni's runner drives it: one `nn.Module` per family over the shared engine.

This framework knows no family and no model: a family's stage class names its `FamilySpec` and
builds its core and backend (`_build_core`, `_build_backend`). `MiniCPMO45Code2Wav` and
`StepAudio2Token2WavForConditionalGeneration` do it through `token2wav_core.stage.CoreStageModel` (the
shared flow + HiFT core), `CosyVoice3Code2Wav` with its own. The runner:

1. builds the model as `Cls(*, vllm_config, prefix="")` under a bf16/fp16 default dtype
   (`options.py` lists every config attribute read). Construction opens no model file: it checks
   the token2wav folder, finds the family's default voice (a clear error if there is none), and
   installs the speaker backend `token2wav_spk_backend` asks for (auto: on the device on NPU and
   CUDA, onnxruntime on CPU; `speaker_embedding.selection.stage_backend_request`);
2. calls `load_weights(weights)`: the token2wav assets are not in the LLM checkpoint, so the
   iterable is drained and the flow, HiFT, speech tokenizer and speaker path are built from the
   folder (fp32 by explicit dtype). With `load_format=dummy` the runner skips this and the first
   real step builds them;
3. calls `forward(input_ids, positions, intermediate_tensors, inputs_embeds,
   runtime_additional_information=[...], seq_token_counts=[...], request_ids=[...])` once per
   scheduler step: the idle-stream sweep (`store.StreamStore.sweep`, on every call: profiling and
   placeholder-only steps return before the engine runs, and abandoned streams must not wait for
   real work to be freed) -> `contract.parse_step` -> `Token2WavStepExecutor.step` -> `contract.build_output`;
   a step of whole utterances only is timed into the cost model the output then carries to the scheduler
   (`cost_model.py`; off with `additional_config: token2wav_latency_planning: false`), and a step with
   stream chunks carries each chunk's new audio seconds for the scheduler's due order (`playback.py`);
4. calls `on_requests_finished(ids)` to free streams.

With `VLLM_OMNI_TOKEN2WAV_STAGE_STATS=<path>` the model writes its cumulative counters there after
every `forward` and `on_requests_finished` (`stats.py`; engine tests read the worker through it).

Class flags the runner reads, the same for both families (the engine routes state by request id,
so both need what vLLM-Omni 0.30 sets only for MiniCPM-o): `have_multimodal_outputs` (audio is in
`multimodal_outputs`), `enable_update_additional_information` (pass the producer's dicts every step),
`requires_raw_input_tokens` and `requires_exact_input_shape` (the codec ids as sent, unpadded),
`requires_request_ids` (`kwargs["request_ids"]`), `replace_runtime_additional_information` (each
step's dict is that step's chunk, not merged with earlier ones). `embed_input_ids` and
`compute_logits` exist because vLLM's generate runner requires them of every model; there are
no logits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.output_templates import omni_output_class
from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import (
    BackendRequest,
    stage_backend_request,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import Token2WavBackend
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import (
    OUTPUT_SAMPLE_RATE,
    Segment,
    SegmentKind,
    SegmentResult,
    build_output,
    parse_step,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import (
    COST_KEY,
    CostEstimator,
    latency_planning_enabled,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import (
    FamilySpec,
    find_default_voice,
    resolve_token2wav_dir,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.memory_budget import (
    TOKENS_PER_SECOND,
    resolve_memory_budget,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.model_source import (
    ModelSource,
    hub_patterns,
    resolve_model_source,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import StageOptions, stage_options
from vllm_omni_token2wav.model_executor.models.token2wav_stage.playback import PLAYBACK_KEY, step_audio_seconds
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stats import StageStats, StatsWriter
from vllm_omni_token2wav.model_executor.models.token2wav_stage.step_executor import (
    StepExecutorConfig,
    Token2WavStepExecutor,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.store import StreamStore
from vllm_omni_token2wav.platforms.interface import DevicePlatform

logger = init_logger(__name__)


@runtime_checkable
class StageCore(Protocol):
    """What the stage asks of a family's Token2Wav core (the facade over the asset folder).

    Every family's core provides it through the one facade base, `token2wav_core.facade.Token2WavFacade`
    (`Token2WavCore` for Step-Audio2 and MiniCPM-o, `CosyVoice3Token2Wav`): the asset check at
    construction, the speaker backend the stage's option asks for, whether the models are built (the
    stage builds them late when the runner skipped `load_weights`), and the lifecycle the families'
    backends drive (`load_models`, `device`). A backend (`_build_backend`) also uses its own core's
    richer API (flows, vocoders, stream set-up); this framework never does.
    """

    @property
    def device(self) -> torch.device: ...

    @property
    def models_loaded(self) -> bool: ...

    @property
    def spk_backend(self) -> str: ...

    def check_assets(self) -> list[Path]: ...

    def load_models(self) -> None: ...

    def enable_spk_embedding(self, request: BackendRequest) -> str: ...


class Token2WavStageModel(nn.Module):
    """A Token2Wav stage model with the engine's contract (see the module docstring)."""

    family: ClassVar[FamilySpec]
    token2wav: StageCore

    input_modalities = "audio"
    have_multimodal_outputs = True
    enable_update_additional_information = True
    requires_raw_input_tokens = True
    requires_request_ids = True
    requires_exact_input_shape = True
    replace_runtime_additional_information = True
    has_preprocess = False
    has_postprocess = False

    def __init__(self, *, vllm_config: Any = None, prefix: str = "", **overrides: Any) -> None:
        super().__init__()
        from vllm_omni_token2wav import platforms

        self.prefix = prefix
        self.options: StageOptions = stage_options(vllm_config, overrides, family=self.family.name)
        opts = self.options
        #: The model's files on disk (a hub repo id's snapshot, `model_source.py`); None: only token2wav_path.
        self.model_source: ModelSource | None = None
        if opts.token2wav_path is not None:
            folder = Path(opts.token2wav_path)
            if opts.model is not None and Path(opts.model).is_dir():
                self.model_source = ModelSource(str(opts.model), Path(opts.model))
        elif opts.model is not None:
            self.model_source = resolve_model_source(
                opts.model, revision=opts.revision, allow_patterns=hub_patterns(self.family.hub_download_files)
            )
            source = self.model_source
            folder = resolve_token2wav_dir(source.folder, self.family.asset_markers, source=source.describe())
        else:
            raise ValueError(
                f"{type(self).__name__} needs vllm_config.model_config.model (the model folder), "
                "hf_config.token2wav_path, or the option token2wav_path="
            )
        self.token2wav = self._build_core(folder, opts)
        self.token2wav.check_assets()
        self.default_voice: Any = self._default_voice(opts, folder)
        self._install_speaker_backend(opts, platforms.current_omni_platform)
        self.backend = self._build_backend(opts)
        # no count bound in the store (it would evict live streams): `max_streams` is an admission limit
        self.streams = StreamStore(max_streams=None, idle_timeout_s=opts.idle_timeout_s)
        self._stats = StatsWriter(self.family.name)
        #: The measured cost of whole-utterance steps, published to the scheduler (`cost_model.py`); None: off.
        planning = latency_planning_enabled(getattr(vllm_config, "additional_config", None))
        self.costs: CostEstimator | None = CostEstimator() if planning else None
        #: Whole-utterance steps left to run before measuring: the first carries one-time costs (thread pools, the
        #: speaker session, first allocations) and measured 2-row steps faster than it, a negative cost per row.
        self._cost_warmup_steps = 1
        self.executor = Token2WavStepExecutor(
            self.backend,
            self.streams,
            self.default_voice,
            StepExecutorConfig(
                max_rows=opts.max_rows,
                pad_to_buckets=opts.pad_to_buckets,
                seed=opts.seed,
                reference_seconds=opts.reference_seconds,
                load_voice=self._voice_loader(),
                memory_budget=resolve_memory_budget(
                    opts.memory_budget, self.backend.device, platforms.current_omni_platform
                ),
                reserve_tokens=round(opts.reserve_seconds * TOKENS_PER_SECOND),
                max_streams=opts.stream_limit,
            ),
        )

    def _install_speaker_backend(self, opts: StageOptions, platform: DevicePlatform) -> None:
        """The speaker backend `token2wav_spk_backend` asks for on this platform (`stage_backend_request`).

        Nothing is installed for the onnxruntime fallback: the core starts with it and builds its session
        on the first call. A device backend that cannot be built fails the stage start (asked for, so
        never hidden behind the host session).
        """
        request = stage_backend_request(opts.spk_backend, platform)
        if request == "fallback":
            logger.info(
                "%s: speaker embedding via onnxruntime on the host (token2wav_spk_backend=%s, platform %r)",
                type(self).__name__,
                opts.spk_backend,
                platform,
            )
            return
        name = self.token2wav.enable_spk_embedding(request)
        logger.info(
            "%s: speaker embedding on the device via %s (token2wav_spk_backend=%s)",
            type(self).__name__,
            name,
            opts.spk_backend,
        )

    # ---- what a family's subclass provides or may replace ----------------------------------------

    def _build_core(self, folder: Path, opts: StageOptions) -> StageCore:
        """The family's Token2Wav core over the asset folder (models stay unloaded until `load_weights`)."""
        raise NotImplementedError(
            f"{type(self).__name__} names no Token2Wav core: subclass token2wav_core.stage.CoreStageModel "
            "(the shared flow + HiFT core) or give the family's `_build_core` / `_build_backend`"
        )

    def _build_backend(self, opts: StageOptions) -> Token2WavBackend[Any, Any, Any]:
        """The family's models behind the engine (`backend.Token2WavBackend`), over `self.token2wav`."""
        raise NotImplementedError(f"{type(self).__name__} names no Token2Wav backend (see `_build_core`)")

    def _voice_loader(self) -> Callable[[object, float], object] | None:
        """`StepExecutorConfig.load_voice` (None: the fixed-length 24 kHz normalisation of every reference)."""
        return None

    def check_no_variant(self, opts: StageOptions) -> None:
        """Reject `token2wav_variant` for a family without variants (MiniCPM-o 4.5 has some)."""
        if opts.variant is not None:
            raise ValueError(
                f"{type(self).__name__}: token2wav_variant={opts.variant!r}, but {self.family.name} has no "
                "token2wav variants (MiniCPM-o 4.5 has: minicpmo_4_5/variants.py)"
            )

    def _default_voice(self, opts: StageOptions, folder: Path) -> Any:
        override = opts.prompt_wav
        if override is not None and not isinstance(override, str | Path):
            return override  # bytes or (waveform, rate), given in-process
        return find_default_voice(
            self.family, self.model_folder(folder), folder, None if override is None else str(override)
        )

    def model_folder(self, token2wav_dir: Path) -> Path:
        """Where the default voice is looked up: the model folder (or hub snapshot), else the token2wav folder."""
        return self.model_source.folder if self.model_source is not None else token2wav_dir

    # ---- what the runner calls ------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Build the token2wav models from their folder; the LLM checkpoint's `weights` are drained unused.

        Returns no names: the models are owned by the Token2Wav core, not registered as parameters
        of this module, so vLLM's loaded-weights audit has nothing to check.
        """
        for _ in weights:
            pass
        self._build()
        return set()

    def _build(self) -> None:
        """Build the models (and their graph runners); launches replaying graphs get bucketed shapes."""
        self.backend.ensure_loaded()
        self._plan_for_graphs()

    def _plan_for_graphs(self) -> None:
        pad = self.options.pad_to_buckets or self.backend.graphs_active
        if pad != self.executor.config.pad_to_buckets:
            self.executor.config = replace(self.executor.config, pad_to_buckets=pad)

    def set_device_graphs(self, enabled: bool) -> bool:
        """Switch graph replay of the launches at run time (benchmarks compare both on one stage).

        Off: the plain eager kernels at exact launch shapes (unless `pad_to_buckets`), as a stage built
        with `token2wav_device_graphs=False`. On: replay where this stage built graphs (the option is
        not False) and the platform has a graph API. Returns whether launches now replay graphs.
        """
        self._ensure_loaded()
        self.backend.use_graphs = bool(enabled)
        self._plan_for_graphs()
        return self.backend.graphs_active

    def _ensure_loaded(self) -> None:
        if not self.token2wav.models_loaded:
            logger.info(
                "%s: token2wav models were not built at weight loading (load_format=%s); building them now",
                type(self).__name__,
                self.options.load_format,
            )
            self._build()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        runtime_additional_information: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Any:
        """One scheduler step: the new audio of every segment (see `contract.py` for the input rules)."""
        del positions, intermediate_tensors, inputs_embeds
        stats = self._stats.target()  # None unless VLLM_OMNI_TOKEN2WAV_STAGE_STATS is set (stats.py)
        start, start_cpu = (time.perf_counter(), time.thread_time()) if stats is not None else (0.0, 0.0)
        try:
            self.streams.sweep()  # every call, also profiling and placeholder-only ones: abandoned streams go now
            step = parse_step(
                input_ids, runtime_additional_information, kwargs, self.family, async_chunk=self.options.async_chunk
            )
            ran = not step.profiling and any(s.kind is not SegmentKind.PLACEHOLDER for s in step.segments)
            if not ran:
                results = [SegmentResult(error=s.error) for s in step.segments]
            else:
                self._ensure_loaded()
                results = self._timed_step(step.segments)
        except Exception as exc:
            if stats is not None:
                stats.record_failure(f"{type(exc).__name__}: {exc}", live_streams=len(self.streams))
                self._stats.write()
            raise
        output = build_output(results, step.device, self.family.output_key)
        self._publish_costs(output, len(step.segments))
        self._publish_playback(output, step.segments, results)
        if stats is not None:
            seeds = self.executor.last_seeds if ran else None
            stats.record_step(
                step.segments,
                results,
                profiling=step.profiling,
                live_streams=len(self.streams),
                seeds=seeds,
                seconds=time.perf_counter() - start,
                cpu_seconds=time.thread_time() - start_cpu,
            )
            if ran:
                self._record_memory(stats)
            self._stats.write(force=False)
        return output

    def _timed_step(self, segments: list[Segment]) -> list[SegmentResult]:
        """`executor.step`, timed into `self.costs` when every segment is a whole utterance (`cost_model.py`)."""
        if self.costs is None or any(s.kind is not SegmentKind.WHOLE or s.error for s in segments):
            return self.executor.step(segments)
        from vllm_omni_token2wav import platforms

        start = time.perf_counter()
        results = self.executor.step(segments)
        platforms.current_omni_platform.synchronize(self.token2wav.device)
        seconds = time.perf_counter() - start
        if any(r.error for r in results):
            return results
        if self._cost_warmup_steps > 0:
            self._cost_warmup_steps -= 1
            return results
        self.costs.record(len(segments), sum(len(s.tokens) for s in segments), seconds)
        return results

    def _publish_costs(self, output: Any, count: int) -> None:
        """The cost model on the step's first segment, empty tensors on the others (the scheduler reads it)."""
        model = self.costs.model() if self.costs is not None else None
        if model is None or count == 0:
            return
        empty = torch.empty(0, dtype=torch.float64)
        output.multimodal_outputs[COST_KEY] = [model.encode()] + [empty] * (count - 1)

    def _publish_playback(self, output: Any, segments: list[Segment], results: list[SegmentResult]) -> None:
        """Each stream chunk's new audio seconds (`playback.py`), for the scheduler's due order; with planning on."""
        if self.costs is None or not any(s.kind is SegmentKind.CHUNK for s in segments):
            return
        samples = [
            (0 if r.audio is None else int(r.audio.numel()))
            if s.kind is SegmentKind.CHUNK and r.error is None
            else None
            for s, r in zip(segments, results, strict=True)
        ]
        output.multimodal_outputs[PLAYBACK_KEY] = step_audio_seconds(samples, OUTPUT_SAMPLE_RATE)

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        """Free the streams of finished requests (their state, their ended-stream records)."""
        freed = self.executor.finish([str(r) for r in finished_req_ids])
        stats = self._stats.target()
        if stats is not None:
            stats.record_finished(freed, live_streams=len(self.streams))
            self._record_memory(stats)
            self._stats.write()

    def _record_memory(self, stats: StageStats) -> None:
        executor = self.executor
        stats.record_memory(executor.memory_snapshot(), waits=executor.budget_waits, refusals=executor.budget_refusals)

    def embed_input_ids(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Codec ids are not embedded by the runner; a `[num_tokens, 1]` float32 zero tensor keeps its shapes."""
        return torch.zeros((input_ids.numel(), 1), device=input_ids.device, dtype=torch.float32)

    def compute_logits(self, hidden_states: Any, sampling_metadata: Any = None) -> None:
        return None

    def make_omni_output(self, model_outputs: Any, **_: Any) -> Any:
        """`model_outputs` as the `OmniOutput` class the runner checks for (`output_templates.omni_output_class`)."""
        cls = omni_output_class()
        if isinstance(model_outputs, cls):
            return model_outputs
        if isinstance(model_outputs, tuple) and len(model_outputs) == len(cls._fields):
            return cls(*model_outputs)  # our NamedTuple (or a plain tuple) of the four fields
        raise TypeError(f"{type(self).__name__} expected an OmniOutput, got {type(model_outputs).__name__}")

    @property
    def spk_backend(self) -> str:
        """The name of the speaker-embedding backend the family's core runs (e.g. `torch-npu:0`)."""
        return self.token2wav.spk_backend

    @property
    def live_streams(self) -> int:
        return len(self.streams)


__all__ = ["Token2WavStageModel"]
