# SPDX-License-Identifier: Apache-2.0
"""Build the public reference models (FunAudioLLM/CosyVoice) the manual `tools/check_*_reference.py` compare against.

Three tools check our CosyVoice3 flow, causal HiFT and the whole code2wav chain against the reference's
own code, on the same seeded weights and inputs; the end-to-end one needs what the two model checks
build. That shared part lives here, in the package, so the scripts import it like any library code
instead of each other: the seeded inputs, the reference flow (with stand-ins for the imports it never
runs), the reference causal HiFT, the reference flow call and the difference statistics printed.

The reference is never imported at module level nor by the serving code: these functions put a
reference source tree on `sys.path` when called, from a venv of its own (see each tool's set-up lines).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import CosyVoice3FlowConfig
    from vllm_omni_token2wav.model_executor.layers.hift_causal import CausalHiFTConfig


def seeded_inputs(n_prompt: int, n_tokens: int) -> tuple[torch.Tensor, ...]:
    """(prompt tokens, prompt mel (2 frames per token), CAM++-like embedding, tokens), seeded; shared by the tools."""
    g = torch.Generator().manual_seed(1)
    return (
        torch.randint(0, 6561, (1, n_prompt), generator=g),
        torch.randn(1, 2 * n_prompt, 80, generator=g) * 0.5 - 4.0,
        torch.randn(1, 192, generator=g),
        torch.randint(0, 6561, (1, n_tokens), generator=g),
    )


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


def install_cosyvoice_stubs() -> None:
    """Stand-ins for the modules CosyVoice's flow imports but the check never runs (torchaudio, Matcha-TTS, ...)."""
    _stub("torchaudio")
    _stub("cosyvoice.utils.onnx", SpeechTokenExtractor=None, online_feature=False, onnx_path="")
    # the class registries upsample_encoder imports (for its conformer encoders, unused by CosyVoice3)
    registries = ("EMB", "SUBSAMPLE", "ATTENTION", "ACTIVATION")
    _stub("cosyvoice.utils.class_utils", **{f"COSYVOICE_{name}_CLASSES": {} for name in registries})

    class BASECFM(torch.nn.Module):
        """Attributes of Matcha-TTS's BASECFM.__init__ (the reference CFM overrides every computing method)."""

        def __init__(self, n_feats: int, cfm_params: Any, n_spks: int = 1, spk_emb_dim: int = 128) -> None:
            super().__init__()
            self.n_feats, self.n_spks, self.spk_emb_dim = n_feats, n_spks, spk_emb_dim
            self.solver = cfm_params.solver
            self.sigma_min = getattr(cfm_params, "sigma_min", 1e-4)
            self.estimator = None

    for name in ("matcha", "matcha.models", "matcha.models.components"):
        _stub(name, __path__=[])
    _stub("matcha.models.components.flow_matching", BASECFM=BASECFM)


