# SPDX-License-Identifier: Apache-2.0
"""Real-time factor of the end-to-end Token2Wav stage, and where its time goes.

The stage is served two ways (a whole utterance at once, or 25-token chunks as the LLM emits
them) and each request pays for its reference voice first. An operator sizing a deployment needs
to know, on the host at hand: how many seconds of audio one second of compute buys (RTF), how long
a listener waits for the first audio of a stream, which component dominates (prompt preparation,
flow model, HiFT vocoder), and what the speaker-embedding path and the prompt cache change. This
module measures all of it through the public `StepAudio2Token2WavCore` API on a token2wav
directory (by default the deterministic full-size stand-in: the shipped geometry with random
weights, so the costs are real and the audio is noise).

What one run measures (seeded random speech tokens, the shipped real speech clip as the voice):

| mode     | timed calls                                                          | new voice each run       |
|----------|----------------------------------------------------------------------|--------------------------|
| `whole`  | `core(tokens, prompt)`                                               | prompt cache cleared     |
| `stream` | `core.set_stream_cache(prompt)`, then `core.stream(chunk, ...)` per  | prompt cache cleared,    |
|          | `stream_chunks(tokens)` chunk (25 tokens + 3 lookahead)              | no flow-setup cache      |

Per-component split: while a run is timed, the core's `prepare_prompt`, the flow model's
`setup_cache` / `inference` / `inference_chunk`, the HiFT module's forward and the streaming
launches (`flow_chunks`, `vocode_chunks`) are wrapped by a clock that synchronises the platform
before and after each call (`_ComponentClock`); the wrappers are removed when the run ends.
`other` is the rest of the run (token checks, cross-fade, copies).
The split shown is that of the median run (by total), so its parts add up to its total.

Prompt preparation (`prepare_prompt(prompt, with_tokens=True)`: decode, resample, fbank, speaker
embedding, speech tokens, 24 kHz mel) is timed separately per speaker path:

| case     | speaker embedding                                                                    |
|----------|--------------------------------------------------------------------------------------|
| `ort`    | the onnxruntime CPU fallback (upstream behaviour), cache cleared before each call     |
| `device` | the device path: `enable_device_spk_embedding()`; where the recorded CPU policy keeps |
|          | onnxruntime, the torch CAM++ on the device is installed explicitly so a device path is |
|          | measured at all (the row says which backend ran)                                      |
| `cached` | a prompt-cache hit (digest + lookup + copy), what every repeated voice pays            |

Derived columns: RTF = total / audio seconds; "RTF after setup" leaves out what a known voice does
not pay again (whole: `prepare_prompt`; stream: `set_stream_cache`); "1st audio" is when a listener
hears the first sample of a new voice (stream: setup + first chunk; whole: the whole call).

The report object is filled while the run progresses, so an interrupted run still has what was
measured; `vllm_omni_token2wav.benchmarks.token2wav.report` renders it (table, JSON, PNG).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import torch

from vllm_omni_token2wav.benchmarks.common import (
    resolve_device,
    run_environment,
    stamp_load_at_end,
    synced_seconds,
    token2wav_model_dir,
    torch_threads,
)
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)
_T = TypeVar("_T")

SCHEMA: Final = "vllm-omni/bench-token2wav/1"
TOKENS_PER_SECOND: Final = 25
SAMPLES_PER_TOKEN: Final = 2 * 480  # 2 mel frames per token, 480 samples per frame
OUTPUT_RATE: Final = 24_000
SPEECH_VOCAB: Final = 6561
COMPONENTS: Final = ("prompt", "flow_setup", "flow", "vocoder", "other")
PROMPT_CASES: Final = ("ort", "device", "cached")
# The streaming caches hold at most ~16.9 s of prompt (844 mel frames, see token2wav_synthesis.md).
MAX_PROMPT_SECONDS: Final = 16.0
MIN_PROMPT_SECONDS: Final = 0.5


@dataclass(frozen=True)
class Plan:
    """Sizes of a run that depend on the device class: the issue's on an accelerator, smaller on CPU."""

    gen_seconds: float
    prompt_seconds: float
    n_timesteps: int
    runs: int
    warmup: int
    prompt_calls: int


