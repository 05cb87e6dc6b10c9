#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end check of MiniCPM-o's minicpmo-utils 1.0.7 variant against minicpmo-utils 1.0.7 itself (manual, not CI).

Why: CI pins each piece of the variant (the PER_RATE conformer trim, the bounded causal vocoder,
the 3840-zero rule, the config.yaml reader, the batched stage) to references written in the tests;
this runs the whole streaming path next to the package's own `Token2wav` (its `set_stream_cache` /
`stream` / `_stream_vocode` / trims / `BoundedVocoder`, unchanged) on the same stand-in directory
(same weights, strict loads on both sides), the same prompt features and the same noise, and
prints per chunk the sample counts, max |diff| and relative L2. It also checks the whole-utterance
path (`Token2wav.__call__`: flow + `hift_original.pt`).

Two processes: this script runs our side in the project environment, then re-runs itself with
`--reference-side` under the reference venv's Python, which never imports `vllm_omni_token2wav` (only the
bundle of inputs this side wrote: prompt tokens / mel / speaker embedding, token ids, the flow's
noise buffer). Reference venv (never committed, never imported by library code):

    python3 -m venv /tmp/mcporef
    /tmp/mcporef/bin/pip install torch==2.13.0 numpy scipy pyyaml hyperpyyaml einops tqdm onnx onnxruntime librosa
    /tmp/mcporef/bin/pip install --no-deps minicpmo-utils==1.0.7
    PYTHONPATH=. .venv/bin/python tools/check_minicpmo_reference.py --ref-python /tmp/mcporef/bin/python
    PYTHONPATH=. .venv/bin/python tools/check_minicpmo_reference.py --ref-python /tmp/mcporef/bin/python --full

What the reference side changes, and why (nothing on the computation path):
- `Token2wav.__init__` targets CUDA: `torch.cuda.current_device` answers 0, `Module.cuda` is the
  identity and the causal vocoder is loaded with device "cpu" while it runs; `s3tokenizer.load_model`
  returns a placeholder (the stand-in tokenizer ONNX is not in the real file's layout; the prompt
  tokens come from the bundle, as do the speaker embedding and prompt mel: `Token2wav.cache` is
  filled with them, so `_prepare_prompt` never runs). Everything else in `__init__` runs: the
  seven-file check, `flow.yaml` + strict `flow.pt`, `load_causal_vocoder` (config.yaml through
  hyperpyyaml, its mel and architecture checks, strict `hift.pt`), `BoundedVocoder`, the delay check.
- torchaudio (no build for torch 2.13) is a stub: its `save` captures the whole-utterance waveform.
- The flow's `rand_noise` (drawn unseeded by the reference) is overwritten with ours.
- Reduced stand-ins only: the reference preallocates its streaming scratch buffers for the shipped
  DiT (16 blocks, 8 heads x 64, hidden 512); they are re-allocated, zeroed, for the stand-in's sizes,
  and `hift_original.pt` is built with the stand-in's channel widths (the reference uses
  `HiFTGenerator()` defaults). `--full` needs neither.
- Whole utterance only: HiFT's Gaussian noise is drawn by `randn_like` of a transposed view, which
  on CPU yields other values than a contiguous draw; with `randn_like` drawing contiguously and the
  global seed set to our seed, both sides draw the same numbers (token2wav-synthesis notes).

Exit status 1 when a chunk exceeds the tolerance (1e-5 max |diff|) or a sample count differs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
VARIANT = "minicpmo-utils-1.0.7"
#: Flow mel, ours vs the reference: float32 rounding of equivalent op orders (measured <= 2.4e-6 before).
MEL_TOLERANCE = 1e-5
#: Our vocoder fed the reference's mel vs the reference's audio: exact up to float32 convolution rounding.
VOCODER_TOLERANCE = 1e-6
#: End to end: the vocoder's F0 -> phase integral turns the flow's rounding into ~1e-3 of the audio.
AUDIO_REL_L2_TOLERANCE = 1e-2


# ---- our side (project environment) ------------------------------------------------------------------


