# SPDX-License-Identifier: Apache-2.0
"""How far a reduced-precision flow (fp16, bf16) moves each family's mel and audio from the fp32 flow.

Why: issue 33 makes reduced precision the flow's default on accelerators (`token2wav_dtype: auto`,
`token2wav_stage/precision.py`); the bound it costs must be measured and stated, per family. For each
family's facade on its reduced stand-in (CPU, one intra-op thread), each request (random speech tokens,
seeded; the shipped speech clip, or the stand-in's default voice, as the prompt) runs with the flow in
fp32 and in each reduced dtype, everything else equal (vocoder, speaker path fp32; same noise seed):

- **whole**: the whole utterance in one call: the mel the flow hands the vocoder and the audio;
- **chunk**: the same tokens streamed in the family's chunks (Token2WavCore's `stream_chunks`,
  CosyVoice3's `upstream_chunks`): each chunk's mel and audio against the same chunk of the fp32 run;
  the worst chunk is reported (and the stream's whole audio).

Deviation = max abs difference and relative L2 (`||x - ref|| / ||ref||`) against the fp32 run. The mel
is recorded where every vocoder checks it (`check_mel`), so it is exactly what the vocoder received.
A last table vocodes the fp32 whole mel with the vocoder under autocast (on the device) in each dtype
against the fp32 vocoder: the cost a reduced-precision vocoder would add (why the vocoders stay fp32).

    python -m benchmarks.token2wav_precision
    python -m benchmarks.token2wav_precision --families cosyvoice3 --tokens 60 --n-timesteps 2

Writes out/token2wav_precision.json and .txt (atomically; `--json` elsewhere); prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_omni_token2wav.benchmarks.bench_cli import invoked_command
from vllm_omni_token2wav.benchmarks.common import load_average, publish_json_and_text, run_environment, torch_threads
from vllm_omni_token2wav.model_executor.layers.hift.generator import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift_causal.generator import CausalHiFTGenerator

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PROMPT_SECONDS = 3.0


def deviation(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Max abs and relative L2 of `x` against `ref` (same shape; float64 arithmetic)."""
    if x.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs {tuple(ref.shape)}")
    d = x.double() - ref.double()
    return {"max_abs": float(d.abs().max()), "rel_l2": float(d.norm() / ref.double().norm().clamp_min(1e-30))}