# The benchmark (10 s of tokens, 10 Euler steps). On a CPU the full-size flow runs at RTF ~5-10
# (docs/design/token2wav_synthesis.md), so the CPU default keeps a run to minutes: 2 s, 5 steps.
ACCELERATOR_PLAN: Final = Plan(gen_seconds=10.0, prompt_seconds=3.0, n_timesteps=10, runs=5, warmup=1, prompt_calls=20)
CPU_PLAN: Final = Plan(gen_seconds=2.0, prompt_seconds=3.0, n_timesteps=5, runs=3, warmup=1, prompt_calls=10)
FAST_PLAN: Final = Plan(gen_seconds=1.2, prompt_seconds=1.0, n_timesteps=2, runs=1, warmup=0, prompt_calls=3)


def default_plan(device_type: str, *, fast: bool = False) -> Plan:
    if fast:
        return FAST_PLAN
    return CPU_PLAN if device_type == "cpu" else ACCELERATOR_PLAN


@dataclass(frozen=True)
class BenchConfig:
    """What to measure. The CLI fills it (plan defaults resolved); `validate()` checks what the run relies on."""

    model_dir: Path | None = None  # None: the deterministic stand-in (full size unless `reduced`)
    reduced: bool = False
    device: str = "auto"
    gen_seconds: float = CPU_PLAN.gen_seconds
    prompt_seconds: float = CPU_PLAN.prompt_seconds
    n_timesteps: int = CPU_PLAN.n_timesteps
    runs: int = CPU_PLAN.runs
    warmup: int = CPU_PLAN.warmup
    prompt_calls: int = CPU_PLAN.prompt_calls
    threads: int = 2
    seed: int = 0
    plan: str = "cpu"  # which default plan the unspecified sizes came from: cpu, accelerator, fast, explicit

    def validate(self) -> None:
        if self.model_dir is not None and self.reduced:
            raise ValueError("reduced selects the stand-in; it cannot be combined with a model_dir")
        if not math.isfinite(self.gen_seconds) or round(self.gen_seconds * TOKENS_PER_SECOND) < 1:
            raise ValueError(f"gen_seconds must give at least one 25 Hz token, got {self.gen_seconds}")
        if not MIN_PROMPT_SECONDS <= self.prompt_seconds <= MAX_PROMPT_SECONDS:
            raise ValueError(
                f"prompt_seconds must be in [{MIN_PROMPT_SECONDS}, {MAX_PROMPT_SECONDS}] (the streaming caches "
                f"hold at most ~16.9 s of prompt), got {self.prompt_seconds}"
            )
        for name, low in (("n_timesteps", 1), ("runs", 1), ("warmup", 0), ("prompt_calls", 1), ("threads", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    @property
    def gen_tokens(self) -> int:
        return round(self.gen_seconds * TOKENS_PER_SECOND)

    @property
    def audio_seconds(self) -> float:
        return self.gen_tokens * SAMPLES_PER_TOKEN / OUTPUT_RATE


class BenchSetupError(Exception):
    """An input of the run (token2wav directory, device) cannot be used; the message says which and why."""


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


@dataclass
class PromptCase:
    """`prepare_prompt(prompt, with_tokens=True)` of one speaker path (milliseconds)."""

    case: str
    backend: str
    calls_ms: list[float]
    note: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.calls_ms)

    @property
    def p90_ms(self) -> float:
        ordered = sorted(self.calls_ms)
        return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


@dataclass
class SynthesisRun:
    """One timed request: its wall time, the component split, and (stream) setup and per-chunk times."""

    total_s: float
    components_s: dict[str, float]
    samples: int
    setup_s: float | None = None
    chunks_s: list[float] | None = None
    #: stream: per chunk, the seconds its `stream()` call spent in each instrumented component
    chunk_components_s: list[dict[str, float]] | None = None


@dataclass
class ModeResult:
    """The runs of one mode (`whole` or `stream`) and the medians the table shows."""

    mode: str
    audio_seconds: float
    runs: list[SynthesisRun] = field(default_factory=list)

    def median_run(self) -> SynthesisRun:
        ordered = sorted(self.runs, key=lambda r: r.total_s)
        return ordered[(len(ordered) - 1) // 2]

    def summary(self) -> dict[str, Any]:
        totals = [r.total_s for r in self.runs]
        setups = [r.total_s - (r.setup_s if r.setup_s is not None else r.components_s["prompt"]) for r in self.runs]
        out: dict[str, Any] = {
            "median_total_s": statistics.median(totals),
            "rtf": statistics.median(totals) / self.audio_seconds,
            "rtf_after_setup": statistics.median(setups) / self.audio_seconds,
            "median_first_audio_s": statistics.median(totals),
            "median_setup_s": None,
            "median_first_chunk_s": None,
            "median_chunks_s": None,
            "split_of_median_run_s": dict(self.median_run().components_s),
        }
        streamed = [(r.setup_s, r.chunks_s) for r in self.runs if r.setup_s is not None and r.chunks_s]
        if self.mode == "stream" and streamed:
            out["median_setup_s"] = statistics.median(setup for setup, _ in streamed)
            out["median_first_chunk_s"] = statistics.median(chunks[0] for _, chunks in streamed)
            out["median_first_audio_s"] = statistics.median(setup + chunks[0] for setup, chunks in streamed)
            count = min(len(chunks) for _, chunks in streamed)
            out["median_chunks_s"] = [statistics.median(chunks[i] for _, chunks in streamed) for i in range(count)]
        return out


@dataclass
class BenchReport:
    """Everything one run produced; `to_dict()` is the JSON document."""

    config: dict[str, Any]
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)
    load_s: float | None = None
    prompt_cases: list[PromptCase] = field(default_factory=list)
    modes: list[ModeResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    complete: bool = False

    def mode(self, name: str) -> ModeResult | None:
        return next((m for m in self.modes if m.mode == name), None)

    def prompt_case(self, name: str) -> PromptCase | None:
        return next((c for c in self.prompt_cases if c.case == name), None)

    def to_dict(self) -> dict[str, Any]:
        ort = self.prompt_case("ort")
        cases = []
        for c in self.prompt_cases:
            cases.append(
                {
                    "case": c.case,
                    "backend": c.backend,
                    "median_ms": c.median_ms,
                    "p90_ms": c.p90_ms,
                    "calls": len(c.calls_ms),
                    "ratio_vs_ort": c.median_ms / ort.median_ms if ort is not None else None,
                    "note": c.note,
                    "calls_ms": c.calls_ms,
                }
            )
        modes = []
        for m in self.modes:
            if not m.runs:
                continue
            modes.append(
                {
                    "mode": m.mode,
                    "audio_seconds": m.audio_seconds,
                    **m.summary(),
                    "runs": [asdict(r) for r in m.runs],
                }
            )
        return {
            "schema": SCHEMA,
            "benchmark": "token2wav_rtf",
            "complete": self.complete,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "weights": self.weights,
            "backends": self.backends,
            "load_s": self.load_s,
            "components": list(COMPONENTS),
            "prompt_prep": cases,
            "synthesis": modes,
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


class _ComponentClock:
    """Attribute a request's wall time to the stage's components while it runs through the public API.

    Wraps, only inside `with`, the calls the stage composes (see `token2wav_core/synthesis.py`): on the
    instances, the core's `prepare_prompt`, the flow's `setup_cache`, `inference`, `inference_chunk`,
    and HiFT's forward (module hooks); the streaming flow launch `flow_chunks` where
    `token2wav_core/synthesis.py:stream_chunk` looks it up, and the core's stream vocoder's `vocode` (a
    streaming vocoder launch runs HiFT through `vocode_rows`, not its forward; a HiFT forward inside it
    is not counted twice). Each
    wrapped call is bracketed by `synchronize()`, so asynchronous device work is billed to the
    component that queued it.
    """

    _METHODS: Final = (
        ("core", "prepare_prompt", "prompt"),
        ("flow", "setup_cache", "flow_setup"),
        ("flow", "inference", "flow"),
        ("flow", "inference_chunk", "flow"),
    )

    def __init__(self, core: Any, sync: Callable[[], None]) -> None:
        self._objects = {"core": core, "flow": core.flow}
        self._stream_vocoder = core.stream_vocoder
        self._hift = core.hift
        self._sync = sync
        self.seconds: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)
        self._hooks: list[Any] = []
        self._vocoder_start: float | None = None
        self._flow_chunks: Callable[..., Any] | None = None
        self._in_vocoder = False

    def reset(self) -> None:
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.seconds[name] += time.perf_counter() - start

        return timed

    def _vocoder_launch(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        timed = self._timed("vocoder", fn)

        def launch(*args: Any, **kwargs: Any) -> Any:
            self._in_vocoder = True
            try:
                return timed(*args, **kwargs)
            finally:
                self._in_vocoder = False

        return launch

    def _vocoder_pre(self, *_: Any) -> None:
        if self._in_vocoder:
            return
        self._sync()
        self._vocoder_start = time.perf_counter()

    def _vocoder_post(self, *_: Any) -> None:
        if self._in_vocoder:
            return
        self._sync()
        if self._vocoder_start is not None:
            self.seconds["vocoder"] += time.perf_counter() - self._vocoder_start
            self._vocoder_start = None

    def __enter__(self) -> _ComponentClock:
        from vllm_omni_token2wav.model_executor.models.token2wav_core import synthesis as token2wav_synthesis

        for owner, attr, name in self._METHODS:
            obj = self._objects[owner]
            setattr(obj, attr, self._timed(name, getattr(obj, attr)))
        self._flow_chunks = token2wav_synthesis.flow_chunks
        token2wav_synthesis.flow_chunks = self._timed("flow", self._flow_chunks)
        # An instance attribute shadows the class's `vocode` until __exit__ removes it.
        self._stream_vocoder.vocode = self._vocoder_launch(self._stream_vocoder.vocode)
        self._hooks = [
            self._hift.register_forward_pre_hook(self._vocoder_pre),
            self._hift.register_forward_hook(self._vocoder_post),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        from vllm_omni_token2wav.model_executor.models.token2wav_core import synthesis as token2wav_synthesis

        token2wav_synthesis.flow_chunks = self._flow_chunks
        if "vocode" in vars(self._stream_vocoder):
            del self._stream_vocoder.vocode
        for owner, attr, _ in self._METHODS:
            obj = self._objects[owner]
            if attr in vars(obj):
                delattr(obj, attr)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


def prompt_audio(seconds: float) -> tuple[np.ndarray, int]:
    """The shipped real speech clip cut (or tiled) to `seconds`: the reference voice of every request."""
    from vllm_omni_token2wav.assets.audio import speech_sample

    speech, rate = speech_sample()
    want = int(round(seconds * rate))
    reps = -(-want // speech.shape[0])
    return np.ascontiguousarray(np.tile(speech, reps)[:want], dtype=np.float32), rate


def speech_tokens(count: int, seed: int) -> list[int]:
    """`count` seeded random 25 Hz codes in [0, 6561) (stand-in weights make any ids equally costly)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, SPEECH_VOCAB, (count,), generator=generator).tolist()


def resolve_model_dir(config: BenchConfig, stage: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    """(token2wav directory, description for the report); generates the stand-in on first use."""
    return token2wav_model_dir(
        config.model_dir, reduced=config.reduced, seed=config.seed, stage=stage, error=BenchSetupError
    )


def _config_dict(config: BenchConfig) -> dict[str, Any]:
    out = asdict(config)
    out["model_dir"] = str(config.model_dir) if config.model_dir is not None else None
    out["gen_tokens"] = config.gen_tokens
    out["audio_seconds"] = config.audio_seconds
    return out


class Token2WavBenchmark:
    """One run of the report. `run()` fills `self.report` step by step (so Ctrl-C keeps what was measured)."""

    def __init__(self, config: BenchConfig, stage: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.report = BenchReport(config=_config_dict(config))
        self._stage = stage if stage is not None else (lambda text: logger.info("%s", text))

    def run(self) -> BenchReport:
        with torch_threads(self.config.threads), stamp_load_at_end(lambda: self.report.environment):
            self._run()
        self.report.complete = True
        return self.report

    def _run(self) -> None:
        from vllm_omni_token2wav import platforms
        from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore

        cfg = self.config
        try:
            device = resolve_device(cfg.device)
        except (ValueError, RuntimeError) as exc:
            raise BenchSetupError(f"--device {cfg.device}: {exc}") from exc
        platform = platforms.current_omni_platform

        def sync() -> None:
            platform.synchronize(device)

        self.report.environment = run_environment(device, cfg.threads)
        model_dir, self.report.weights = resolve_model_dir(cfg, self._stage)
        core = StepAudio2Token2WavCore(
            model_dir,
            device=device,
            n_timesteps=cfg.n_timesteps,
            ort_intra_op_threads=cfg.threads,
            stream_setup_cache_size=0,  # every stream run sets its voice up from scratch
            seed=cfg.seed,
        )
        self._stage(f"loading speech tokenizer, flow and HiFT on {device}")
        start = time.perf_counter()
        try:
            core.check_assets()
            core.flow  # noqa: B018 - loads the synthesis models
        except (FileNotFoundError, ValueError, RuntimeError, OSError) as exc:
            raise BenchSetupError(f"token2wav directory {model_dir}: {exc}") from exc
        sync()
        self.report.load_s = time.perf_counter() - start

        serving, ort, device_path, note = self._speaker_backends(core, model_dir, device)
        self.report.backends = {
            "serving_speaker": serving.name,
            "device_speaker": device_path.name,
            "ort_speaker": ort.name,
            "speech_tokenizer": core.speech_tokenizer.name,
            "flow_dtype": core.flow_dtype_name,
        }
        prompt = prompt_audio(cfg.prompt_seconds)
        self._measure_prompt_path(core, prompt, {"ort": ort, "device": device_path, "cached": serving}, note, sync)

        core.install_spk_backend(serving)
        tokens = speech_tokens(cfg.gen_tokens, cfg.seed)
        if cfg.warmup:
            self._stage(f"warm-up ({cfg.warmup}x a 1 s utterance, whole and streaming)")
            short = tokens[: min(len(tokens), TOKENS_PER_SECOND)]
            for _ in range(cfg.warmup):
                core(short, prompt)
                state = core.set_stream_cache(prompt)
                core.stream(short, last_chunk=True, return_waveform=True, state=state)
                sync()
        whole = ModeResult("whole", cfg.audio_seconds)
        stream = ModeResult("stream", cfg.audio_seconds)
        self.report.modes = [whole, stream]
        with _ComponentClock(core, sync) as clock:
            requests = _Requests(core, clock, tokens, prompt, sync)
            for index in range(cfg.runs):
                self._stage(f"run {index + 1}/{cfg.runs}: whole utterance ({cfg.gen_seconds:g} s)")
                whole.runs.append(requests.whole())
                self._stage(f"run {index + 1}/{cfg.runs}: streaming ({cfg.gen_seconds:g} s in 25-token chunks)")
                stream.runs.append(requests.stream())

    def _speaker_backends(self, core: Any, model_dir: Path, device: torch.device) -> tuple[Any, Any, Any, str]:
        """(serving backend, ORT fallback, device path, note on how the device path was chosen)."""
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import (
            select_speaker_embedding_backend,
        )
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import get_campplus_torch

        onnx = core.asset_path(core.assets.speaker_model)
        ort = select_speaker_embedding_backend(
            onnx, device, request="fallback", ort_intra_op_threads=self.config.threads
        )
        self._stage("building the device speaker-embedding path")
        core.enable_device_spk_embedding()
        serving = core.spk_model
        if serving.name.startswith("onnxruntime"):
            device_path = get_campplus_torch(onnx, device, seg_pool_mode=core.spk_seg_pool_mode)
            note = (
                f"the {device.type} policy keeps {serving.name} for enable_device_spk_embedding(); "
                f"the torch CAM++ ({device_path.name}) is measured explicitly as the device path"
            )
            self.report.notes.append(note)
            return serving, ort, device_path, note
        return serving, ort, serving, ""

    def _measure_prompt_path(
        self,
        core: Any,
        prompt: tuple[np.ndarray, int],
        backends: dict[str, Any],
        device_note: str,
        sync: Callable[[], None],
    ) -> None:
        calls = self.config.prompt_calls
        self._stage(f"prompt preparation: {calls} calls per speaker path ({', '.join(PROMPT_CASES)})")
        cases = {
            name: PromptCase(name, backends[name].name if name != "cached" else f"hit ({backends[name].name})", [])
            for name in PROMPT_CASES
        }
        cases["device"].note = device_note
        self.report.prompt_cases = list(cases.values())
        for name in ("ort", "device", "cached"):  # first call of each path: sessions, engines, constants
            core.install_spk_backend(backends[name])
            core.clear_prompt_cache()
            core.prepare_prompt(prompt, with_tokens=True)
        # Blocks of calls per path, cycled, so load drift on a shared host reaches every path; one backend
        # install per block (installing is cheap but logs).
        rounds = min(3, calls)
        for round_index in range(rounds):
            per_round = calls // rounds + (1 if round_index < calls % rounds else 0)
            for name in PROMPT_CASES:
                core.install_spk_backend(backends[name])
                if name == "cached":
                    core.prepare_prompt(prompt, with_tokens=True)  # the entry every timed call hits
                for _ in range(per_round):
                    if name != "cached":
                        core.clear_prompt_cache()
                    _, seconds = synced_seconds(sync, core.prepare_prompt, prompt, with_tokens=True)
                    cases[name].calls_ms.append(seconds * 1e3)
        core.clear_prompt_cache()


@dataclass(frozen=True)
class _Requests:
    """The timed requests of a run: the same tokens and voice each time, the voice new to the stage each time."""

    core: Any
    clock: _ComponentClock
    tokens: list[int]
    prompt: tuple[np.ndarray, int]
    sync: Callable[[], None]

    def _new_voice(self) -> None:
        self.core.clear_prompt_cache()
        self.clock.reset()

    def whole(self) -> SynthesisRun:
        self._new_voice()
        audio, total = synced_seconds(self.sync, self.core, self.tokens, self.prompt)
        _check_audio(audio, len(self.tokens), "whole utterance")
        return SynthesisRun(total_s=total, components_s=_split(self.clock.seconds, total), samples=int(audio.shape[-1]))

    def stream(self) -> SynthesisRun:
        from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

        core, clock = self.core, self.clock
        self._new_voice()
        state, setup = synced_seconds(self.sync, core.set_stream_cache, self.prompt)
        chunks_s, pieces, chunk_parts = [], [], []
        for chunk, last in stream_chunks(self.tokens):
            before = dict(clock.seconds)
            piece, seconds = synced_seconds(
                self.sync, core.stream, chunk, last_chunk=last, return_waveform=True, state=state
            )
            pieces.append(piece)
            chunks_s.append(seconds)
            chunk_parts.append(_split({k: clock.seconds[k] - before[k] for k in COMPONENTS}, seconds))
        total = setup + sum(chunks_s)
        audio = torch.cat(pieces, dim=-1)
        _check_audio(audio, len(self.tokens), "streaming")
        return SynthesisRun(
            total_s=total,
            components_s=_split(clock.seconds, total),
            samples=int(audio.shape[-1]),
            setup_s=setup,
            chunks_s=chunks_s,
            chunk_components_s=chunk_parts,
        )


def _split(seconds: dict[str, float], total: float) -> dict[str, float]:
    parts = {name: seconds[name] for name in COMPONENTS if name != "other"}
    parts["other"] = max(total - sum(parts.values()), 0.0)
    return parts


def _check_audio(audio: torch.Tensor, tokens: int, what: str) -> None:
    want = tokens * SAMPLES_PER_TOKEN
    if audio.shape[-1] != want or not bool(torch.isfinite(audio).all()):
        raise RuntimeError(
            f"{what}: got {audio.shape[-1]} samples (finite: {bool(torch.isfinite(audio).all())}), expected {want} "
            "finite samples; the stage is broken, timings would be meaningless"
        )


__all__ = [
    "ACCELERATOR_PLAN",
    "COMPONENTS",
    "CPU_PLAN",
    "FAST_PLAN",
    "PROMPT_CASES",
    "SCHEMA",
    "BenchConfig",
    "BenchReport",
    "BenchSetupError",
    "ModeResult",
    "Plan",
    "PromptCase",
    "SynthesisRun",
    "Token2WavBenchmark",
    "default_plan",
]