def _ours(args: argparse.Namespace, work: Path) -> tuple[Path, dict[str, Any]]:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from vllm_omni_token2wav.assets.audio import speech_sample
    from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
    from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2wav
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import (
        MINICPMO_1_0_7_LAYOUT,
        ensure_standin_token2wav_dir,
    )
    from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

    model_dir = args.model_dir or ensure_standin_token2wav_dir(reduced=not args.full, layout=MINICPMO_1_0_7_LAYOUT)
    facade = MiniCPMO45Token2wav(model_dir, device="cpu", n_timesteps=args.n_timesteps, variant=VARIANT)
    wav, rate = speech_sample()
    prompt = (wav[: int(args.prompt_seconds * rate)].copy(), rate)
    features = facade.prepare_prompt(prompt, with_tokens=True)
    tokens = torch.randint(0, 6561, (args.tokens,), generator=torch.Generator().manual_seed(args.seed)).tolist()
    chunks = [(list(c), last) for c, last in stream_chunks(tokens)]
    schedules = {"last chunk": chunks, "empty final call": [(c, False) for c, _ in chunks] + [([], True)]}
    streams: dict[str, list[torch.Tensor]] = {}
    mels: dict[str, list[torch.Tensor]] = {}
    vocoder = facade.stream_vocoder
    real_vocode = vocoder.vocode
    start = time.perf_counter()
    for name, schedule in schedules.items():
        state = facade.set_stream_cache(prompt)
        seen: list[torch.Tensor] = []
        # Observe the flow's mel on its way to the vocoder (the table's mel column).
        vocoder.vocode = lambda c, pad_rows=0, seen=seen: seen.extend(x.mel for x in c) or real_vocode(c, pad_rows)
        streams[name] = [facade.stream(c, None, last, True, state=state).reshape(-1) for c, last in schedule]
        mels[name] = [m.float().cpu() for m in seen]
    vocoder.vocode = real_vocode
    # Control: the same stream under vLLM-Omni 0.30's rules (silence lookahead, PROMPT_PLUS_TAIL trim).
    control = MiniCPMO45Token2wav(
        model_dir,
        device="cpu",
        n_timesteps=args.n_timesteps,
        variant=VARIANT,
        stream_lookahead=Lookahead.SILENCE,
        conformer_trim=ConformerTrim.PROMPT_PLUS_TAIL,
    )
    seen = []
    control_vocoder = control.stream_vocoder
    control_vocode = control_vocoder.vocode
    control_vocoder.vocode = lambda c, pad_rows=0: seen.extend(x.mel for x in c) or control_vocode(c, pad_rows)
    control_state = control.set_stream_cache(prompt)
    for c, last in chunks:
        control.stream(c, None, last, True, state=control_state)
    control_mels = [m.float().cpu() for m in seen]
    whole_mel: list[torch.Tensor] = []
    hook = facade.hift.register_forward_pre_hook(lambda _m, inputs: whole_mel.append(inputs[0].detach().clone()))
    whole = facade(tokens, prompt, seed=args.seed).reshape(-1)
    hook.remove()
    bundle = {
        "prompt_tokens": features.prompt_tokens,
        "prompt_token_len": features.prompt_token_len,
        "speaker_embedding": features.speaker_embedding,
        "prompt_mel": features.prompt_mel,
        "prompt_mel_len": features.prompt_mel_len,
        "rand_noise": facade.flow.decoder.rand_noise,
        "tokens": tokens,
        "schedules": schedules,
        "n_timesteps": args.n_timesteps,
        "whole_seed": args.seed,
        "reduced": not args.full,
    }
    path = work / "bundle.pt"
    torch.save(bundle, path)
    info = {
        "facade": facade,
        "model_dir": str(model_dir),
        "prompt_frames": int(features.prompt_mel.shape[1]),
        "schedules": schedules,
        "streams": streams,
        "mels": mels,
        "control_mels": control_mels,
        "whole": whole,
        "whole_mel": whole_mel[0],
        "seed": args.seed,
        "seconds": time.perf_counter() - start,
    }
    return path, info


def _vocoder_on_reference_mel(info: dict[str, Any], ref: dict[str, Any], name: str) -> list[torch.Tensor]:
    """Our stream vocoder fed the reference's own mel chunk by chunk (the vocoder alone, flow excluded)."""
    from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderChunk

    vocoder = info["facade"].stream_vocoder
    state = vocoder.start(0, torch.device("cpu"))
    out = []
    for mel, (_, last) in zip(ref["mels"][name], info["schedules"][name], strict=True):
        if last and not mel.shape[-1]:
            out.append(vocoder.flush(state).reshape(-1))
            continue
        audio, state = vocoder.vocode([VocoderChunk(mel, state, last)])[0]
        out.append(audio.reshape(-1))
    return out


