#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cross-check CosyVoice3's code2wav end to end against the public reference code (manual, not CI).

Why: CI pins the flow and the causal HiFT to small independent re-implementations, and the two manual
tools (`check_cosyvoice3_flow_reference.py`, `check_causal_hift_reference.py`) check each model against
FunAudioLLM/CosyVoice's own code. This one checks the chain as the stage runs it: speech token ids +
prompt features (tokens, mel, CAM++ embedding; seeded, the front end is not part of it) -> audio,
through `cosyvoice3.synthesis` (what the facade and the stage call), against the reference's
`CausalMaskedDiffWithDiT` + `CausalHiFTGenerator` on the same weights and the same noise:

- the reference is built in cosyvoice3.yaml's order (pre-lookahead, DiT, CFM, flow, F0 predictor,
  vocoder), so its two noise tables are the ones CosyVoice's loader draws; the check prints whether
  they equal ours (`noise_table(0)` and the causal HiFT's `NoiseOrigin.cosyvoice3`);
- `whole`: `flow.inference(streaming=False, finalize=True)` then `hift.inference(finalize=True)`
  (`CosyVoice3Model.tts(stream=False)`) vs `synthesize_whole(..., noise_seed=0)`;
- `stream`: `CosyVoice3Model.tts(stream=True)`: per call the flow re-run over the prefix (`streaming=
  True, finalize=False`; the last call `streaming=False, finalize=True`), the mel past the offset
  appended to the request's mel, `hift.inference(all mel, finalize=last)` past the samples already
  emitted; vs our stream (`open_stream` + `stream_rows`) with the default `FinalChunk.FULL_ATTENTION`
  (upstream's last call exactly) and the opt-in `FinalChunk.BLOCK_CAUSAL`.

For each it prints the mel difference (flow), the audio difference of the whole chain, and the audio
difference of our vocoder fed the reference's mel (the vocoder alone): the chain amplifies a 1e-6 mel
difference (the F0 predictor feeds the sine phase and the voiced/unvoiced switch), so the last column
separates rounding of the flow from any vocoder difference.

Set-up (a venv of its own; the reference is never imported by library code nor committed):

    python3 -m venv /tmp/cv3ref
    /tmp/cv3ref/bin/pip install torch==2.13.0 x-transformers==2.11.24 einops omegaconf numpy pyyaml filelock scipy
    git clone https://github.com/FunAudioLLM/CosyVoice /tmp/cv3ref/CosyVoice
    git -C /tmp/cv3ref/CosyVoice checkout ace7c47

then from the repository root:

    /tmp/cv3ref/bin/python tools/check_cosyvoice3_e2e_reference.py --reference /tmp/cv3ref/CosyVoice
    /tmp/cv3ref/bin/python tools/check_cosyvoice3_e2e_reference.py --reference /tmp/cv3ref/CosyVoice \\
        --config real --n-timesteps 2 --tokens 160          # full size: ~4 GB RAM, tens of minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (  # noqa: E402
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    CausalMaskedDiffWithDiT,
    FinalChunk,
    noise_table,
    stream_calls,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal import (  # noqa: E402
    FULL_CAUSAL_HIFT_CONFIG,
    REDUCED_CAUSAL_HIFT_CONFIG,
    load_causal_hift,
    write_standin_causal_hift,
)
from vllm_omni_token2wav.model_executor.model_loader.state_dict import standin_state_dict  # noqa: E402
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import CosyVoice3Prompt  # noqa: E402
from vllm_omni_token2wav.model_executor.models.cosyvoice3.synthesis import (  # noqa: E402
    StreamRow,
    open_stream,
    stream_rows,
    synthesize_whole,
)
from vllm_omni_token2wav.tools.cosyvoice_reference import (  # noqa: E402
    diff_stats,
    reference_causal_hift,
    reference_cosyvoice3_flow,
    reference_flow_call,
    seeded_inputs,
)


def _models(args: argparse.Namespace, folder: Path) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """(our flow, our HiFT, reference flow, reference HiFT, facts) on the same seeded weights."""
    real = args.config == "real"
    flow_config = REAL_FLOW_CONFIG if real else REDUCED_FLOW_CONFIG
    hift_config = FULL_CAUSAL_HIFT_CONFIG if real else REDUCED_CAUSAL_HIFT_CONFIG
    ours_flow = CausalMaskedDiffWithDiT(flow_config).eval()
    ours_flow.load_state_dict(standin_state_dict(ours_flow, seed=args.seed), strict=True)
    hift_path = write_standin_causal_hift(folder / "hift.pt", reduced=not real, seed=args.seed)
    ours_hift = load_causal_hift(hift_path, device="cpu")  # noise: NoiseOrigin.cosyvoice3, CosyVoice's loader
    with torch.random.fork_rng():
        torch.manual_seed(1986)  # cosyvoice3.yaml's seed line; the CFM reseeds 0 before drawing anyway
        ref_flow = reference_cosyvoice3_flow(args.reference, flow_config)
        from cosyvoice.hifigan import f0_predictor, generator

        modules = types.SimpleNamespace(generator=generator, f0_predictor=f0_predictor)
        ref_hift = reference_causal_hift(modules, hift_config)
    ref_flow.load_state_dict(ours_flow.state_dict(), strict=True)
    ref_hift.load_state_dict(torch.load(hift_path, weights_only=True), strict=True)
    ref_hift.eval()
    if args.n_timesteps != 10:  # the reference's flow.inference hard-codes 10 steps
        original = ref_flow.decoder.forward

        def forward(*a: Any, **kw: Any) -> Any:
            return original(*a, **{**kw, "n_timesteps": args.n_timesteps})

        ref_flow.decoder.forward = forward
    sines = ref_hift.m_source.l_sin_gen.sine_waves[0]
    facts = {
        "config": args.config,
        "flow_noise_table_equal": bool(torch.equal(ref_flow.decoder.rand_noise, noise_table(0))),
        "hift_noise_table_equal": bool(torch.equal(ours_hift.noise.window(0, sines.shape[0]), sines)),
    }
    return ours_flow, ours_hift, ref_flow, ref_hift, facts


def _prompt(args: argparse.Namespace) -> tuple[CosyVoice3Prompt, torch.Tensor]:
    pt, pm, spk, tok = seeded_inputs(args.prompt_tokens, args.tokens)
    return CosyVoice3Prompt(pt, pm, spk, "seeded"), tok


def whole(args: argparse.Namespace, models: tuple[Any, ...]) -> dict[str, Any]:
    ours_flow, ours_hift, ref_flow, ref_hift = models
    prompt, tok = _prompt(args)
    ours = synthesize_whole(ours_flow, ours_hift, prompt, tok, n_timesteps=args.n_timesteps, noise_seed=0)
    ref_mel = reference_flow_call(
        ref_flow, tok, prompt.tokens, prompt.mel, prompt.embedding, streaming=False, finalize=True
    )
    ref_audio, _ = ref_hift.inference(ref_mel, finalize=True)
    mel = ours_flow.inference(
        tok,
        tok.size(1),
        prompt.tokens,
        prompt.num_tokens,
        prompt.mel,
        prompt.mel.size(1),
        prompt.embedding,
        n_timesteps=args.n_timesteps,
    )
    return {
        "mel": diff_stats(mel, ref_mel),
        "audio_chain": diff_stats(ours, ref_audio),
        "audio_vocoder_on_reference_mel": diff_stats(ours_hift.inference(ref_mel), ref_audio),
        "samples": int(ours.shape[-1]),
    }


def stream(args: argparse.Namespace, models: tuple[Any, ...]) -> dict[str, Any]:
    ours_flow, ours_hift, ref_flow, ref_hift = models
    from vllm_omni_token2wav.model_executor.layers.hift_causal import COSYVOICE3_STREAM, CausalHiFTStreamer

    streamer = CausalHiFTStreamer(ours_hift, COSYVOICE3_STREAM)
    prompt, tok = _prompt(args)
    calls = stream_calls(tok.size(1), prompt.num_tokens)
    out: dict[str, Any] = {"calls": [(c.start, c.end, c.final) for c in calls]}
    for final_chunk in (FinalChunk.FULL_ATTENTION, FinalChunk.BLOCK_CAUSAL):
        caches = open_stream(
            ours_flow, streamer, prompt, n_timesteps=args.n_timesteps, noise_seed=0, final_chunk=final_chunk
        )
        ref_mel_all: list[torch.Tensor] = []
        ours_audio, ref_audio, rows = [], [], []
        emitted = 0
        for call in calls:
            ((audio, caches),) = stream_rows(
                ours_flow, streamer, [StreamRow(caches, tok[:, call.start : call.end], call.final)]
            )
            # CosyVoice3Model.tts: the last call runs with streaming=False (our default FULL_ATTENTION); the
            # opt-in block-causal last chunk is compared with the reference's streaming=True, finalize=True
            streaming = not call.final or final_chunk is FinalChunk.BLOCK_CAUSAL
            mel = reference_flow_call(
                ref_flow,
                tok[:, : call.end],
                prompt.tokens,
                prompt.mel,
                prompt.embedding,
                streaming=streaming,
                finalize=call.final,
            )[:, :, 2 * call.offset :]
            ref_mel_all.append(mel)
            speech, _ = ref_hift.inference(torch.cat(ref_mel_all, dim=2), finalize=call.final)
            speech = speech[:, emitted:]
            emitted += speech.shape[-1]
            if speech.shape[-1] != audio.shape[-1]:
                raise SystemExit(f"chunk ending at {call.end}: {audio.shape[-1]} vs {speech.shape[-1]} samples")
            rows.append(
                {"end": call.end, "final": call.final, "ref_streaming": streaming, **diff_stats(audio, speech[0])}
            )
            ours_audio.append(audio)
            ref_audio.append(speech[0])
        vocoder_only = ours_hift.inference(torch.cat(ref_mel_all, dim=2))[0]
        out[f"final={final_chunk.value}"] = {
            "chunks": rows,
            "audio_chain": diff_stats(torch.cat(ours_audio), torch.cat(ref_audio)),
            "audio_vocoder_on_reference_mel": diff_stats(vocoder_only, torch.cat(ref_audio)),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="a FunAudioLLM/CosyVoice checkout")
    parser.add_argument("--config", choices=("real", "reduced"), default="reduced")
    parser.add_argument("--seed", type=int, default=0, help="stand-in weight seed")
    parser.add_argument("--prompt-tokens", type=int, default=33)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--n-timesteps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if not (args.reference / "cosyvoice" / "hifigan" / "generator.py").is_file():
        parser.error(f"{args.reference}: no cosyvoice/hifigan/generator.py inside; see the set-up lines in --help")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder, torch.inference_mode():
        *models, facts = _models(args, Path(folder))
        result = {
            "torch": torch.__version__,
            "reference": str(args.reference),
            "prompt_tokens": args.prompt_tokens,
            "tokens": args.tokens,
            "n_timesteps": args.n_timesteps,
            **facts,
            "whole": whole(args, tuple(models)),
            "stream": stream(args, tuple(models)),
        }
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
