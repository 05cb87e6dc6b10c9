#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cross-check the in-tree causal HiFT against the public reference code (manual, not CI).

Why: CI pins the causal vocoder to small references written in the tests; this runs it next to
the reference implementations on the same weights and the same noise and prints the largest
differences:

- `noise`: the fixed noise table the reference draws when built the way CosyVoice's CosyVoice3
  loader builds it (flow first: the CFM reseeds 0) and the way a vocoder-only yaml builds it
  (seed 1986, F0 predictor first), against `GeneratedNoiseTable` (whole table, element by element,
  and read in streaming windows across the 300 s wrap);
- `whole`: `CausalHiFTGenerator.inference(mel, finalize=True/False)` of CosyVoice (ace7c47);
- `stream`: upstream CosyVoice3's vocoder streaming (`CosyVoice3Model.token2wav`: cumulative mel,
  `inference(finalize=False)` every chunk, emit past `speech_offset`) against `CausalHiFTStreamer`
  (`COSYVOICE3_STREAM`), chunk by chunk;
- `minicpmo`: minicpmo-utils 1.0.7's `BoundedVocoder` plus the 3840-zero rule of its
  `Token2wav._stream_vocode`, against `MINICPMO_1_0_7_STREAM`, chunk by chunk; also prints the
  bounded vocoder's own numbers (F0 left/right, history, delay, block) next to ours.

The reference code lives outside the project environment, in a venv of its own, and is never
imported by library code (nor committed):

    python3 -m venv /tmp/hiftref
    /tmp/hiftref/bin/pip install torch==2.13.0 numpy scipy omegaconf
    /tmp/hiftref/bin/pip install --no-deps minicpmo-utils==1.0.7
    mkdir -p /tmp/hiftref/cosyvoice_src
    git -C /path/to/CosyVoice archive ace7c47 cosyvoice | tar -x -C /tmp/hiftref/cosyvoice_src
    PYTHONPATH=. /tmp/hiftref/bin/python tools/check_causal_hift_reference.py \\
        --cosyvoice /tmp/hiftref/cosyvoice_src all --config full --seconds 6

CosyVoice's flow modules import Matcha-TTS (`BASECFM`, whose __init__ only stores attributes) and
an onnxruntime/torchaudio speech-token helper; both are replaced by small stand-ins here, which
draw nothing from the RNG. Exit code 1 when a check exceeds its tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import site
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from vllm_omni_token2wav.model_executor.layers.hift_causal import (  # noqa: E402
    COSYVOICE3_STREAM,
    FULL_CAUSAL_HIFT_CONFIG,
    FULL_CAUSAL_HIFT_NUM_KEYS,
    FULL_CAUSAL_HIFT_NUM_PARAMS,
    MINICPMO_1_0_7_STREAM,
    REDUCED_CAUSAL_HIFT_CONFIG,
    CausalHiFTConfig,
    CausalHiFTGenerator,
    CausalHiFTStreamer,
    GeneratedNoiseTable,
    NoiseOrigin,
    load_causal_hift,
    standin_mel,
    write_standin_causal_hift,
)
from vllm_omni_token2wav.tools.cosyvoice_reference import reference_causal_hift  # noqa: E402

TOLERANCE = 1e-6
FAILURES: list[str] = []


def report(name: str, ours: torch.Tensor, ref: torch.Tensor, tolerance: float = TOLERANCE) -> None:
    if ours.shape != ref.shape:
        FAILURES.append(name)
        print(f"  {name}: SHAPE MISMATCH ours {tuple(ours.shape)} vs reference {tuple(ref.shape)}")
        return
    diff = (ours.double() - ref.double()).abs().max().item() if ours.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    verdict = "ok" if diff <= tolerance else "FAIL"
    if verdict == "FAIL":
        FAILURES.append(name)
    print(f"  {name}: {tuple(ours.shape)} max |diff| {diff:.2e} (max |ref| {scale:.3f}) {verdict}")


# -- reference imports ---------------------------------------------------------------------------


