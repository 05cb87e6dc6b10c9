# SPDX-License-Identifier: Apache-2.0
"""`cosyvoice2` for vLLM-Omni's own token2wav classes in engine processes (`bench engine-ab` puts this folder's
parent on the upstream arm's PYTHONPATH; it is not a module of our package).

Step-Audio2's `flow.yaml` names `cosyvoice2.flow.flow.CausalMaskedDiffWithXvec` etc. Upstream users run with
Step-Audio2's code on the path; `stepaudio2-minicpmo` (tools/install_engine_cpu.sh) ships those modules as
`stepaudio2.cosyvoice2` and registers them as `cosyvoice2` when its `Token2wav` is built. An engine worker
never builds that, so importing this package performs the same registration (the package's own function):
afterwards `cosyvoice2.*` in `sys.modules` are stepaudio2-minicpmo's modules, and this shim is replaced.

It also sizes the streaming flow's scratch buffers from the model instead of upstream's hard-coded full size
(`vllm_omni_token2wav/benchmarks/engine_ab/dit_scratch.py` says why that leaves upstream's arithmetic as is).
"""

import sys

del sys.modules[__name__]  # let stepaudio2-minicpmo register its own `cosyvoice2` package object

from stepaudio2.token2wav import _setup_cosyvoice2_alias  # noqa: E402

_setup_cosyvoice2_alias()

from stepaudio2.cosyvoice2.flow.decoder_dit import DiT  # noqa: E402
from stepaudio2.cosyvoice2.flow.flow_matching import CausalConditionalCFM  # noqa: E402

from vllm_omni_token2wav.benchmarks.engine_ab.dit_scratch import size_scratch_from_model  # noqa: E402

size_scratch_from_model(DiT, CausalConditionalCFM)
