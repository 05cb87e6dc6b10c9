# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's code2wav end to end (DiT flow + causal HiFT): RTF, first audio, and cost per chunk vs index.

Three questions an operator asks of the CosyVoice3 stage on the host at hand, answered in one run
through the same code the stage runs (`CosyVoice3Token2Wav`, `models/cosyvoice3/synthesis.py`):

| part       | what is timed                                                                            |
|------------|------------------------------------------------------------------------------------------|
| `whole`    | `core(tokens, prompt=...)`: flow with full attention + causal HiFT, one call              |
| `stream`   | `set_stream_cache` + `stream(...)` per chunk on upstream's schedule (25 + pad, 50, 100,   |
|            | 100, ... tokens; 3 lookahead): RTF = total / audio, first audio = set-up + first chunk   |
| per chunk  | a long stream with a fixed hop (default 25 tokens = one 50-frame attention chunk after    |
|            | upstream's first hop), chunk by chunk: ours = the cached flow chunk (`measure_chunk_costs`,|
|            | `chunk_costs.py`) + the bounded HiFT push; the baseline at selected                      |
|            | indices = what upstream runs for that chunk: the flow re-run over the whole prefix      |
|            | (`streaming=True, finalize=False`) + the vocoder re-run over all mel so far             |
|            | (`chunk_costs.cumulative_vocode`), right after ours (A/B interleaved)                   |

