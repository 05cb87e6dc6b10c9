# SPDX-License-Identifier: Apache-2.0
"""The MiniCPM-o 1.0.7-layout stand-in as minicpmo-utils 1.0.7's own `Token2wav` loads it.

minicpmo-utils 1.0.7 is what reads MiniCPM-o's causal-vocoder layout (`config.yaml` + causal `hift.pt` +
`hift_original.pt`, `minicpmo_4_5/variants.py`). Its `Token2wav.__init__` checks the seven files, converts the
speech tokenizer with its vendored `s3tokenizer.load_model`, opens `campplus.onnx` in onnxruntime, builds the
flow from `flow.yaml` (hyperpyyaml) and strict-loads `flow.pt`, loads the causal vocoder from `config.yaml` +
`hift.pt` and refuses any causal delay but 8 frames; `_get_original_vocoder()` strict-loads `hift_original.pt`
into its hard-coded full-size `HiFTGenerator()`. This runs all of that on `ensure_standin_token2wav_dir(
reduced=True, layout="minicpmo-utils-1.0.7", upstream_compatible=True)` (tokenizer and whole-utterance HiFT
at the sizes those loaders hard-code).

minicpmo-utils ships top-level `stepaudio2` and `s3tokenizer` packages that would shadow the engine venv's, so
tools/install_engine_cpu.sh puts it in a side folder and this test imports it in a subprocess with that
folder first on the path. The constructor places every module with `.cuda()` and asks
`torch.cuda.current_device()`; the subprocess maps those to the CPU (placement only, no loader code changed).
Needs the engine venv; skipped without it, an error under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.engine import INSTALL_HINT, in_ci, require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine, pytest.mark.slow]

require_engine("minicpmo-utils 1.0.7's loader on the stand-in folder", extra=("hyperpyyaml", "onnxruntime"))

SIDE = Path(sys.prefix) / "side" / "minicpmo-utils-1.0.7"

_LOAD = textwrap.dedent(
    """
    import json, sys
    import torch

    # CUDA placement -> CPU (the loaders themselves run unchanged).
    torch.cuda.current_device = lambda: 0
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    _to = torch.nn.Module.to

    def _to_cpu(self, *args, **kwargs):
        if args and isinstance(args[0], torch.device) and args[0].type == "cuda":
            return self
        return _to(self, *args, **kwargs)

    torch.nn.Module.to = _to_cpu

    import s3tokenizer
    import stepaudio2
    from stepaudio2.token2wav import Token2wav

    t2w = Token2wav(sys.argv[1])
    original = t2w._get_original_vocoder()
    print(json.dumps({
        "stepaudio2": stepaudio2.__file__,
        "s3tokenizer": s3tokenizer.__file__,
        "causal_vocoder": type(t2w.hift).__name__,
        "delay_frames": t2w.vocoder_delay_frames,
        "original_vocoder": type(original).__name__,
        "original_parameters": sum(p.numel() for p in original.parameters()),
        "flow_parameters": sum(p.numel() for p in t2w.flow.parameters()),
    }))
    """
)


def test_minicpmo_utils_1_0_7_loads_the_causal_vocoder_layout(tmp_path: Path) -> None:
    if not (SIDE / "stepaudio2" / "token2wav.py").is_file():
        reason = f"minicpmo-utils 1.0.7 is not in {SIDE}; {INSTALL_HINT}"
        if in_ci():
            raise RuntimeError(f"CI is set but {reason}")
        pytest.skip(reason)
    import torch

    from vllm_omni_token2wav.model_executor.layers.hift import cached_standin_hift
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

    model_dir = ensure_standin_token2wav_dir(reduced=True, layout="minicpmo-utils-1.0.7", upstream_compatible=True)
    script = tmp_path / "load.py"
    script.write_text(_LOAD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SIDE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(script), str(model_dir)], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["stepaudio2"].startswith(str(SIDE)) and loaded["s3tokenizer"].startswith(str(SIDE))
    assert (loaded["causal_vocoder"], loaded["delay_frames"], loaded["original_vocoder"]) == (
        "CausalHiFTGenerator",
        8,
        "HiFTGenerator",
    )
    full_hift = torch.load(cached_standin_hift(reduced=False, seed=0), map_location="cpu", weights_only=True)
    assert loaded["original_parameters"] == sum(v.numel() for v in full_hift.values())
    flow = torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True)
    assert loaded["flow_parameters"] == sum(v.numel() for v in flow.values())