def _diff(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[float, float]:
    """(max |diff|, relative L2) of two waveforms or mels of equal shape; NaN when the shapes differ."""
    if ours.shape != theirs.shape:
        return float("nan"), float("nan")
    if not theirs.numel():
        return 0.0, 0.0
    diff = ours.detach().double() - theirs.detach().double()
    norm = float(theirs.detach().double().norm())
    return float(diff.abs().max()), float(diff.norm()) / norm if norm else 0.0


def _compare(info: dict[str, Any], ref: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """One row per streamed call (and the whole utterance): mel, end-to-end and vocoder-alone differences."""
    rows, ok = [], True
    for name, chunks in info["streams"].items():
        theirs, alone = ref["streams"][name], _vocoder_on_reference_mel(info, ref, name)
        # The flow runs for every call with tokens; an empty final call only flushes the vocoder.
        our_mels = iter(info["mels"][name])
        ref_mels = iter(m for m in ref["mels"][name] if m.shape[-1])
        for k, (ours, audio) in enumerate(zip(chunks, theirs, strict=True)):
            has_tokens = bool(info["schedules"][name][k][0])
            mel = _diff(next(our_mels), next(ref_mels)) if has_tokens else (0.0, 0.0)
            end_to_end, vocoder = _diff(ours, audio), _diff(alone[k], audio)
            rows.append(
                {
                    "schedule": name,
                    "call": k,
                    "samples": ours.numel(),
                    "ref_samples": audio.numel(),
                    "leading_zeros": bool(audio.numel() >= 3840 and not audio[:3840].any()),
                    "mel_max_abs": mel[0],
                    "max_abs": end_to_end[0],
                    "rel_l2": end_to_end[1],
                    "vocoder_max_abs": vocoder[0],
                    "peak": float(audio.abs().max()) if audio.numel() else 0.0,
                }
            )
    whole_alone = (
        info["facade"].hift(ref["whole_mel"], generator=torch.Generator().manual_seed(info["seed"]))[0].reshape(-1)
    )
    end_to_end = _diff(info["whole"], ref["whole"])
    rows.append(
        {
            "schedule": "whole utterance",
            "call": "-",
            "samples": info["whole"].numel(),
            "ref_samples": ref["whole"].numel(),
            "leading_zeros": False,
            "mel_max_abs": _diff(info["whole_mel"], ref["whole_mel"])[0],
            "max_abs": end_to_end[0],
            "rel_l2": end_to_end[1],
            "vocoder_max_abs": _diff(whole_alone, ref["whole"])[0],
            "peak": float(ref["whole"].abs().max()),
        }
    )
    for row in rows:
        row["ok"] = (
            row["samples"] == row["ref_samples"]
            and row["mel_max_abs"] <= MEL_TOLERANCE
            and row["vocoder_max_abs"] <= VOCODER_TOLERANCE
            and row["rel_l2"] <= AUDIO_REL_L2_TOLERANCE
        )
        ok &= row["ok"]
    return rows, ok


def _print(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'schedule':18s} {'call':>4s} {'samples':>8s} {'ref':>8s} {'mel |diff|':>11s} {'audio |diff|':>12s} "
        f"{'rel L2':>9s} {'vocoder |diff|':>14s} {'peak':>7s}"
    )
    for r in rows:
        notes = ("  3840 leading zeros" if r["leading_zeros"] else "") + ("" if r["ok"] else "  FAIL")
        print(
            f"{r['schedule']:18s} {r['call']!s:>4s} {r['samples']:8d} {r['ref_samples']:8d} {r['mel_max_abs']:11.2e} "
            f"{r['max_abs']:12.2e} {r['rel_l2']:9.2e} {r['vocoder_max_abs']:14.2e} {r['peak']:7.4f}{notes}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref-python", type=Path, help="python of the reference venv (minicpmo-utils 1.0.7)")
    parser.add_argument("--full", action="store_true", help="full-size stand-ins (default: reduced)")
    parser.add_argument("--model-dir", type=Path, help="a token2wav directory in the 1.0.7 layout (default: stand-in)")
    parser.add_argument("--tokens", type=int, default=25 * 8 + 11, help="speech tokens streamed (default 211)")
    parser.add_argument("--prompt-seconds", type=float, default=3.0, help="prompt clip length (default 3 s)")
    parser.add_argument("--n-timesteps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="token ids and whole-utterance noise seed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the per-chunk table as JSON here")
    parser.add_argument("--reference-side", nargs=3, metavar=("BUNDLE", "MODEL_DIR", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.reference_side:
        bundle, model_dir, out = (Path(p) for p in args.reference_side)
        reference_side(bundle, model_dir, out)
        return 0
    if args.ref_python is None or not args.ref_python.is_file():
        parser.error("--ref-python must name the reference venv's python; see the setup lines in --help")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle, info = _ours(args, work)
        out = work / "reference.pt"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the reference never sees vllm_omni_token2wav
        command = [str(args.ref_python), str(Path(__file__).resolve()), "--threads", str(args.threads)]
        command += ["--reference-side", str(bundle), info["model_dir"], str(out)]
        subprocess.run(command, check=True, env=env, cwd=tmp)
        ref = torch.load(out, weights_only=False)
    print(
        f"minicpmo-utils 1.0.7 Token2wav vs MiniCPMO45Token2wav(variant={VARIANT}): {info['model_dir']}, "
        f"{'full' if args.full else 'reduced'} stand-ins, prompt {args.prompt_seconds:g} s ({info['prompt_frames']} "
        f"mel frames), {args.tokens} tokens, n_timesteps {args.n_timesteps}, torch {torch.__version__}, "
        f"{args.threads} threads, our side {info['seconds']:.1f} s"
    )
    rows, ok = _compare(info, ref)
    _print(rows)
    ref_mels = [m for m in ref["mels"]["last chunk"] if m.shape[-1]]
    control = [_diff(a, b)[1] for a, b in zip(info["control_mels"], ref_mels, strict=True)]
    print(
        "control, vLLM-Omni 0.30's lookahead and conformer trim vs the reference: mel rel L2 per chunk "
        f"{[f'{c:.1e}' for c in control]}"
    )
    if args.out:
        from vllm_omni_token2wav.atomic_io import write_json_atomic

        report = {
            "reference": "minicpmo-utils 1.0.7 Token2wav",
            "ours": f"MiniCPMO45Token2wav(variant={VARIANT})",
            "config": "full" if args.full else "reduced",
            "torch": torch.__version__,
            "threads": args.threads,
            "prompt_seconds": args.prompt_seconds,
            "prompt_mel_frames": info["prompt_frames"],
            "tokens": args.tokens,
            "n_timesteps": args.n_timesteps,
            "seed": args.seed,
            "tolerances": {
                "mel_max_abs": MEL_TOLERANCE,
                "vocoder_max_abs": VOCODER_TOLERANCE,
                "audio_rel_l2": AUDIO_REL_L2_TOLERANCE,
            },
            "ok": ok,
            "rows": rows,
            "control_vllm_omni_0_30_mel_rel_l2": control,
        }
        write_json_atomic(args.out, report)
    print(
        "all calls within tolerance" if ok else "FAILED",
        f"(sample counts equal; mel <= {MEL_TOLERANCE:g}, vocoder alone <= {VOCODER_TOLERANCE:g}, "
        f"audio rel L2 <= {AUDIO_REL_L2_TOLERANCE:g})",
    )
    return 0 if ok else 1


# ---- reference side (reference venv; imports only torch and minicpmo-utils) ------------------------------


class _Saved:
    """torchaudio stand-in: `save` keeps the waveform `Token2wav.__call__` writes."""

    waves: list[torch.Tensor] = []

    @classmethod
    def save(cls, _target: Any, wav: torch.Tensor, sample_rate: int, format: str = "wav") -> None:  # noqa: A002
        cls.waves.append(wav.detach().clone())


def _stub_torchaudio() -> None:
    names = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "torchaudio.transforms")
    modules = {name: types.ModuleType(name) for name in names}
    modules["torchaudio"].save = _Saved.save  # type: ignore[attr-defined]
    modules["torchaudio"].compliance = modules["torchaudio.compliance"]  # type: ignore[attr-defined]
    modules["torchaudio.compliance"].kaldi = modules["torchaudio.compliance.kaldi"]  # type: ignore[attr-defined]
    modules["torchaudio"].transforms = modules["torchaudio.transforms"]  # type: ignore[attr-defined]
    sys.modules.update(modules)


class _Placeholder:
    def cuda(self) -> _Placeholder:
        return self

    def eval(self) -> _Placeholder:
        return self


@contextlib.contextmanager
def _cpu_construction(token2wav: types.ModuleType) -> Iterator[None]:
    """Let `Token2wav.__init__` run on a CPU-only torch (see the module docstring)."""
    import s3tokenizer

    saved = (torch.cuda.current_device, torch.nn.Module.cuda, s3tokenizer.load_model, token2wav.load_causal_vocoder)
    real_loader = token2wav.load_causal_vocoder
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    torch.nn.Module.cuda = lambda self, device=None: self  # type: ignore[assignment, method-assign]
    s3tokenizer.load_model = lambda *a, **k: _Placeholder()
    token2wav.load_causal_vocoder = lambda model_path, device: real_loader(model_path, torch.device("cpu"))
    try:
        yield
    finally:
        torch.cuda.current_device, torch.nn.Module.cuda, s3tokenizer.load_model = saved[:3]  # type: ignore[assignment]
        token2wav.load_causal_vocoder = saved[3]


def _fit_scratch_buffers(flow: torch.nn.Module) -> None:
    """Re-allocate the reference's streaming scratch buffers for a stand-in DiT of other sizes (zeros)."""
    estimator = flow.decoder.estimator
    depth = len(estimator.blocks)
    heads, head_dim = estimator.blocks[0].attn.num_heads, estimator.blocks[0].attn.head_dim
    hidden = estimator.in_proj.out_features  # the conv block caches both of its convs: 2 x hidden channels
    frames = estimator.att_cache_buffer.shape[3]
    estimator.att_cache_buffer = torch.zeros(depth, 2, heads, frames, 2 * head_dim)
    estimator.cnn_cache_buffer = torch.zeros(depth, 2, 2 * hidden, 2)
    cfm = flow.decoder
    steps = cfm.att_cache_buffer.shape[0]
    cfm.att_cache_buffer = torch.zeros(steps, depth, 2, heads, frames, 2 * head_dim)
    cfm.cnn_cache_buffer = torch.zeros(steps, depth, 2, 2 * hidden, 2)


def reference_side(bundle_path: Path, model_dir: Path, out: Path) -> None:
    _stub_torchaudio()
    import stepaudio2.token2wav as token2wav

    bundle = torch.load(bundle_path, weights_only=False)
    if bundle["reduced"]:
        import functools

        from stepaudio2.flashcosyvoice.modules import hifigan

        width = int(torch.load(model_dir / "hift_original.pt", weights_only=True)["conv_pre.bias"].shape[0])
        f0_width = int(
            torch.load(model_dir / "hift_original.pt", weights_only=True)["f0_predictor.classifier.weight"].shape[1]
        )
        token2wav.HiFTGenerator = functools.partial(  # type: ignore[attr-defined]
            hifigan.HiFTGenerator, base_channels=width, f0_predictor=hifigan.ConvRNNF0Predictor(cond_channels=f0_width)
        )
    with _cpu_construction(token2wav):
        t2w = token2wav.Token2wav(str(model_dir), float16=False, n_timesteps=bundle["n_timesteps"])
    t2w.device = torch.device("cpu")
    t2w.flow.decoder.rand_noise.copy_(bundle["rand_noise"])
    if bundle["reduced"]:
        _fit_scratch_buffers(t2w.flow)
    key = "bundle-prompt"
    t2w.cache[key] = (
        bundle["prompt_tokens"].to(torch.int32),
        bundle["prompt_token_len"].to(torch.int32),
        bundle["speaker_embedding"],
        bundle["prompt_mel"],
        bundle["prompt_mel_len"].to(torch.int32),
    )
    streams, mels = {}, {}
    real_vocode = t2w._stream_vocode
    for name, schedule in bundle["schedules"].items():
        seen: list[torch.Tensor] = []
        # Observe the mel each chunk hands the vocoder (the same call, arguments passed through).
        t2w._stream_vocode = lambda mel, last, seen=seen: seen.append(mel.detach().clone()) or real_vocode(mel, last)
        t2w.set_stream_cache(key)
        streams[name] = [
            torch.from_numpy(t2w.stream(chunk, key, last_chunk=last, return_waveform=True)).reshape(-1)
            for chunk, last in schedule
        ]
        mels[name] = seen
    t2w._stream_vocode = real_vocode
    real_randn_like = torch.randn_like
    torch.randn_like = lambda x, **kw: torch.randn(x.shape, dtype=x.dtype, device=x.device)  # type: ignore[assignment]
    whole_mel: list[torch.Tensor] = []
    try:
        hift = t2w._get_original_vocoder()  # built (its init drawn) before the seed, as a warm instance would be
        hift.register_forward_pre_hook(lambda _m, _a, kw: whole_mel.append(kw["speech_feat"].clone()), with_kwargs=True)
        torch.manual_seed(bundle["whole_seed"])
        t2w(bundle["tokens"], key)
    finally:
        torch.randn_like = real_randn_like  # type: ignore[assignment]
    result = {"streams": streams, "mels": mels, "whole": _Saved.waves[-1].reshape(-1), "whole_mel": whole_mel[0]}
    torch.save(result, out)


if __name__ == "__main__":
    raise SystemExit(main())