def reference_cosyvoice3_flow(reference: Path, c: CosyVoice3FlowConfig) -> torch.nn.Module:
    """FunAudioLLM/CosyVoice's `CausalMaskedDiffWithDiT` for `c`, built from the source tree at `reference`."""
    sys.path.insert(0, str(reference))
    install_cosyvoice_stubs()
    from cosyvoice.flow.DiT.dit import DiT
    from cosyvoice.flow.flow import CausalMaskedDiffWithDiT as RefFlow
    from cosyvoice.flow.flow_matching import CausalConditionalCFM
    from cosyvoice.transformer.upsample_encoder import PreLookaheadLayer
    from omegaconf import DictConfig

    params = DictConfig(
        {
            "sigma_min": 1e-06,
            "solver": "euler",
            "t_scheduler": "cosine",
            "training_cfg_rate": 0.2,
            "inference_cfg_rate": c.inference_cfg_rate,
            "reg_loss_type": "l1",
        }
    )
    # construction order of cosyvoice3.yaml (hyperpyyaml builds nested entries in document order): the
    # pre-lookahead layer, the DiT, the CFM (reseeds 0, draws its noise), then the flow; a vocoder built
    # next draws its noise table where CosyVoice's loader does (tools/check_cosyvoice3_e2e_reference.py)
    pre = PreLookaheadLayer(in_channels=c.input_size, channels=c.pre_lookahead_channels, pre_lookahead_len=3)
    estimator = DiT(
        dim=c.dim,
        depth=c.depth,
        heads=c.heads,
        dim_head=c.dim_head,
        ff_mult=c.ff_mult,
        mel_dim=c.output_size,
        mu_dim=c.input_size,
        spk_dim=c.output_size,
        out_channels=c.output_size,
        static_chunk_size=c.static_chunk_size,
        num_decoding_left_chunks=-1,
    )
    decoder = CausalConditionalCFM(
        in_channels=2 * c.output_size + c.input_size,
        cfm_params=params,
        n_spks=1,
        spk_emb_dim=c.output_size,
        estimator=estimator,
    )
    return RefFlow(
        input_size=c.input_size,
        output_size=c.output_size,
        spk_embed_dim=c.spk_embed_dim,
        output_type="mel",
        vocab_size=c.vocab_size,
        input_frame_rate=25,
        token_mel_ratio=c.token_mel_ratio,
        pre_lookahead_len=c.pre_lookahead_len,
        pre_lookahead_layer=pre,
        decoder=decoder,
    ).eval()


def reference_flow_call(
    ref: Any, tok: torch.Tensor, pt: torch.Tensor, pm: torch.Tensor, spk: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """The reference flow's mel for (tokens, prompt tokens, prompt mel, speaker embedding); `kw` to `inference`.

    `ref` is the reference's `CausalMaskedDiffWithDiT` (untyped: it comes from the reference source tree).
    """
    lens = [torch.tensor([tok.size(1)]), torch.tensor([pt.size(1)]), torch.tensor([pm.size(1)])]
    mel, _ = ref.inference(tok, lens[0], pt, lens[1], pm, lens[2], spk, **kw)
    return mel


def diff_stats(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """max |a - b|, relative L2 of a - b to b, max |b| (in float64)."""
    a, b = a.double(), b.double()
    return {
        "max_abs": (a - b).abs().max().item(),
        "rel_l2": ((a - b).norm() / b.norm()).item(),
        "max_ref": b.abs().max().item(),
    }


def reference_causal_hift(modules: types.SimpleNamespace, config: CausalHiFTConfig) -> torch.nn.Module:
    """The reference `CausalHiFTGenerator` for `config` (`modules`: the reference's `generator`, `f0_predictor`).

    The F0 predictor is built first, then the generator (hyperpyyaml builds nested objects first), so the
    random draws happen in the reference loader's order.
    """
    f0 = modules.f0_predictor.CausalConvRNNF0Predictor(
        num_class=1, in_channels=config.in_channels, cond_channels=config.f0_channels
    )
    return modules.generator.CausalHiFTGenerator(
        in_channels=config.in_channels,
        base_channels=config.base_channels,
        nb_harmonics=config.nb_harmonics,
        sampling_rate=config.sampling_rate,
        nsf_alpha=config.nsf_alpha,
        nsf_sigma=config.nsf_sigma,
        nsf_voiced_threshold=config.nsf_voiced_threshold,
        upsample_rates=list(config.upsample_rates),
        upsample_kernel_sizes=list(config.upsample_kernel_sizes),
        istft_params={"n_fft": config.istft_n_fft, "hop_len": config.istft_hop},
        resblock_kernel_sizes=list(config.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in config.resblock_dilation_sizes],
        source_resblock_kernel_sizes=list(config.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(d) for d in config.source_resblock_dilation_sizes],
        lrelu_slope=config.lrelu_slope,
        audio_limit=config.audio_limit,
        conv_pre_look_right=config.conv_pre_look_right,
        f0_predictor=f0,
    )


__all__ = [
    "diff_stats",
    "install_cosyvoice_stubs",
    "reference_causal_hift",
    "reference_cosyvoice3_flow",
    "reference_flow_call",
    "seeded_inputs",
]
