# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni 0.30's own code2wav options, as our stage takes them: honoured, mapped, refused, or warned about.

A deploy YAML written for vLLM-Omni's classes (its own `deploy/*.yaml`, or a user's) must build our
stage: what upstream accepts we accept, what upstream rejects we reject, and an option we cannot
honour is refused at construction with what to use instead, never dropped without a word. The full
table (option, where upstream reads it, what it does there, what we do) is
docs/design/upstream_options.md; `read_upstream_options` implements it over the merged `extra`
options (`options._extra`: the connector's `extra`, then `additional_config`) and the environment.

Whether a producer-side key matters depends on the family's producer (vLLM-Omni's stage input
processor), so the family is an argument:

| key                          | MiniCPM-o                 | Step-Audio2               | CosyVoice3                 |
|------------------------------|---------------------------|---------------------------|----------------------------|
| `codec_chunk_frames`         | new tokens per chunk      | not read (25 + 3 fixed)   | first hop (sends prefixes) |
| `codec_left_context_frames`  | tokens re-sent: must be 3 | not read                  | not read                   |
| `codec_pre_lookahead_frames` | not read                  | not read                  | lookahead: must be 3       |

(producers: vLLM-Omni's `tts2code2wav_async_chunk`, `thinker2token2wav_async_chunk`,
`talker2code2wav_async_chunk` stage input processors.)
A key its family's producer does not read never stops a deployment: a value other than what the
stage uses logs one warning naming the key, the value and what the stage uses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow.streaming import PRE_LOOKAHEAD_TOKENS

logger = init_logger(__name__)

MINICPMO = "minicpmo_4_5"
STEP_AUDIO2 = "step_audio2"
COSYVOICE3 = "cosyvoice3"
#: Upstream's chunk size where its producer has no key (Step-Audio2's `DEFAULT_STREAM_CONFIG.chunk_size`).
UPSTREAM_CHUNK_FRAMES = 25
_TRUE_TEXT = ("1", "true", "yes", "on")
_DOC = "docs/design/upstream_options.md"


@dataclass
class UpstreamView:
    """What upstream's options give the stage: `StageOptions` values, and the warnings to log once."""

    values: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def log(self) -> None:
        for text in self.warnings:
            logger.warning_once("%s", text)


def _int(extra: Mapping[str, Any], key: str, default: int) -> int:
    value = extra.get(key, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r}: vLLM-Omni reads it as an int") from None


def _flag(value: Any) -> bool:
    """Upstream's truthiness: `bool(value)` for the connector keys, the usual words for strings."""
    if isinstance(value, str):
        return value.strip().lower() in _TRUE_TEXT
    return bool(value)


def _not_used(view: UpstreamView, key: str, value: Any, uses: str) -> None:
    view.warnings.append(f"{key}={value!r} has no effect on this token2wav stage: {uses} (see {_DOC})")


