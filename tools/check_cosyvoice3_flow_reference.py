#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cross-check the in-tree CosyVoice3 flow against the public reference code (manual, not CI).

Why: CI pins the flow to small independent re-implementations written in the tests; this runs the
whole model next to FunAudioLLM/CosyVoice's own `CausalMaskedDiffWithDiT` on the same seeded weights
(loaded strictly both ways, which also proves the key layout) and the same noise (the reference draws
its table itself at construction; this checks it equals ours), and prints the largest differences:
- whole utterance, full attention (`streaming=False, finalize=True`) and block-causal (`streaming=True`);
- streaming over upstream's schedule (hops 25 + pad, 50, 100): every chunk of our cached stream against
  the reference's prefix re-run as `CosyVoice3Model.tts` calls it (non-final: `streaming=True,
  finalize=False`; final: `finalize=True, streaming=False`), with our default `FinalChunk.FULL_ATTENTION`
  (expected equal everywhere) and our opt-in `FinalChunk.BLOCK_CAUSAL` (equal except the last chunk,
  which is then compared with the reference's `streaming=True, finalize=True`).

The reference runs outside the project environment and is never committed or imported by library code.
Set it up once (torch CPU build, the packages the flow code imports, the code at a known commit):

    python3 -m venv /tmp/cv3ref
    /tmp/cv3ref/bin/pip install torch==2.13.0 x-transformers==2.11.24 einops omegaconf numpy pyyaml filelock
    git clone https://github.com/FunAudioLLM/CosyVoice /tmp/cv3ref/CosyVoice
    git -C /tmp/cv3ref/CosyVoice checkout ace7c47   # the commit these notes were checked against

then, from the repository root:

    /tmp/cv3ref/bin/python tools/check_cosyvoice3_flow_reference.py --reference /tmp/cv3ref/CosyVoice whole
    /tmp/cv3ref/bin/python tools/check_cosyvoice3_flow_reference.py --reference /tmp/cv3ref/CosyVoice stream
    /tmp/cv3ref/bin/python tools/check_cosyvoice3_flow_reference.py --reference /tmp/cv3ref/CosyVoice \
        --config real stream --n-timesteps 2        # full size: ~3 GB RAM, minutes on 2 cores

Modules the flow files import but never use on this path are replaced by empty stand-ins so no
audio / ONNX / training stack is needed: `torchaudio` (mel front end), `cosyvoice.utils.onnx`
(online tokenizer), `cosyvoice.utils.class_utils`. Matcha-TTS's `BASECFM` (a git submodule upstream)
is replaced by a base class that stores the same constructor attributes; the reference CFM overrides
everything that computes.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    start_stream,
    stream_calls,
    stream_chunk,
)
from vllm_omni_token2wav.model_executor.model_loader.state_dict import standin_state_dict  # noqa: E402
from vllm_omni_token2wav.tools.cosyvoice_reference import (  # noqa: E402
    diff_stats,
    reference_cosyvoice3_flow,
    reference_flow_call,
    seeded_inputs,
)


def _pair(args: argparse.Namespace) -> tuple[CausalMaskedDiffWithDiT, torch.nn.Module, dict[str, Any]]:
    config = REAL_FLOW_CONFIG if args.config == "real" else REDUCED_FLOW_CONFIG
    mine = CausalMaskedDiffWithDiT(config).eval()
    mine.load_state_dict(standin_state_dict(mine, seed=args.seed), strict=True)
    ref = reference_cosyvoice3_flow(args.reference, config)
    ref.load_state_dict(mine.state_dict(), strict=True)  # proves the key layout against the reference
    if args.n_timesteps != 10:  # the reference's flow.inference hard-codes 10 steps: override its decoder call
        original = ref.decoder.forward

        def forward(*a: Any, **kw: Any) -> Any:
            return original(*a, **{**kw, "n_timesteps": args.n_timesteps})

        ref.decoder.forward = forward
    info = {
        "config": args.config,
        "keys": len(mine.state_dict()),
        "params": sum(p.numel() for p in mine.parameters()),
        "noise_table_equal": bool(torch.equal(ref.decoder.rand_noise, noise_table(0))),
    }
    return mine, ref, info


def whole(args: argparse.Namespace) -> dict[str, Any]:
    mine, ref, info = _pair(args)
    pt, pm, spk, tok = seeded_inputs(args.prompt_tokens, args.tokens)
    out: dict[str, Any] = {**info, "prompt_tokens": args.prompt_tokens, "tokens": args.tokens}
    out["n_timesteps"] = args.n_timesteps
    for streaming in (False, True):
        a = mine.inference(
            tok, tok.size(1), pt, pt.size(1), pm, pm.size(1), spk, streaming=streaming, n_timesteps=args.n_timesteps
        )
        b = reference_flow_call(ref, tok, pt, pm, spk, streaming=streaming, finalize=True)
        out[f"whole_streaming={streaming}"] = diff_stats(a, b)
    return out


def stream(args: argparse.Namespace) -> dict[str, Any]:
    mine, ref, info = _pair(args)
    n = args.n_timesteps
    pt, pm, spk, tok = seeded_inputs(args.prompt_tokens, args.tokens)
    calls = stream_calls(tok.size(1), pt.size(1))
    out: dict[str, Any] = {**info, "prompt_tokens": args.prompt_tokens, "tokens": args.tokens, "n_timesteps": n}
    for final_chunk in (FinalChunk.FULL_ATTENTION, FinalChunk.BLOCK_CAUSAL):
        state = start_stream(mine, pt, pm, spk, n_timesteps=n, final_chunk=final_chunk)
        rows = []
        for call in calls:
            mel, state = stream_chunk(mine, state, tok[:, call.start : call.end], final=call.final)
            # CosyVoice3Model.tts: non-final calls streaming=True; the final call streaming=False
            upstream_streaming = not call.final or final_chunk is FinalChunk.BLOCK_CAUSAL
            ref_mel = reference_flow_call(
                ref, tok[:, : call.end], pt, pm, spk, streaming=upstream_streaming, finalize=call.final
            )[:, :, 2 * call.offset :]
            if mel.shape != ref_mel.shape:
                raise SystemExit(f"chunk ending at {call.end}: shapes {tuple(mel.shape)} vs {tuple(ref_mel.shape)}")
            row = {
                "end": call.end,
                "final": call.final,
                "ref_streaming": upstream_streaming,
                **diff_stats(mel, ref_mel),
            }
            if call.final and upstream_streaming:  # how far the default last chunk is from upstream's full re-run
                full = reference_flow_call(ref, tok, pt, pm, spk, streaming=False, finalize=True)[
                    :, :, 2 * call.offset :
                ]
                row["vs_upstream_full_final"] = diff_stats(mel, full)
            rows.append(row)
        out[f"stream_final={final_chunk.value}"] = rows
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="a FunAudioLLM/CosyVoice checkout")
    parser.add_argument("--config", choices=("real", "reduced"), default="reduced")
    parser.add_argument("--seed", type=int, default=0, help="stand-in weight seed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("whole")
    w.add_argument("--prompt-tokens", type=int, default=33)
    w.add_argument("--tokens", type=int, default=90)
    w.add_argument("--n-timesteps", type=int, default=10)
    s = sub.add_parser("stream")
    s.add_argument("--prompt-tokens", type=int, default=33)
    s.add_argument("--tokens", type=int, default=260)
    s.add_argument("--n-timesteps", type=int, default=10)
    args = parser.parse_args()
    if not (args.reference / "cosyvoice" / "flow" / "DiT" / "dit.py").is_file():
        parser.error(f"{args.reference}: no cosyvoice/flow/DiT/dit.py inside; see the set-up lines in --help")
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        result = whole(args) if args.what == "whole" else stream(args)
    result = {"torch": torch.__version__, "reference": str(args.reference), **result}
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