def _cosyvoice(root: Path) -> types.SimpleNamespace:
    """CosyVoice's vocoder and flow modules from an extracted source tree."""
    sys.path.insert(0, str(root))

    class BASECFM(torch.nn.Module):  # Matcha-TTS BASECFM.__init__: attributes only, no RNG
        def __init__(self, n_feats: int, cfm_params: Any, n_spks: int = 1, spk_emb_dim: int = 128) -> None:
            super().__init__()
            self.n_feats, self.n_spks, self.spk_emb_dim = n_feats, n_spks, spk_emb_dim
            self.solver = cfm_params.solver
            self.sigma_min = getattr(cfm_params, "sigma_min", 1e-4)
            self.estimator = None

    for name in ("matcha", "matcha.models", "matcha.models.components"):
        sys.modules.setdefault(name, types.ModuleType(name))
    fm = types.ModuleType("matcha.models.components.flow_matching")
    fm.BASECFM = BASECFM  # type: ignore[attr-defined]
    sys.modules["matcha.models.components.flow_matching"] = fm
    onnx = types.ModuleType("cosyvoice.utils.onnx")  # onnxruntime + torchaudio speech-token helper: unused
    onnx.SpeechTokenExtractor, onnx.online_feature, onnx.onnx_path = None, False, ""  # type: ignore[attr-defined]
    sys.modules["cosyvoice.utils.onnx"] = onnx

    from cosyvoice.flow import flow, flow_matching
    from cosyvoice.hifigan import f0_predictor, generator

    return types.SimpleNamespace(generator=generator, f0_predictor=f0_predictor, flow=flow, cfm=flow_matching)


def _stepaudio2() -> types.SimpleNamespace:
    """minicpmo-utils' causal vocoder package (its top-level __init__ pulls torchaudio/onnxruntime: skipped)."""
    for base in site.getsitepackages():
        path = Path(base) / "stepaudio2"
        if (path / "causal_vocoder").is_dir():
            break
    else:
        raise SystemExit("minicpmo-utils is not installed in this interpreter; see the setup lines in --help")
    package = types.ModuleType("stepaudio2")
    package.__path__ = [str(path)]
    sys.modules["stepaudio2"] = package
    from stepaudio2.causal_vocoder import bounded_vocoder, f0_predictor, generator

    return types.SimpleNamespace(generator=generator, f0_predictor=f0_predictor, bounded=bounded_vocoder)


def _pair(
    modules: types.SimpleNamespace, config: CausalHiFTConfig, folder: Path, seed: int = 1986
) -> tuple[CausalHiFTGenerator, torch.nn.Module]:
    """Ours and the reference on the same stand-in weights; the reference built after torch.manual_seed(seed)."""
    reduced = config == REDUCED_CAUSAL_HIFT_CONFIG
    path = write_standin_causal_hift(folder / f"hift_{'reduced' if reduced else 'full'}.pt", reduced=reduced, seed=3)
    ours = load_causal_hift(path, device="cpu", noise=NoiseOrigin.vocoder_yaml(config, seed))
    torch.manual_seed(seed)
    ref = reference_causal_hift(modules, config)
    ref.load_state_dict(torch.load(path, weights_only=True), strict=True)  # the key layout, proven both ways
    return ours, ref.eval()


def _mel(frames: int, seed: int = 7) -> torch.Tensor:
    return standin_mel(frames, seed=seed)


# -- checks --------------------------------------------------------------------------------------


def check_noise(args: argparse.Namespace) -> None:
    cv = _cosyvoice(args.cosyvoice)
    config = FULL_CAUSAL_HIFT_CONFIG
    print("noise table (full size):")
    with torch.random.fork_rng():
        torch.manual_seed(12345)  # whatever ran before: the CFM reseeds
        cfm_params = types.SimpleNamespace(
            sigma_min=1e-6,
            solver="euler",
            t_scheduler="cosine",
            training_cfg_rate=0.2,
            inference_cfg_rate=0.7,
            reg_loss_type="l1",
        )
        decoder = cv.cfm.CausalConditionalCFM(in_channels=240, cfm_params=cfm_params, n_spks=1, spk_emb_dim=80)
        cv.flow.CausalMaskedDiffWithDiT(
            input_size=80,
            output_size=80,
            spk_embed_dim=192,
            output_type="mel",
            vocab_size=6561,
            input_frame_rate=25,
            only_mask_loss=True,
            token_mel_ratio=2,
            pre_lookahead_len=3,
            pre_lookahead_layer=None,
            decoder=decoder,
        )
        cosyvoice3_ref = reference_causal_hift(cv, config).m_source.l_sin_gen.sine_waves[0]
        torch.manual_seed(1986)
        yaml_ref = reference_causal_hift(cv, config).m_source.l_sin_gen.sine_waves[0]
    for name, origin, ref in (
        ("cosyvoice3 loader", NoiseOrigin.cosyvoice3(config), cosyvoice3_ref),
        ("vocoder-only yaml, seed 1986", NoiseOrigin.vocoder_yaml(config), yaml_ref),
    ):
        table = GeneratedNoiseTable.for_config(config, origin)
        whole = table.window(0, table.length)
        equal = torch.equal(whole, ref)
        print(f"  {name} ({origin.describe()}): whole table {tuple(whole.shape)} equal: {equal}")
        if not equal:
            FAILURES.append(f"noise {name}")
        # Streaming reads: odd window sizes through the 300 s wrap.
        cursor = table.start()
        cursor = dataclasses.replace(cursor, position=0)
        _, cursor = table.read(cursor, table.length - 5000)
        values, cursor = table.read(cursor, 12_345)
        expected = torch.cat([ref[-5000:], ref[:7345]])
        ok = torch.equal(values, expected)
        print(f"    streamed window across the wrap equal: {ok}")
        if not ok:
            FAILURES.append(f"noise wrap {name}")


