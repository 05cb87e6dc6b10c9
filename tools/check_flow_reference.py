#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cross-check the in-tree flow model against the upstream reference implementation (manual, not CI).

Why: CI pins each flow component to small references written in the tests; this runs the whole
model next to the reference `stepaudio2.cosyvoice2` code (bundled in the `minicpmo-utils` wheel) on
the same seeded weights and noise, whole-utterance and streaming (with the reference driver's
trimming), and prints the largest differences. The reference is installed outside the project
environment and never imported by library code:

    .venv/bin/pip install --no-deps --target /tmp/refpkgs minicpmo-utils einops
    .venv/bin/python tools/check_flow_reference.py --reference /tmp/refpkgs whole --config reduced
    .venv/bin/python tools/check_flow_reference.py --reference /tmp/refpkgs stream --n-timesteps 2

Streaming needs the real DiT dimensions (the reference's scratch buffers are sized for them) and
about 5 GB of RAM for those buffers.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from vllm_omni_token2wav.model_executor.layers.flow import (  # noqa: E402
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    CausalMaskedDiffWithXvec,
    ConformerTrim,
    Lookahead,
    build_flow,
    standin_state_dict,
)
from vllm_omni_token2wav.tools.cosyvoice_reference import seeded_inputs  # noqa: E402


def _reference_flow(reference: Path, config: dict[str, Any]) -> torch.nn.Module:
    # The wheel's top-level `stepaudio2/__init__.py` imports torchaudio-based tools; only the
    # `cosyvoice2` sub-package is needed, so register a bare package object for `stepaudio2`.
    sys.path.insert(0, str(reference))
    package = types.ModuleType("stepaudio2")
    package.__path__ = [str(reference / "stepaudio2")]
    sys.modules["stepaudio2"] = package
    from stepaudio2.cosyvoice2.flow.decoder_dit import DiT
    from stepaudio2.cosyvoice2.flow.flow import CausalMaskedDiffWithXvec as RefFlow
    from stepaudio2.cosyvoice2.flow.flow_matching import CausalConditionalCFM
    from stepaudio2.cosyvoice2.transformer.upsample_encoder_v2 import UpsampleConformerEncoderV2

    decoder = CausalConditionalCFM(
        DiT(**config["decoder"]["estimator"]), inference_cfg_rate=config["decoder"]["inference_cfg_rate"]
    )
    top = {k: v for k, v in config.items() if k not in ("encoder", "decoder")}
    return RefFlow(**top, encoder=UpsampleConformerEncoderV2(**config["encoder"]), decoder=decoder).eval()


def _pair(reference: Path, config: dict[str, Any]) -> tuple[CausalMaskedDiffWithXvec, torch.nn.Module]:
    mine = build_flow(config).eval()
    mine.load_state_dict(standin_state_dict(mine, seed=0))
    ref = _reference_flow(reference, config)
    ref.load_state_dict(mine.state_dict(), strict=True)  # also proves the key layout against the reference
    ref.decoder.rand_noise.copy_(mine.decoder.rand_noise)
    return mine, ref


def _diff(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"max |diff| {(a.double() - b.double()).abs().max().item():.2e} (max |ref| {b.abs().max().item():.2f})"


def whole(args: argparse.Namespace) -> None:
    mine, ref = _pair(args.reference, REAL_FLOW_CONFIG if args.config == "real" else REDUCED_FLOW_CONFIG)
    pt, pm, spk, tok = seeded_inputs(20, 30)
    call = (tok, torch.tensor([30]), pt, torch.tensor([20]), pm, torch.tensor([40]), spk, args.n_timesteps)
    print("whole-utterance mel:", _diff(mine.inference(*call), ref.inference(*call)))


def stream(args: argparse.Namespace) -> None:
    mine, ref = _pair(args.reference, REAL_FLOW_CONFIG)
    n, trim_conformer = args.n_timesteps, args.conformer_trim
    pt, pm, spk, tok = seeded_inputs(30, 25 * 4 + 9)
    p = pm.size(1)
    trim = ConformerTrim.PROMPT_PLUS_TAIL if trim_conformer else ConformerTrim.NONE
    cache = mine.setup_cache(pt, pm, spk, n, lookahead=Lookahead.PROMPT_HEAD, conformer_trim=trim)
    ref_cache = ref.setup_cache(torch.cat([pt, pt[:, :3]], 1), pm, spk, n_timesteps=n)
    pos, index = 0, 0
    while True:
        last = tok.size(1) - pos <= 28
        chunk = tok[:, pos:] if last else tok[:, pos : pos + 28]
        mel, cache = mine.inference_chunk(chunk, spk, cache, last, n)
        ref_mel, ref_cache = ref.inference_chunk(chunk, spk, ref_cache, last, n)
        # the reference facades trim after every call (Step-Audio2; the conformer cut is MiniCPM-o's)
        est = ref_cache["estimator_att_cache"]
        if est.size(4) > p + 100:
            ref_cache["estimator_att_cache"] = torch.cat([est[..., :p, :], est[..., -100:, :]], dim=4)
        conf = ref_cache["conformer_att_cache"]
        if trim_conformer and conf.size(3) > p + 100:
            ref_cache["conformer_att_cache"] = torch.cat([conf[..., :p, :], conf[..., -100:, :]], dim=3)
        ref_cache = {k: v.clone() for k, v in ref_cache.items()}  # detach from the reference's scratch buffers
        est_diff = _diff(cache.estimator_att_cache, ref_cache["estimator_att_cache"][:n])
        print(f"chunk {index} (last={last}) mel: {_diff(mel, ref_mel)}; estimator cache: {est_diff}")
        index += 1
        if last:
            break
        pos += 25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="pip --target dir holding stepaudio2/")
    parser.add_argument("--threads", type=int, default=1)
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("whole")
    w.add_argument("--config", choices=("real", "reduced"), default="reduced")
    w.add_argument("--n-timesteps", type=int, default=10)
    s = sub.add_parser("stream")
    s.add_argument("--n-timesteps", type=int, default=2)
    s.add_argument("--conformer-trim", action="store_true", help="also apply MiniCPM-o's conformer cache cut")
    args = parser.parse_args()
    if not (args.reference / "stepaudio2" / "cosyvoice2").is_dir():
        parser.error(f"{args.reference}: no stepaudio2/cosyvoice2 inside; see the install line in --help")
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        (whole if args.what == "whole" else stream)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