def _codec_keys(extra: Mapping[str, Any], family: str | None, view: UpstreamView) -> None:
    """The producer's chunking keys (module table)."""
    chunk = _int(extra, "codec_chunk_frames", UPSTREAM_CHUNK_FRAMES)
    left = _int(extra, "codec_left_context_frames", PRE_LOOKAHEAD_TOKENS)
    if chunk <= 0:
        raise ValueError(f"codec_chunk_frames={chunk}: must be > 0 (vLLM-Omni rejects it too)")
    if left < 0:
        raise ValueError(f"codec_left_context_frames={left}: must be >= 0 (vLLM-Omni rejects it too)")
    if family in (MINICPMO, None):
        if left != PRE_LOOKAHEAD_TOKENS:
            raise ValueError(
                f"codec_left_context_frames={left}: the flow's pre-lookahead is {PRE_LOOKAHEAD_TOKENS} tokens, so the "
                f"producer must repeat exactly {PRE_LOOKAHEAD_TOKENS} tokens between chunks; set "
                f"codec_left_context_frames: {PRE_LOOKAHEAD_TOKENS} in the connector's extra"
            )
    elif "codec_left_context_frames" in extra and left != PRE_LOOKAHEAD_TOKENS:
        sends = "whole token prefixes" if family == COSYVOICE3 else f"{PRE_LOOKAHEAD_TOKENS} lookahead tokens"
        _not_used(
            view,
            "codec_left_context_frames",
            extra["codec_left_context_frames"],
            f"the {family} producer does not read it (it sends {sends}); the stage uses the flow's "
            f"{PRE_LOOKAHEAD_TOKENS}-token lookahead",
        )
    if family == STEP_AUDIO2 and "codec_chunk_frames" in extra and chunk != UPSTREAM_CHUNK_FRAMES:
        _not_used(
            view,
            "codec_chunk_frames",
            extra["codec_chunk_frames"],
            f"the step_audio2 producer does not read it (it sends {UPSTREAM_CHUNK_FRAMES} + "
            f"{PRE_LOOKAHEAD_TOKENS} tokens); the stage takes chunks as they come",
        )
    # CosyVoice3's producer (`talker2code2wav_async_chunk`) rejects these per request; we reject at construction.
    lookahead = _int(extra, "codec_pre_lookahead_frames", PRE_LOOKAHEAD_TOKENS)
    largest = _int(extra, "codec_max_chunk_frames", 4 * chunk)
    scale = _int(extra, "codec_stream_scale_factor", 2)
    if lookahead < 0 or largest <= 0 or scale <= 0:
        raise ValueError(
            f"codec_pre_lookahead_frames={lookahead} (>= 0), codec_max_chunk_frames={largest} (> 0), "
            f"codec_stream_scale_factor={scale} (> 0): vLLM-Omni's CosyVoice3 producer rejects these values too"
        )
    if family == COSYVOICE3 and lookahead != PRE_LOOKAHEAD_TOKENS:
        raise ValueError(
            f"codec_pre_lookahead_frames={lookahead}: the CosyVoice3 flow looks {PRE_LOOKAHEAD_TOKENS} tokens ahead, "
            f"so the talker must hold back exactly {PRE_LOOKAHEAD_TOKENS}; remove the key or set it to "
            f"{PRE_LOOKAHEAD_TOKENS}"
        )
    if family in (MINICPMO, STEP_AUDIO2):
        for key in ("codec_pre_lookahead_frames", "codec_max_chunk_frames", "codec_stream_scale_factor"):
            if key in extra:
                _not_used(view, key, extra[key], f"only vLLM-Omni's CosyVoice3 producer reads it, not {family}'s")


def _batching_keys(extra: Mapping[str, Any]) -> None:
    """MiniCPM-o's `code2wav_min_batch_size` / `code2wav_initial_batch_size` (upstream's rules, then ours)."""
    smallest = _int(extra, "code2wav_min_batch_size", 1)
    initial = _int(extra, "code2wav_initial_batch_size", 0)
    if smallest < 1:
        raise ValueError(f"code2wav_min_batch_size={smallest}: must be >= 1 (vLLM-Omni rejects it too)")
    if initial < 0:
        raise ValueError(f"code2wav_initial_batch_size={initial}: must be >= 0 (vLLM-Omni rejects it too)")
    if initial and initial < smallest:
        raise ValueError(
            f"code2wav_initial_batch_size={initial} < code2wav_min_batch_size={smallest}: must be 0 or >= the "
            "minimum (vLLM-Omni rejects it too)"
        )
    if smallest > 1:
        raise ValueError(
            f"code2wav_min_batch_size={smallest}: vLLM-Omni's class fails a step whose exact-shape bucket holds "
            "fewer rows; this stage batches every row of a step whatever its shape and never fails for a small "
            "batch. Remove the key (rows per launch: max_num_seqs; padded shapes: token2wav_pad_to_buckets)"
        )
    if initial > 0:
        raise ValueError(
            f"code2wav_initial_batch_size={initial}: this stage does not split first chunks into smaller "
            "launches; it runs them with the other rows, at most max_num_seqs per launch. Remove the key, or cap "
            "rows per launch with the stage's max_num_seqs"
        )