def _config(args: argparse.Namespace) -> CausalHiFTConfig:
    return FULL_CAUSAL_HIFT_CONFIG if args.config == "full" else REDUCED_CAUSAL_HIFT_CONFIG


def check_whole(args: argparse.Namespace, folder: Path) -> None:
    cv = _cosyvoice(args.cosyvoice)
    config = _config(args)
    with torch.random.fork_rng():
        ours, ref = _pair(cv, config, folder)
    keys = len(ref.state_dict())
    params = sum(p.numel() for p in ref.parameters())
    print(f"whole utterance ({args.config}; reference: {keys} keys, {params:,} parameters):")
    if config == FULL_CAUSAL_HIFT_CONFIG and (keys, params) != (FULL_CAUSAL_HIFT_NUM_KEYS, FULL_CAUSAL_HIFT_NUM_PARAMS):
        FAILURES.append("full-size counts")
    frames = int(args.seconds * 50)
    for length in (frames, 9, 23):
        mel = _mel(length)
        for finalize in (True, False):
            ref_out, _ = ref.inference(mel, finalize=finalize)
            with torch.inference_mode():
                ours_out = ours.inference(mel, finalize=finalize)
            report(f"T={length} finalize={finalize}", ours_out, ref_out)


def _chunks(total: int, sizes: list[int]) -> list[int]:
    out, i = [], 0
    while sum(out) < total:
        out.append(min(sizes[min(i, len(sizes) - 1)], total - sum(out)))
        i += 1
    return out


def check_stream(args: argparse.Namespace, folder: Path) -> None:
    cv = _cosyvoice(args.cosyvoice)
    config = _config(args)
    with torch.random.fork_rng():
        ours, ref = _pair(cv, config, folder)
    frames = int(args.seconds * 50)
    mel = _mel(frames, seed=11)
    # Upstream hops: 25 tokens (50 frames), then x2 up to 100 tokens (200 frames).
    sizes = _chunks(frames, [50, 100, 200])
    print(f"upstream CosyVoice3 streaming ({args.config}, {frames} frames in chunks {sizes}):")
    streamer = CausalHiFTStreamer(ours, COSYVOICE3_STREAM)
    state = streamer.start()
    offset, end, emitted_ref, emitted_ours = 0, 0, [], []
    for k, size in enumerate(sizes):
        end += size
        last = end == frames
        speech, _ = ref.inference(mel[..., :end], finalize=last)  # CosyVoice3Model.token2wav's hift call
        ref_chunk = speech[:, offset:]
        offset += ref_chunk.shape[1]
        ours_chunk, state = streamer.push(state, mel[..., end - size : end], finalize=last)
        report(f"chunk {k} ({end} frames, last={last})", ours_chunk, ref_chunk)
        emitted_ref.append(ref_chunk)
        emitted_ours.append(ours_chunk)
    report("all chunks", torch.cat(emitted_ours, 1), torch.cat(emitted_ref, 1))
    # For scale: how far the reference's own streaming is from its own whole-utterance output.
    whole, _ = ref.inference(mel, finalize=True)
    report("reference streaming vs reference whole (not a check)", torch.cat(emitted_ref, 1), whole, float("inf"))
    with torch.inference_mode():
        report("our streaming vs our whole", torch.cat(emitted_ours, 1), ours.inference(mel))


