# SPDX-License-Identifier: Apache-2.0
"""What running vLLM-Omni 0.30's own CosyVoice3 code2wav on our full-size stand-in costs on this host.

Upstream's `CosyVoice3Code2Wav` hard-codes the real sizes, so an engine A/B against it needs the
real-size stand-in folder (`ensure_standin_cosyvoice3_dir(reduced=False)`). This probe writes that
folder (into `--out`, or uses the cached one), then times: building upstream's module, its strict
`load_weights`, our loaders on the same folder, and whole-utterance forwards of `--tokens` codec ids
(25 per second of audio) after a `--prompt-tokens` prompt at `--steps` Euler steps (upstream serves 10).
Prints one JSON object. Needs the engine venv (vLLM CPU build + vLLM-Omni 0.30).

    PYTHONPATH=$PWD python tools/probe_upstream_cosyvoice3.py --tokens 50 --steps 10 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - start, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write a fresh folder here (default: the cached one)")
    parser.add_argument("--tokens", type=int, default=50, help="codec ids per forward (25 = 1 s of audio)")
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from vllm_omni.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
    from vllm_omni.transformers_utils.configs.cosyvoice3 import CosyVoice3Config

    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import load_flow
    from vllm_omni_token2wav.model_executor.layers.hift_causal import load_causal_hift
    from vllm_omni_token2wav.model_executor.models.cosyvoice3 import standin
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import read_prompt_tokens, voice_tokens_path

    report: dict[str, Any] = {"threads": args.threads, "load_average": os.getloadavg()}
    if args.out is not None:
        folder, report["generate_s"] = _timed(lambda: standin.write_standin_cosyvoice3_dir(args.out, reduced=False))
    else:
        folder, report["ensure_cached_s"] = _timed(lambda: standin.ensure_standin_cosyvoice3_dir(reduced=False))
    report["folder"] = str(folder)
    report["file_bytes"] = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if not p.name.startswith(".")}

    model, report["upstream_build_s"] = _timed(lambda: CosyVoice3Code2Wav(CosyVoice3Config()))
    _, report["upstream_load_weights_s"] = _timed(lambda: model.load_weights(str(folder), torch.device("cpu")))
    _, report["ours_load_flow_s"] = _timed(lambda: load_flow(folder, device="cpu"))
    _, report["ours_load_causal_hift_s"] = _timed(lambda: load_causal_hift(folder / "hift.pt", device="cpu"))

    wav = folder / "default_voice.wav"
    ids = read_prompt_tokens(voice_tokens_path(wav))[:, : args.prompt_tokens]
    prompt = CosyVoice3Token2Wav(folder, device="cpu").prompt(str(wav), ids)
    tokens = torch.randint(0, 6561, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    forwards = []
    for _ in range(args.repeat):
        torch.manual_seed(0)
        start = time.perf_counter()
        with torch.inference_mode():
            mel = model._forward_mel(
                tokens,
                prompt.tokens,
                prompt.mel,
                prompt.embedding,
                n_timesteps=args.steps,
                streaming=False,
                finalize=True,
            )
            flow_s = time.perf_counter() - start
            audio, _, _ = model.hift.inference(speech_feat=mel.float(), finalize=True)
        total = time.perf_counter() - start
        forwards.append({"flow_s": round(flow_s, 2), "hift_s": round(total - flow_s, 2), "total_s": round(total, 2)})
    report["forward"] = {
        "tokens": args.tokens,
        "prompt_tokens": int(prompt.tokens.shape[1]),
        "steps": args.steps,
        "audio_s": audio.shape[-1] / 24000,
        "runs": forwards,
    }
    report["max_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