def _graph_keys(extra: Mapping[str, Any], view: UpstreamView) -> None:
    """CUDA / NPU graph switches of upstream's MiniCPM-o class -> `device_graphs`, unless ours is given."""
    switches = [_flag(extra[k]) for k in ("enable_cfm_graph", "enable_hift_graph") if k in extra]
    if "code2wav_enable_npu_graph" in extra:
        npu_graphs = _int(extra, "code2wav_max_npu_graphs", 32)
        switches.append(_flag(extra["code2wav_enable_npu_graph"]) and npu_graphs > 0)
    if switches and "token2wav_device_graphs" not in extra:
        # Any graph switch on: graphs where the platform has them (our "auto"); every switch off: eager.
        view.values["device_graphs"] = None if any(switches) else False
    bounded = "graphs are bounded by the bucket grid (token2wav_core/graphs.py)"
    for key, default, uses in (
        ("cfm_max_graphs", 32, bounded),
        ("code2wav_max_npu_graphs", 32, bounded),
        ("cfm_graph_bucket_frames", 0, "replaying launches are padded to the stage's own frame buckets"),
    ):
        if key in extra and _int(extra, key, default) != default:  # upstream's int(): a non-number fails there too
            _not_used(view, key, extra[key], uses)
    sizes = extra.get("hift_graph_capture_batch_sizes")
    if sizes is not None and list(sizes) != [1]:
        _not_used(view, "hift_graph_capture_batch_sizes", sizes, "HiFT graphs are captured per batch bucket on use")


def _precision_and_cache_keys(extra: Mapping[str, Any], view: UpstreamView) -> None:
    size = _int(extra, "token2wav_runtime_prompt_cache_size", 0)
    if "token2wav_runtime_prompt_cache_size" in extra:
        if size < 0:
            raise ValueError(
                f"token2wav_runtime_prompt_cache_size={size}: the prompt cache capacity must be >= 0 "
                "(vLLM-Omni rejects it too)"
            )
        view.values["prompt_cache_size"] = size
    if _flag(extra.get("code2wav_bfloat16_attention_cache", False)):
        ours = extra.get("token2wav_kv_cache_dtype")
        if ours is not None and str(ours).removeprefix("torch.") != "bfloat16":
            raise ValueError(
                f"code2wav_bfloat16_attention_cache=true asks for a bfloat16 attention cache but "
                f"token2wav_kv_cache_dtype={ours!r}; keep one of the two"
            )
        view.values["kv_cache_dtype"] = "bfloat16"
    if _flag(extra.get("token2wav_trt", False)):
        raise ValueError(
            "token2wav_trt=true: this stage has no TensorRT DiT estimator; it replays device graphs of its "
            "own launches instead (token2wav_device_graphs, on by default where the platform has graphs). "
            "Remove the key"
        )
    for key in ("token2wav_trt_dtype", "token2wav_trt_max_batch"):
        if key in extra:
            _not_used(view, key, extra[key], "there is no TensorRT estimator (token2wav_trt is refused)")
    if "prompt_cache_id" in extra and str(extra["prompt_cache_id"]) != "HT_ref_audio":
        _not_used(view, "prompt_cache_id", extra["prompt_cache_id"], "voices are cached by content, not by name")


def _environment(environ: Mapping[str, str], family: str | None, view: UpstreamView) -> None:
    if family in (MINICPMO, None) and environ.get("MINICPMO_TOKEN2WAV_TRT", "") == "1":
        _not_used(
            view,
            "MINICPMO_TOKEN2WAV_TRT",
            "1",
            "there is no TensorRT DiT estimator; device graphs replace it (token2wav_device_graphs)",
        )
    if family in (COSYVOICE3, None):
        trt = environ.get("COSYVOICE3_TRT")
        if trt is not None and trt not in ("0", "false", "False", ""):
            _not_used(view, "COSYVOICE3_TRT", trt, "the code2wav flow estimator runs in torch (no TensorRT engine)")
        if environ.get("COSYVOICE3_ESTIMATOR_ONNX"):
            _not_used(
                view,
                "COSYVOICE3_ESTIMATOR_ONNX",
                environ["COSYVOICE3_ESTIMATOR_ONNX"],
                "the flow estimator is built from flow.pt, no ONNX engine",
            )


def read_upstream_options(
    extra: Mapping[str, Any], family: str | None, environ: Mapping[str, str] | None = None
) -> UpstreamView:
    """Check and map vLLM-Omni 0.30's code2wav options (module docstring; `family` None: the strictest rules)."""
    view = UpstreamView()
    _codec_keys(extra, family, view)
    _batching_keys(extra)
    _graph_keys(extra, view)
    _precision_and_cache_keys(extra, view)
    _environment(os.environ if environ is None else environ, family, view)
    return view


__all__ = ["UPSTREAM_CHUNK_FRAMES", "UpstreamView", "read_upstream_options"]