def check_minicpmo(args: argparse.Namespace, folder: Path) -> None:
    sa = _stepaudio2()
    config = _config(args)
    with torch.random.fork_rng():
        ours, ref = _pair(sa, config, folder)
    bounded = sa.bounded.BoundedVocoder(ref)  # Token2wav builds it with the default block_frames
    f0_left, f0_right, history = sa.bounded.context_sizes(ref)
    print(
        f"minicpmo-utils 1.0.7 BoundedVocoder ({args.config}): f0 left {f0_left}, right {f0_right}, "
        f"decoder history {history}, decoder right {bounded.decoder_right}, delay {bounded.delay}, "
        f"block {bounded.block_frames}, leading zeros {bounded.delay * bounded.hop}"
    )
    ours_numbers = (
        2 * (config.f0_layers - 1),
        config.f0_lookahead,
        config.min_emit_lag_frames,
        MINICPMO_1_0_7_STREAM.emit_lag_frames,
        MINICPMO_1_0_7_STREAM.block_frames,
        MINICPMO_1_0_7_STREAM.leading_silence_samples,
    )
    theirs = (
        f0_left,
        f0_right,
        bounded.decoder_right,
        bounded.delay,
        bounded.block_frames,
        bounded.delay * bounded.hop,
    )
    verdict = "ok" if ours_numbers == theirs else "FAIL"
    print(f"  ours: f0 left/right, decoder right, delay, block, zeros = {ours_numbers}: {verdict}")
    if ours_numbers != theirs:
        FAILURES.append("minicpmo numbers")
    frames = int(args.seconds * 50)
    mel = _mel(frames, seed=13)
    for sizes in (_chunks(frames, [50]), _chunks(frames, [7, 16, 33, 1, 50, 21])):
        print(f"  chunks {sizes[:8]}{' ...' if len(sizes) > 8 else ''}:")
        bounded.reset()
        cache = bounded.cache
        cache["first_chunk"] = torch.ones(1, dtype=torch.long)
        streamer = CausalHiFTStreamer(ours, MINICPMO_1_0_7_STREAM)
        state = streamer.start()
        end, all_ref, all_ours = 0, [], []
        for k, size in enumerate(sizes):
            chunk = mel[..., end : end + size]
            end += size
            last = end == frames
            # Token2wav._stream_vocode (minicpmo-utils 1.0.7), line for line:
            bounded.cache = cache
            speech = bounded.stream(chunk, finalize=last)
            if speech.shape[-1] and bool(cache["first_chunk"].item()):
                cache["first_chunk"].zero_()
                if not last:
                    speech = torch.cat([speech.new_zeros(1, 3840), speech], dim=1)
            ours_chunk, state = streamer.push(state, chunk, finalize=last)
            if k < 3 or last:
                report(f"chunk {k} (+{size}, last={last})", ours_chunk, speech)
            all_ref.append(speech)
            all_ours.append(ours_chunk)
        report("all chunks", torch.cat(all_ours, 1), torch.cat(all_ref, 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cosyvoice", type=Path, help="folder holding CosyVoice's cosyvoice/ package (ace7c47)")
    parser.add_argument("--config", choices=("full", "reduced"), default="reduced")
    parser.add_argument("--seconds", type=float, default=6.0, help="mel length of the vocoding checks")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("what", choices=("noise", "whole", "stream", "minicpmo", "all"))
    args = parser.parse_args()
    needs_cosyvoice = args.what in ("noise", "whole", "stream", "all")
    if needs_cosyvoice and (args.cosyvoice is None or not (args.cosyvoice / "cosyvoice" / "hifigan").is_dir()):
        parser.error("--cosyvoice must name a folder with cosyvoice/hifigan inside; see the setup lines in --help")
    torch.set_num_threads(args.threads)
    checks: dict[str, Callable[..., None]] = {
        "noise": lambda folder: check_noise(args),
        "whole": lambda folder: check_whole(args, folder),
        "stream": lambda folder: check_stream(args, folder),
        "minicpmo": lambda folder: check_minicpmo(args, folder),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in checks.items():
            if args.what in (name, "all"):
                check(Path(tmp))
    print("FAILED: " + ", ".join(FAILURES) if FAILURES else "all checks within tolerance")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