Ours should stay flat; the baseline grows with the index; the report gives the ratio at chunks 20
and 50 and checks equality (max |diff| of the chunk's mel and audio between the two). Wall and process
CPU time are both recorded (on a busy CPU host CPU time measures the work).

Default: the reduced stand-in (`--full`: the shipped geometry, random weights; `--model-dir`: a real
Fun-CosyVoice3 directory with `default_voice.wav` + `default_voice.tokens`). The prompt is the
directory's default voice cut to `prompt_seconds` (its tokens cut alike). Rendering:
`report.py` beside it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from vllm_omni_token2wav.benchmarks.common import (
    resolve_device,
    run_environment,
    stamp_load_at_end,
    synced_seconds,
    torch_threads,
)
from vllm_omni_token2wav.benchmarks.progress import progress
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.chunk_costs import (
    ChunkCost,
    StreamShape,
    cpu_timed,
    cumulative_vocode,
    measure_chunk_costs,
)

SCHEMA: Final = "vllm-omni/bench-token2wav-cosyvoice3/1"
OUTPUT_RATE: Final = 24_000
SAMPLES_PER_TOKEN: Final = 960
TOKEN_RATE: Final = 25
RATIO_AT: Final = (20, 50)
MODES: Final = ("whole", "stream")
MAX_FRAMES: Final = 15000  # the flow's noise table


class BenchSetupError(ValueError):
    """An input of the run cannot be used (the message says which)."""


@dataclass(frozen=True)
class Plan:
    gen_seconds: float
    prompt_seconds: float
    n_timesteps: int
    runs: int
    warmup: int
    chunks: int
    hop_tokens: int
    baseline_at: tuple[int, ...]


#: Reduced stand-in (any device) and the full size on an accelerator: the issue's sizes.
DEFAULT_PLAN: Final = Plan(10.0, 3.0, 10, 3, 1, 50, 25, (1, 2, 5, 10, 20, 30, 40, 50))
#: Full size on a CPU: one Euler step (every step costs the same, so ratios hold) and 20 chunks keep a
#: run under an hour on a 2-core host.
FULL_CPU_PLAN: Final = Plan(2.0, 3.0, 1, 1, 0, 20, 25, (1, 2, 5, 10, 20))
FAST_PLAN: Final = Plan(1.2, 1.0, 2, 1, 0, 4, 25, (1, 4))


def default_plan(*, full: bool, device_type: str, fast: bool = False) -> Plan:
    if fast:
        return FAST_PLAN
    return FULL_CPU_PLAN if full and device_type == "cpu" else DEFAULT_PLAN


@dataclass(frozen=True)
class BenchConfig:
    model_dir: Path | None = None  # None: the stand-in (reduced unless `full`)
    full: bool = False
    device: str = "auto"
    threads: int = 1
    seed: int = 0
    plan: str = "default"
    gen_seconds: float = DEFAULT_PLAN.gen_seconds
    prompt_seconds: float = DEFAULT_PLAN.prompt_seconds
    n_timesteps: int = DEFAULT_PLAN.n_timesteps
    runs: int = DEFAULT_PLAN.runs
    warmup: int = DEFAULT_PLAN.warmup
    chunks: int = DEFAULT_PLAN.chunks
    hop_tokens: int = DEFAULT_PLAN.hop_tokens
    baseline_at: tuple[int, ...] = DEFAULT_PLAN.baseline_at

    def validate(self) -> None:
        problems = []
        for name, low in (("n_timesteps", 1), ("runs", 1), ("warmup", 0), ("chunks", 1), ("hop_tokens", 1)):
            if getattr(self, name) < low:
                problems.append(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        if round(self.gen_seconds * TOKEN_RATE) < 1:
            problems.append(f"--gen-seconds {self.gen_seconds}: less than one 25 Hz token")
        if not 0.5 <= self.prompt_seconds <= 30.0:
            problems.append(f"--prompt-seconds {self.prompt_seconds}: must be in [0.5, 30] (CosyVoice3's prompt limit)")
        bad = [k for k in self.baseline_at if not 1 <= k <= self.chunks]
        if bad:
            problems.append(f"--baseline-at {bad}: chunk indices run from 1 to --chunks {self.chunks}")
        frames = 2 * (self.prompt_tokens + max(self.curve_tokens, round(self.gen_seconds * TOKEN_RATE)))
        if frames > MAX_FRAMES:
            problems.append(
                f"prompt + generated = {frames} mel frames; the flow's noise table holds {MAX_FRAMES} (300 s): "
                "use fewer --chunks, a smaller --hop-tokens or shorter --gen-seconds / --prompt-seconds"
            )
        if problems:
            raise BenchSetupError("; ".join(problems))

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt_seconds * TOKEN_RATE)

    @property
    def curve(self) -> StreamShape:
        """The cost curve's stream (upstream's first hop, then fixed hops), as the flow-only curve cuts it too."""
        return StreamShape(prompt_tokens=self.prompt_tokens, hop_tokens=self.hop_tokens, chunks=self.chunks)

    @property
    def first_hop(self) -> int:
        return self.curve.first_hop

    @property
    def curve_tokens(self) -> int:
        return self.curve.gen_tokens


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class ModeRuns:
    """Timed runs of one mode: total wall ms, ms to the first audio, chunk count, audio seconds."""

    name: str
    audio_seconds: float = 0.0
    chunks: int = 0
    total_ms: list[float] = field(default_factory=list)
    first_audio_ms: list[float] = field(default_factory=list)

    @property
    def total_median_ms(self) -> float:
        return _median(self.total_ms)

    @property
    def first_audio_median_ms(self) -> float:
        return _median(self.first_audio_ms)

    @property
    def rtf(self) -> float:
        return self.total_median_ms / 1000.0 / self.audio_seconds if self.audio_seconds else float("nan")


@dataclass
class VocoderCost:
    """The vocoder's part of chunk `index`: bounded push (ours) and the cumulative re-run (baseline)."""

    index: int
    ours_ms: list[float] = field(default_factory=list)
    ours_cpu_ms: list[float] = field(default_factory=list)
    baseline_ms: list[float] = field(default_factory=list)
    baseline_cpu_ms: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None


@dataclass
class BenchReport:
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    modes: list[ModeRuns] = field(default_factory=lambda: [ModeRuns(m) for m in MODES])
    flow: list[ChunkCost] = field(default_factory=list)
    vocoder: list[VocoderCost] = field(default_factory=list)
    setup_ms: list[float] = field(default_factory=list)
    peak_abs: float | None = None

    def mode(self, name: str) -> ModeRuns:
        return next(m for m in self.modes if m.name == name)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per chunk index: flow + vocoder medians (wall and CPU), end to end, ratio, equality."""
        out = []
        voc = {v.index: v for v in self.vocoder}
        for f in self.flow:
            v = voc.get(f.index, VocoderCost(f.index))
            ours = f.ours_median_ms + _median(v.ours_ms)
            ours_cpu = _median(f.ours_cpu_ms) + _median(v.ours_cpu_ms)
            base = f.baseline_median_ms + _median(v.baseline_ms) if f.baseline_ms and v.baseline_ms else float("nan")
            base_cpu = (
                _median(f.baseline_cpu_ms) + _median(v.baseline_cpu_ms)
                if f.baseline_cpu_ms and v.baseline_cpu_ms
                else float("nan")
            )
            out.append(
                {
                    "index": f.index,
                    "history_frames": f.history_frames,
                    "frames": f.frames,
                    "flow_ours_ms": f.ours_median_ms,
                    "vocoder_ours_ms": _median(v.ours_ms),
                    "ours_ms": ours,
                    "ours_cpu_ms": ours_cpu,
                    "flow_baseline_ms": f.baseline_median_ms,
                    "vocoder_baseline_ms": _median(v.baseline_ms),
                    "baseline_ms": base,
                    "baseline_cpu_ms": base_cpu,
                    "ratio": base / ours,
                    "cpu_ratio": base_cpu / ours_cpu,
                    "mel_max_abs_diff": f.max_abs_diff,
                    "audio_max_abs_diff": v.max_abs_diff,
                    "cache_mb": f.cache_mb,
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        rows = self.rows()
        out: dict[str, Any] = {}
        for m in self.modes:
            out[f"{m.name}_rtf"] = m.rtf
            out[f"{m.name}_first_audio_ms"] = m.first_audio_median_ms
        by_index = {r["index"]: r for r in rows}
        for k in RATIO_AT:
            row = by_index.get(k)
            out[f"ratio_at_{k}"] = row["ratio"] if row else None
            out[f"cpu_ratio_at_{k}"] = row["cpu_ratio"] if row else None
        measured = [r for r in rows if r["ours_ms"] == r["ours_ms"]]  # not NaN
        if len(measured) >= 2:  # chunk 2 is the reference: chunk 1 also finishes the prompt's last chunk
            out["ours_last_over_chunk2"] = measured[-1]["ours_ms"] / measured[1]["ours_ms"]
            out["ours_cpu_last_over_chunk2"] = measured[-1]["ours_cpu_ms"] / measured[1]["ours_cpu_ms"]
        mel = [r["mel_max_abs_diff"] for r in rows if r["mel_max_abs_diff"] is not None]
        audio = [r["audio_max_abs_diff"] for r in rows if r["audio_max_abs_diff"] is not None]
        out["mel_max_abs_diff"] = max(mel) if mel else None
        out["audio_max_abs_diff"] = max(audio) if audio else None
        out["audio_peak_abs"] = self.peak_abs
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "benchmark": "token2wav_cosyvoice3",
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "weights": self.weights,
            "summary": self.summary(),
            "modes": [
                {
                    **asdict(m),
                    "rtf": m.rtf,
                    "total_median_ms": m.total_median_ms,
                    "first_audio_median_ms": m.first_audio_median_ms,
                }
                for m in self.modes
            ],
            "setup_ms": self.setup_ms,
            "chunks": self.rows(),
        }


class CosyVoice3Benchmark:
    """One run of the report; `run()` fills `self.report` as it goes (Ctrl-C keeps what was measured)."""

    def __init__(self, config: BenchConfig, stage: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.stage = stage or (lambda _text: None)
        self.report = BenchReport(config={**asdict(config), "model_dir": str(config.model_dir or "")})
        self.report.config.update(
            first_hop=config.first_hop, curve_tokens=config.curve_tokens, prompt_tokens=config.prompt_tokens
        )

    def run(self) -> BenchReport:
        with torch_threads(self.config.threads), stamp_load_at_end(lambda: self.report.environment):
            self._run()
        return self.report

    def _core(self, device: torch.device) -> tuple[Any, Any]:
        from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
        from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import read_prompt_tokens, voice_tokens_path
        from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

        cfg = self.config
        if cfg.model_dir is not None:
            directory, kind = cfg.model_dir, "model files"
        else:
            size = "full-size" if cfg.full else "reduced"
            self.stage(f"preparing the {size} stand-in CosyVoice3 directory (generated once, cached)")
            directory = ensure_standin_cosyvoice3_dir(reduced=not cfg.full, seed=cfg.seed)
            kind = f"{size} stand-in (seeded random weights)"
        wav = directory / "default_voice.wav"
        tokens_file = voice_tokens_path(wav)
        if not wav.is_file() or not tokens_file.is_file():
            raise BenchSetupError(f"{directory}: the benchmark's prompt is default_voice.wav + default_voice.tokens")
        try:
            import soundfile

            audio, rate = soundfile.read(str(wav), dtype="float32")
            ids = read_prompt_tokens(tokens_file)
            core = CosyVoice3Token2Wav(directory, device=device, n_timesteps=cfg.n_timesteps, seed=cfg.seed)
            prompt = core.prompt((audio[: int(cfg.prompt_seconds * rate)].copy(), rate), ids[:, : cfg.prompt_tokens])
            flow = core.flow
        except (OSError, ValueError) as exc:
            raise BenchSetupError(f"cannot load CosyVoice3 from {directory}: {exc}") from exc
        c = flow.config
        self.report.weights = {
            "kind": kind,
            "path": str(directory),
            "flow": f"DiT {c.depth} x {c.dim}, {c.heads} heads",
            "hift_base_channels": core.hift.config.base_channels,
            "prompt_tokens": prompt.num_tokens,
            "speaker_backend": core.spk_backend,
        }
        return core, prompt

    def _run(self) -> None:
        from vllm_omni_token2wav import platforms
        from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import upstream_chunks

        cfg = self.config
        try:
            device = resolve_device(cfg.device)
        except ValueError as exc:
            raise BenchSetupError(str(exc)) from exc
        self.report.environment = run_environment(device, cfg.threads)
        core, prompt = self._core(device)
        platform = platforms.current_omni_platform

        def sync() -> None:
            if device.type != "cpu":
                platform.synchronize()

        g = torch.Generator().manual_seed(cfg.seed)
        gen = torch.randint(0, 6561, (1, round(cfg.gen_seconds * TOKEN_RATE)), generator=g)
        curve = torch.randint(0, 6561, (1, cfg.curve_tokens), generator=g).to(device)
        whole, stream = self.report.mode("whole"), self.report.mode("stream")
        whole.audio_seconds = stream.audio_seconds = gen.shape[1] * SAMPLES_PER_TOKEN / OUTPUT_RATE
        schedule = list(upstream_chunks(gen.shape[1], prompt.num_tokens))
        whole.chunks, stream.chunks = 1, len(schedule)

        def run_stream(ids: torch.Tensor, parts: list[tuple[slice, bool]]) -> tuple[float, float]:
            sync()
            start = time.perf_counter()
            state = core.set_stream_cache(prompt=prompt)
            first = None
            for part, last in parts:
                core.stream(ids[0, part], last_chunk=last, return_waveform=True, state=state)
                sync()
                first = first if first is not None else time.perf_counter() - start
            return 1000.0 * (time.perf_counter() - start), 1000.0 * (first or 0.0)

        for i in range(cfg.warmup):  # untimed: CPU kernels are built per shape on their first use
            self.stage(f"warm-up {i + 1}/{cfg.warmup}: the same request, both modes, untimed")
            core(gen, prompt=prompt)
            run_stream(gen, schedule)
        for run in range(cfg.runs):
            self.stage(
                f"run {run + 1}/{cfg.runs}: {cfg.gen_seconds:g} s whole, then streamed in {len(schedule)} chunks"
            )
            _, seconds = synced_seconds(sync, core, gen, prompt=prompt)
            whole.total_ms.append(1000.0 * seconds)
            whole.first_audio_ms.append(1000.0 * seconds)
            total, first = run_stream(gen, schedule)
            stream.total_ms.append(total)
            stream.first_audio_ms.append(first)
        self._curve(core, prompt, curve, sync)

    def _curve(self, core: Any, prompt: Any, tokens: torch.Tensor, sync: Callable[[], None]) -> None:
        """Cost per chunk vs index: the flow part from `measure_chunk_costs`, the vocoder pushed alongside.

        A warm-up pass of a few chunks comes first when `warmup` > 0: CPU convolution kernels are built
        per input shape on first use (~2 s per HiFT chunk shape on the build machine), which would
        otherwise land on the first chunks of the curve.
        """
        cfg = self.config
        hops = [cfg.first_hop] + [cfg.hop_tokens] * (cfg.chunks - 1)
        if cfg.warmup:
            self.stage("warm-up: the first chunks of the cost curve, untimed")
            self._stream_curve(core, prompt, tokens, sync, hops[:4], (1,), [], [], [])
        self.stage(
            f"cost per chunk: {cfg.chunks} chunks of {cfg.hop_tokens} tokens, baseline at {list(cfg.baseline_at)}"
        )
        with progress(total=cfg.chunks, desc="chunks", unit="chunk") as bar:
            self._stream_curve(
                core,
                prompt,
                tokens,
                sync,
                hops,
                cfg.baseline_at,
                self.report.flow,
                self.report.vocoder,
                self.report.setup_ms,
                bar.update,
            )

    def _stream_curve(
        self,
        core: Any,
        prompt: Any,
        tokens: torch.Tensor,
        sync: Callable[[], None],
        hops: list[int],
        baseline_at: tuple[int, ...],
        flow_costs: list[ChunkCost],
        vocoder_costs: list[VocoderCost],
        setup_ms: list[float],
        on_chunk: Callable[[], object] = lambda: None,
    ) -> None:
        streamer, hift = core.streamer, core.hift
        state = streamer.start()
        history: list[torch.Tensor] = []
        emitted = 0

        def on_mel(index: int, mel: torch.Tensor, baseline_mel: torch.Tensor | None) -> None:
            nonlocal state, emitted
            if len(vocoder_costs) < index:
                vocoder_costs.append(VocoderCost(index))
            cost = vocoder_costs[index - 1]
            ((audio, state), seconds), cpu = cpu_timed(synced_seconds, sync, streamer.push, state, mel)
            cost.ours_ms.append(1000.0 * seconds)
            cost.ours_cpu_ms.append(1000.0 * cpu)
            history.append(mel)
            if baseline_mel is not None:
                # upstream re-vocodes the cumulative mel of its chunks; fed ours (equal to the mel diff column),
                # so the audio column checks the vocoder alone: F0's phase integral would amplify a 1e-6 mel
                # difference into the audio
                ((speech, _), seconds), cpu = cpu_timed(
                    synced_seconds, sync, cumulative_vocode, hift, torch.cat(history, dim=-1), emitted, finalize=False
                )
                cost.baseline_ms.append(1000.0 * seconds)
                cost.baseline_cpu_ms.append(1000.0 * cpu)
                if speech.shape[-1] != audio.shape[-1]:
                    raise RuntimeError(
                        f"chunk {index}: bounded and cumulative vocoders emitted {audio.shape[-1]} vs "
                        f"{speech.shape[-1]} samples"
                    )
                diff = (speech - audio).abs().max().item() if audio.numel() else 0.0
                cost.max_abs_diff = max(diff, cost.max_abs_diff or 0.0)
                peak = float(audio.abs().max()) if audio.numel() else 0.0
                self.report.peak_abs = max(self.report.peak_abs or 0.0, peak)
            emitted += int(audio.shape[-1])

        measure_chunk_costs(
            core.flow,
            (prompt.tokens, prompt.mel, prompt.embedding),
            tokens,
            hops,
            n_timesteps=self.config.n_timesteps,
            baseline_at=baseline_at,
            sync=sync,
            report=flow_costs,
            setup_ms=setup_ms,
            on_chunk=on_chunk,
            on_mel=on_mel,
        )


__all__ = [
    "DEFAULT_PLAN",
    "FAST_PLAN",
    "FULL_CPU_PLAN",
    "MODES",
    "RATIO_AT",
    "BenchConfig",
    "BenchReport",
    "BenchSetupError",
    "CosyVoice3Benchmark",
    "Plan",
    "default_plan",
]