def spectral_deviation(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 of the STFT magnitudes (n_fft 1024, hop 256) of two waveforms: blind to phase.

    The vocoders' sine source integrates F0 over every sample, so a mel difference that moves F0 a little
    shifts the phase of the whole rest of the waveform: sample-wise differences then say little about what
    is heard, and this magnitude distance does.
    """
    window = torch.hann_window(1024, dtype=torch.float64)

    def magnitude(w: torch.Tensor) -> torch.Tensor:
        return torch.stft(w.double().reshape(1, -1), 1024, 256, window=window, return_complex=True).abs()

    m, r = magnitude(x), magnitude(ref)
    return float((m - r).norm() / r.norm().clamp_min(1e-30))


def worst(devs: list[dict[str, float]]) -> dict[str, float]:
    """The worst of several deviations, metric by metric."""
    return {k: max(d[k] for d in devs) for k in ("max_abs", "rel_l2")}


@contextlib.contextmanager
def recorded_mels() -> Iterator[list[torch.Tensor]]:
    """Every mel a vocoder checks while the block runs (HiFT and causal HiFT `check_mel`), copied."""
    seen: list[torch.Tensor] = []
    originals = {cls: cls.check_mel for cls in (HiFTGenerator, CausalHiFTGenerator)}

    def wrap(original: Callable[..., None]) -> Callable[..., None]:
        def check_mel(self: Any, mel: torch.Tensor, **kw: Any) -> None:
            original(self, mel, **kw)
            if mel.numel():
                seen.append(mel.detach().float().cpu())

        return check_mel

    for cls, original in originals.items():
        cls.check_mel = wrap(original)  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        for cls, original in originals.items():
            cls.check_mel = original  # type: ignore[method-assign]


@dataclass
class Run:
    """One request at one flow dtype: whole mel and audio, and each streamed chunk's mel and audio."""

    whole_mel: torch.Tensor
    whole_audio: torch.Tensor
    chunk_mels: list[torch.Tensor] = field(default_factory=list)
    chunk_audio: list[torch.Tensor] = field(default_factory=list)


class FamilyRunner:
    """A family's facade on its reduced stand-in at one flow dtype, and how to run a request whole and streamed."""

    def __init__(self, family: str, dtype: torch.dtype, n_timesteps: int, device: torch.device) -> None:
        self.family = family
        self.device = device
        common: dict[str, Any] = {"device": device, "n_timesteps": n_timesteps, "flow_dtype": dtype}
        if family == "cosyvoice3":
            from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
            from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import (
                read_prompt_tokens,
                voice_tokens_path,
            )
            from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

            folder = ensure_standin_cosyvoice3_dir(reduced=True)
            self.facade: Any = CosyVoice3Token2Wav(folder, **common)
            wav = folder / "default_voice.wav"
            self.voice = self.facade.prompt(str(wav), read_prompt_tokens(voice_tokens_path(wav))[:, :40])
        else:
            from vllm_omni_token2wav.assets.audio import speech_sample
            from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

            folder = ensure_standin_token2wav_dir(reduced=True)
            if family == "minicpmo_4_5":
                from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import (
                    MiniCPMO45Token2wav,
                )

                self.facade = MiniCPMO45Token2wav(folder, **common)
            else:
                from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import (
                    StepAudio2Token2WavCore,
                )

                self.facade = StepAudio2Token2WavCore(folder, **common)
            wav, rate = speech_sample()
            self.voice = (wav[: int(PROMPT_SECONDS * rate)].copy(), rate)
        self.facade.load_models()

    def run(self, tokens: list[int], seed: int) -> Run:
        ids = torch.tensor([tokens])
        with recorded_mels() as mels:
            if self.family == "cosyvoice3":
                audio = self.facade(ids, prompt=self.voice, seed=seed)
            else:
                audio = self.facade(tokens, self.voice, seed=seed)
        result = Run(whole_mel=max(mels, key=lambda m: m.shape[-1]), whole_audio=audio.float().cpu())
        for chunk, last in self._chunks(tokens):
            if not hasattr(self, "_state") or self._state is None:
                self._state = self._open(seed)
            with recorded_mels() as mels:
                piece = self.facade.stream(chunk, last_chunk=last, return_waveform=True, state=self._state)
            if mels:
                result.chunk_mels.append(torch.cat(mels, dim=-1))
            result.chunk_audio.append(piece.float().cpu())
        self._state = None
        return result

    def _open(self, seed: int) -> Any:
        if self.family == "cosyvoice3":
            return self.facade.set_stream_cache(prompt=self.voice, seed=seed)
        return self.facade.set_stream_cache(self.voice, seed=seed)

    def _chunks(self, tokens: list[int]) -> Iterator[tuple[list[int], bool]]:
        if self.family == "cosyvoice3":
            from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import upstream_chunks

            for part, last in upstream_chunks(len(tokens), int(self.voice.tokens.shape[1])):
                yield tokens[part], last
        else:
            from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

            yield from stream_chunks(tokens)

    def vocode(self, mel: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
        """The whole-utterance vocoder on `mel`, under autocast in `dtype` unless float32 (audio on the CPU)."""
        from vllm_omni_token2wav.model_executor.layers.hift import generator, layers
        from vllm_omni_token2wav.model_executor.layers.hift_causal import stream

        hift = self.facade.hift
        kind = self.device.type
        ctx = torch.autocast(kind, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
        mel = mel.to(self.device)

        def fp32_istft(x: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
            # CPU FFTs and complex tensors have no half kernels: the iSTFT head runs in fp32 on the
            # reduced-precision spectrum the convolutions produced
            with torch.autocast(kind, enabled=False):
                return layers.istft_head(x.float(), n_fft, hop, window.float())

        modules = (generator, stream)
        for module in modules:
            module.istft_head = fp32_istft  # type: ignore[attr-defined]
        try:
            with ctx:
                if isinstance(hift, CausalHiFTGenerator):
                    out = hift.inference(mel, finalize=True)
                else:
                    out = hift(mel, generator=torch.Generator().manual_seed(seed))
        finally:
            for module in modules:
                module.istft_head = layers.istft_head  # type: ignore[attr-defined]
        out = out[0] if isinstance(out, tuple) else out
        return out.float().cpu()


def compare(run: Run, ref: Run) -> dict[str, Any]:
    """One request's deviations from its fp32 run (module docstring)."""
    if len(run.chunk_audio) != len(ref.chunk_audio) or len(run.chunk_mels) != len(ref.chunk_mels):
        raise ValueError("the reduced and fp32 streams returned different chunk counts")
    return {
        "whole_mel": deviation(run.whole_mel, ref.whole_mel),
        "whole_audio": deviation(run.whole_audio, ref.whole_audio),
        "chunk_mel": worst([deviation(a, b) for a, b in zip(run.chunk_mels, ref.chunk_mels, strict=True)]),
        "chunk_audio": worst(
            [deviation(a, b) for a, b in zip(run.chunk_audio, ref.chunk_audio, strict=True) if b.numel()]
        ),
        "stream_audio": deviation(torch.cat(run.chunk_audio, dim=-1), torch.cat(ref.chunk_audio, dim=-1)),
        "whole_spectrum": {"rel_l2": spectral_deviation(run.whole_audio, ref.whole_audio)},
        "stream_spectrum": {
            "rel_l2": spectral_deviation(torch.cat(run.chunk_audio, dim=-1), torch.cat(ref.chunk_audio, dim=-1))
        },
        "chunks": len(run.chunk_audio),
        "audio_peak": float(ref.whole_audio.abs().max()),
        "mel_peak": float(ref.whole_mel.abs().max()),
    }


def measure(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    families = [f for f in args.families.split(",") if f]
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in ("float16", "bfloat16"):
            raise SystemExit(f"--dtypes: float16 or bfloat16, got {d!r}")
    rows: list[dict[str, Any]] = []
    vocoder_rows: list[dict[str, Any]] = []
    for family in families:
        requests = [
            (torch.randint(0, 6561, (args.tokens,), generator=torch.Generator().manual_seed(100 + i)).tolist(), i)
            for i in range(args.requests)
        ]
        reference = FamilyRunner(family, torch.float32, args.n_timesteps, device)
        refs = [reference.run(tokens, seed) for tokens, seed in requests]
        for name in dtypes:
            runner = FamilyRunner(family, DTYPES[name], args.n_timesteps, device)
            per_request = [compare(runner.run(t, s), ref) for (t, s), ref in zip(requests, refs, strict=True)]
            row: dict[str, Any] = {"family": family, "flow_dtype": name, "requests": per_request}
            for key in ("whole_mel", "whole_audio", "chunk_mel", "chunk_audio", "stream_audio"):
                row[key] = worst([r[key] for r in per_request])
            for key in ("whole_spectrum", "stream_spectrum"):
                row[key] = {"rel_l2": max(r[key]["rel_l2"] for r in per_request)}
            rows.append(row)
            print(f"{family} {name}: whole audio rel L2 {row['whole_audio']['rel_l2']:.2e}", flush=True)
            vocoded, spectra = [], []
            for ref, (_, seed) in zip(refs, requests, strict=True):
                audio = reference.vocode(ref.whole_mel, DTYPES[name], seed)
                vocoded.append(deviation(audio, ref.whole_audio))
                spectra.append(spectral_deviation(audio, ref.whole_audio))
            # control: the fp32 vocoder on the fp32 mel plus Gaussian noise of the reduced flow's mel rel L2
            controls = []
            for ref, (_, seed) in zip(refs, requests, strict=True):
                noise = torch.randn(ref.whole_mel.shape, generator=torch.Generator().manual_seed(7))
                scale = row["whole_mel"]["rel_l2"] * ref.whole_mel.norm() / noise.norm()
                audio = reference.vocode(ref.whole_mel + scale * noise, torch.float32, seed)
                controls.append(spectral_deviation(audio, ref.whole_audio))
            row["control_spectrum"] = {"rel_l2": max(controls)}
            vocoder_rows.append(
                {"family": family, "autocast_dtype": name, "audio": worst(vocoded), "spectrum_rel_l2": max(spectra)}
            )
    return {"flow": rows, "vocoder_autocast": vocoder_rows, "families": families, "dtypes": dtypes}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"token2wav flow precision vs fp32 (reduced stand-ins, {result['environment']['device']}, "
        f"{result['tokens']} tokens x "
        f"{result['requests']} requests, n_timesteps {result['n_timesteps']}; worst request; "
        "chunk = worst streamed chunk)",
        f"{'family':<14}{'flow':<10}{'mel whole':>21}{'mel chunk':>21}{'audio whole':>21}{'audio chunk':>21}"
        f"{'|STFT| rel L2':>20}{'control':>10}",
        f"{'':<24}" + "   max abs   rel L2" * 4 + "    whole   stream    (mel noise)",
    ]
    for row in result["flow"]:
        cells = "".join(
            f"{row[k]['max_abs']:>10.2e}{row[k]['rel_l2']:>9.2e}  "
            for k in ("whole_mel", "chunk_mel", "whole_audio", "chunk_audio")
        )
        spectra = (
            f"{row['whole_spectrum']['rel_l2']:>9.2e}{row['stream_spectrum']['rel_l2']:>9.2e}"
            f"{row['control_spectrum']['rel_l2']:>10.2e}"
        )
        lines.append(f"{row['family']:<14}{row['flow_dtype']:<10}{cells}{spectra}")
    peaks = ", ".join(
        f"{row['family']} {max(r['audio_peak'] for r in row['requests']):.3f}"
        for row in result["flow"]
        if row["flow_dtype"] == result["dtypes"][0]
    )
    lines += [
        f"fp32 audio peak (max abs is relative to it): {peaks}",
        "control: the fp32 vocoder on the fp32 mel plus Gaussian noise of the same mel rel L2 (|STFT| rel L2):",
        "the stand-in vocoder's sensitivity to any mel change of that size, whatever its cause",
    ]
    lines += ["", "vocoder under autocast on the fp32 whole mel, audio vs the fp32 vocoder:"]
    for row in result["vocoder_autocast"]:
        audio = row["audio"]
        lines.append(
            f"{row['family']:<14}{row['autocast_dtype']:<10}max abs {audio['max_abs']:.2e}  "
            f"rel L2 {audio['rel_l2']:.2e}  |STFT| rel L2 {row['spectrum_rel_l2']:.2e}"
        )
    return "\n".join(lines) + "\n"


def serving_device(spec: str) -> torch.device:
    """`--device`: auto is the serving platform's device."""
    if spec == "auto":
        from vllm_omni_token2wav import platforms

        return platforms.current_omni_platform.torch_device()
    return torch.device(spec)


def execute(args: argparse.Namespace) -> int:
    """The run `python -m benchmarks.token2wav_precision` starts (its options: `cli.py` beside this module)."""
    device = serving_device(args.device)
    env = run_environment(device, args.threads)
    with torch_threads(args.threads), torch.inference_mode():
        measured = measure(args, device)
    env["loadavg_end"] = load_average()
    result = {
        "schema": "vllm-omni/token2wav-precision/1",
        "command": invoked_command(),
        "kind": "stand-in (reduced size)",
        "tokens": args.tokens,
        "requests": args.requests,
        "n_timesteps": args.n_timesteps,
        "environment": env,
        **measured,
    }
    text = render(result)
    publish_json_and_text(result, text, args.json)
    finite = all(
        v == v and v != float("inf")
        for row in result["flow"]
        for k in ("whole_audio", "chunk_audio")
        for v in row[k].values()
    )
    return 0 if finite else 1
