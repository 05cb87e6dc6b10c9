# SPDX-License-Identifier: Apache-2.0
"""The upstream arm's scratch-buffer sizing (`engine_ab/dit_scratch.py`) on upstream's own flow classes.

What must hold for the stream route's upstream numbers to be upstream's: at the full size the derived shapes
are exactly the ones upstream hard-codes (so the patch is a no-op on real checkpoints); on the reduced stand-in
the unpatched flow cannot stream at all, the patched one streams; the patch touches only the buffers. The
classes are patched through subclasses or restored afterwards: upstream's modules stay as shipped for the rest
of the session. Needs the engine venv (`stepaudio2-minicpmo`); skipped without it, an error under CI.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.engine import require_engine
from vllm_omni_token2wav.benchmarks.engine_ab.dit_scratch import (
    FULL_SIZE,
    MAX_EULER_STEPS,
    PATCHED_FLAG,
    scratch_shapes,
    size_scratch_from_model,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("upstream's Step-Audio2 flow classes", extra=("stepaudio2-minicpmo", "hyperpyyaml"))

SMALL = {"in_channels": 320, "out_channels": 80, "depth": 2, "num_heads": 2, "head_dim": 32, "hidden_size": 64}


@pytest.fixture(scope="module")
def classes() -> Iterator[tuple[type, type]]:
    """Upstream's DiT and CFM, with `cosyvoice2.*` registered as upstream's Token2wav does (removed afterwards)."""
    from stepaudio2.token2wav import _setup_cosyvoice2_alias

    before = {name for name in sys.modules if name.split(".")[0] == "cosyvoice2"}
    _setup_cosyvoice2_alias()
    from stepaudio2.cosyvoice2.flow.decoder_dit import DiT
    from stepaudio2.cosyvoice2.flow.flow_matching import CausalConditionalCFM

    yield DiT, CausalConditionalCFM
    for name in [n for n in sys.modules if n.split(".")[0] == "cosyvoice2" and n not in before]:
        del sys.modules[name]


def test_the_full_size_shapes_are_the_ones_upstream_hard_codes(classes: tuple[type, type]) -> None:
    dit_cls, cfm_cls = classes
    dit = dit_cls(**SMALL)  # unpatched: upstream registers the full-size shapes whatever the config says
    cfm = cfm_cls(dit)
    att, cnn = scratch_shapes(**FULL_SIZE)
    assert (tuple(dit.att_cache_buffer.shape), tuple(dit.cnn_cache_buffer.shape)) == (att, cnn)
    assert tuple(cfm.att_cache_buffer.shape) == (MAX_EULER_STEPS, *att)
    assert tuple(cfm.cnn_cache_buffer.shape) == (MAX_EULER_STEPS, *cnn)


def test_subclasses_get_buffers_of_their_own_size_and_nothing_else_changes(classes: tuple[type, type]) -> None:
    dit_cls, cfm_cls = classes
    sized_dit = type("SizedDiT", (dit_cls,), {})
    sized_cfm = type("SizedCFM", (cfm_cls,), {})
    assert size_scratch_from_model(sized_dit, sized_cfm) is True
    assert size_scratch_from_model(sized_dit, sized_cfm) is False  # once only
    assert not dit_cls.__dict__.get(PATCHED_FLAG) and not cfm_cls.__dict__.get(PATCHED_FLAG)
    torch.manual_seed(0)
    plain = dit_cls(**SMALL)
    torch.manual_seed(0)
    sized = sized_dit(**SMALL)
    att, cnn = scratch_shapes(2, 2, 32, 64)
    assert (tuple(sized.att_cache_buffer.shape), tuple(sized.cnn_cache_buffer.shape)) == (att, cnn)
    assert att == (2, 2, 2, 1000, 64) and cnn == (2, 2, 128, 2)
    assert plain.state_dict().keys() == sized.state_dict().keys()  # scratch is not persistent
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), sized.state_dict().values(), strict=True))
    cfm = sized_cfm(sized)
    assert tuple(cfm.att_cache_buffer.shape) == (MAX_EULER_STEPS, *att)


@pytest.fixture
def patched_upstream(classes: tuple[type, type]) -> Iterator[None]:
    """The shim's patch on upstream's classes themselves (what hyperpyyaml builds), undone afterwards."""
    saved = [(cls, cls.__init__) for cls in classes]
    size_scratch_from_model(*classes)
    yield
    for cls, init in saved:
        cls.__init__ = init
        delattr(cls, PATCHED_FLAG)


def _stream_setup(model_dir: Path) -> Any:
    from hyperpyyaml import load_hyperpyyaml

    with open(model_dir / "flow.yaml") as f:
        flow = load_hyperpyyaml(f)["flow"]
    flow.load_state_dict(torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True), strict=True)
    flow.eval()
    tokens = torch.tensor([[(37 * i + 11) % 6561 for i in range(28)]])
    mels = torch.randn(1, 2 * 25, 80, generator=torch.Generator().manual_seed(1))
    spk = torch.randn(1, 192, generator=torch.Generator().manual_seed(2))
    return flow.setup_cache(tokens, mels, spk, n_timesteps=2)


def test_upstream_streams_the_reduced_flow_only_with_the_scratch_sized(
    classes: tuple[type, type], request: pytest.FixtureRequest
) -> None:
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

    model_dir = ensure_standin_token2wav_dir(reduced=True, upstream_compatible=True)
    with pytest.raises(RuntimeError, match="expanded size of the tensor"):
        _stream_setup(model_dir)
    request.getfixturevalue("patched_upstream")
    cache = _stream_setup(model_dir)
    assert cache["estimator_att_cache"].shape[:4] == (MAX_EULER_STEPS, 2, 2, 2)  # steps, depth, CFG rows, heads
    assert all(torch.isfinite(v).all() for v in cache.values() if isinstance(v, torch.Tensor))
