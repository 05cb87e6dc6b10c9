# SPDX-License-Identifier: Apache-2.0
"""Speech tokenizer v2: layout, strict ONNX weight mapping, front end, FSQ, torch vs onnxruntime, windowing."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.helpers.mark import hardware_test
from vllm_omni_token2wav.assets.audio import speech_sample
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer import (
    CODEBOOK_SIZE,
    FULL_TOKENIZER_CONFIG,
    FULL_TOKENIZER_NUM_KEYS,
    FULL_TOKENIZER_NUM_PARAMS,
    LogMelFrontend,
    OrtSpeechTokenizer,
    SpeechTokenizerOnnxError,
    SpeechTokenizerV2,
    TorchSpeechTokenizer,
    load_speech_tokenizer_from_onnx,
    select_speech_tokenizer,
    write_standin_speech_tokenizer,
)
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.frontend import slaney_mel_filters
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.model import fsq_digits
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.standin import standin_speech_tokenizer
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.windowing import (
    merge_window_tokens,
    window_starts,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

SEED = 4


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech_tokenizer")


@pytest.fixture(scope="module")
def standin_path(onnx_dir: Path) -> Path:
    return write_standin_speech_tokenizer(onnx_dir / "speech_tokenizer_v2_25hz.onnx", reduced=True, seed=SEED)


@pytest.fixture(scope="module")
def torch_backend(standin_path: Path) -> TorchSpeechTokenizer:
    return TorchSpeechTokenizer(load_speech_tokenizer_from_onnx(standin_path, device="cpu"))


@pytest.fixture(scope="module")
def ort_backend(standin_path: Path) -> OrtSpeechTokenizer:
    return OrtSpeechTokenizer(standin_path)


@pytest.fixture(scope="module")
def speech_16k() -> torch.Tensor:
    samples, rate = speech_sample()
    assert rate == 16000
    return torch.from_numpy(samples)


def _expected_tokens(num_samples: int) -> int:
    """Independent count: N // 160 mel frames, then ceil(/2) twice."""
    frames = num_samples // 160
    return math.ceil(math.ceil(frames / 2) / 2)


def test_full_size_model_has_the_shipped_key_and_parameter_counts() -> None:
    with torch.device("meta"):
        model = SpeechTokenizerV2(FULL_TOKENIZER_CONFIG)
    state_dict = model.state_dict()
    assert len(state_dict) == FULL_TOKENIZER_NUM_KEYS == 102
    assert sum(v.numel() for v in state_dict.values()) == FULL_TOKENIZER_NUM_PARAMS == 123_714_568
    assert FULL_TOKENIZER_CONFIG.n_head == 20
    assert not any("rope" in k for k in state_dict)


def test_standin_export_mimics_the_shipped_layout(standin_path: Path) -> None:
    model_proto = onnx.load(str(standin_path))
    graph = model_proto.graph
    inits = {i.name: i for i in graph.initializer}
    nodes = {n.name: n for n in graph.node}
    assert [i.name for i in graph.input] == ["feats", "feats_length"]
    query = nodes["/blocks.0/attn/query/MatMul"]
    weight = inits[query.input[1]]
    assert weight.name == "/blocks.0/attn/query/MatMul"
    model = standin_speech_tokenizer(reduced=True, seed=SEED)
    n_state, n_mlp = model.config.n_state, model.config.n_mlp
    assert tuple(weight.dims) == (n_state, n_state)
    assert tuple(inits[nodes["/blocks.0/mlp/mlp.0/MatMul"].input[1]].dims) == (n_state, n_mlp)  # [in, out]
    assert nodes["/conv1/Conv"].input[1].startswith("onnx::Conv_")
    norm = nodes["/blocks.1/mlp_ln/LayerNormalization"]
    assert norm.input[1] in inits and norm.input[2] in inits
    assert "/blocks.0/attn/key/Add" not in nodes  # key projection has no bias
    weighted = {n.name for n in graph.node if n.op_type in ("MatMul", "Conv", "LayerNormalization")}
    # conv1, conv2; per block 2 LayerNorms + q/k/v/out/mlp.0/mlp.2 + the FSMN conv; project_down.
    assert len([n for n in weighted if any(i in inits for i in nodes[n].input)]) == 2 + 2 * 9 + 1


def test_standin_export_names_what_the_reference_converter_looks_up(standin_path: Path) -> None:
    """s3tokenizer's converter (vLLM-Omni's loader) finds the subsampling convs and the FSQ projection by the
    shipped file's anonymous names and reads every initializer a node consumes as a weight: so the only
    initializers are the 102 (here: reduced count of) weights, graph constants are `Constant` nodes."""
    graph = onnx.load(str(standin_path)).graph
    inits = {i.name for i in graph.initializer}
    nodes = {n.name: n for n in graph.node}
    assert list(nodes["/conv1/Conv"].input[1:]) == ["onnx::Conv_2216", "onnx::Conv_2217"]
    assert list(nodes["/conv2/Conv"].input[1:]) == ["onnx::Conv_2218", "onnx::Conv_2219"]
    assert nodes["/quantizer/_codebook/project_down/MatMul"].input[1] == "onnx::MatMul_2536"
    assert nodes["/quantizer/_codebook/project_down/Add"].input[1] == "quantizer.project_in.bias"
    model = standin_speech_tokenizer(reduced=True, seed=SEED)
    assert len(inits) == len(model.state_dict())
    consumers = {name: n for n in graph.node for name in n.input if name in inits}
    assert set(consumers) == inits
    special = {"onnx::Conv_2216", "onnx::Conv_2217", "onnx::Conv_2218", "onnx::Conv_2219", "onnx::MatMul_2536"}
    for name, node in consumers.items():
        assert node.op_type in ("MatMul", "Add", "Conv", "LayerNormalization"), (name, node.name)
        assert name in special or name == "quantizer.project_in.bias" or node.name.startswith("/blocks."), name
    assert any(n.op_type == "Constant" for n in graph.node)


def test_loader_maps_every_onnx_weight_onto_the_exported_model(standin_path: Path) -> None:
    loaded = load_speech_tokenizer_from_onnx(standin_path, device="cpu")
    original = standin_speech_tokenizer(reduced=True, seed=SEED)
    assert loaded.config == original.config
    reference = original.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, reference[key]), key


def test_weights_kept_as_constant_nodes_map_too(standin_path: Path, onnx_dir: Path) -> None:
    from onnx import helper

    model_proto = onnx.load(str(standin_path))
    graph = model_proto.graph
    moved = next(i for i in graph.initializer if i.name == "/blocks.1/mlp/mlp.2/MatMul")
    constant = helper.make_node("Constant", [], [moved.name], name="/blocks.1/mlp/mlp.2/Constant", value=moved)
    graph.initializer.remove(moved)
    graph.node.insert(0, constant)
    path = onnx_dir / "constant_weight.onnx"
    onnx.save_model(model_proto, str(path))
    loaded = load_speech_tokenizer_from_onnx(path, device="cpu")
    reference = standin_speech_tokenizer(reduced=True, seed=SEED).encoder.blocks[1].mlp[2].weight
    assert torch.equal(loaded.encoder.blocks[1].mlp[2].weight, reference)


def _reference_log_mel(wav: np.ndarray) -> np.ndarray:
    """Plain numpy: reflect-padded framed rFFT, periodic Hann, Slaney filters built from the formula."""
    n_fft, hop = 400, 160
    padded = np.pad(wav.astype(np.float64), (n_fft // 2, n_fft // 2), mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    frames = len(wav) // hop  # the last centred frame is dropped
    spec = np.stack([np.fft.rfft(padded[i * hop : i * hop + n_fft] * window) for i in range(frames)], axis=1)
    power = np.abs(spec) ** 2

    def hz_to_mel(f: float) -> float:
        return f / (200 / 3) if f < 1000 else 15 + math.log(f / 1000) / (math.log(6.4) / 27)

    def mel_to_hz(m: float) -> float:
        return m * (200 / 3) if m < 15 else 1000 * math.exp((m - 15) * math.log(6.4) / 27)

    edges = [mel_to_hz(m) for m in np.linspace(hz_to_mel(0.0), hz_to_mel(8000.0), 130)]
    freqs = np.linspace(0, 8000, n_fft // 2 + 1)
    filters = np.zeros((128, freqs.size))
    for i in range(128):
        lo, mid, hi = edges[i], edges[i + 1], edges[i + 2]
        rising = (freqs - lo) / (mid - lo)
        falling = (hi - freqs) / (hi - mid)
        filters[i] = np.maximum(0, np.minimum(rising, falling)) * 2 / (hi - lo)
    log_spec = np.log10(np.maximum(filters @ power, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def test_log_mel_front_end_matches_an_independent_numpy_reference(speech_16k: torch.Tensor) -> None:
    wav = speech_16k[:16000]
    mel = LogMelFrontend()(wav)
    reference = _reference_log_mel(wav.numpy())
    assert mel.shape == (128, 100)
    # float32 STFT + log10 against a float64 reference: observed max 2.2e-5 on this clip.
    np.testing.assert_allclose(mel.numpy(), reference, rtol=0, atol=5e-5)


def test_slaney_filters_are_bit_equal_to_librosa() -> None:
    librosa = pytest.importorskip("librosa")
    reference = librosa.filters.mel(sr=16000, n_fft=400, n_mels=128)  # htk=False, norm="slaney"
    np.testing.assert_array_equal(slaney_mel_filters(), reference)


def test_fsq_rounds_exact_ties_half_to_even() -> None:
    # float32 h with h * 0.999 == 0.5 exactly (found by scanning float32 neighbours of 0.5 / 0.999).
    tie = torch.tensor([0.500500500202179], dtype=torch.float32)
    assert float(tie * torch.tensor(0.9990000128746033)) == 0.5
    digits = fsq_digits(torch.cat([tie, -tie, torch.tensor([0.6, -0.6])]))
    # Half to even: +-0.5 -> 0 -> digit 1 (half away from zero would give 2 and 0).
    assert digits.tolist() == [1.0, 1.0, 2.0, 0.0]


def test_fsq_code_weights_dim_zero_least_significant() -> None:
    model = SpeechTokenizerV2(standin_speech_tokenizer(reduced=True, seed=SEED).config)
    codebook = model.quantizer._codebook
    # Pick pre-tanh values directly: project_down = identity on the first 8 channels.
    with torch.no_grad():
        codebook.project_down.weight.zero_()
        codebook.project_down.weight[:, :8] = torch.eye(8)
        codebook.project_down.bias.zero_()
    pre = torch.tensor([[3.0, -3.0, 0.1, -0.1, 0.6, -0.6, 0.5, -0.5]])
    x = torch.zeros(1, 1, model.config.n_state)
    x[0, 0, :8] = pre
    digits = [int(np.round(math.tanh(v) * 0.999)) + 1 for v in pre[0].tolist()]  # numpy rounds half to even
    expected = sum(d * 3**i for i, d in enumerate(digits))
    assert digits == [2, 0, 1, 1, 2, 0, 1, 1]
    assert int(codebook.encode(x)[0, 0]) == expected


def test_torch_and_onnxruntime_give_identical_tokens_on_real_speech(
    torch_backend: TorchSpeechTokenizer, ort_backend: OrtSpeechTokenizer, speech_16k: torch.Tensor
) -> None:
    tokens, length = torch_backend.tokenize(speech_16k)
    ort_tokens, ort_length = ort_backend.tokenize(speech_16k)
    assert tokens.dtype == torch.int64 and tokens.shape == (1, length)
    assert length == ort_length == _expected_tokens(speech_16k.numel())
    assert torch.equal(tokens, ort_tokens)
    assert 0 <= int(tokens.min()) and int(tokens.max()) < CODEBOOK_SIZE
    assert len(set(tokens[0].tolist())) > 20  # a degenerate stand-in would make the parity vacuous


@pytest.mark.parametrize("seconds", [0.37, 2.0])
def test_torch_and_onnxruntime_give_identical_tokens_on_noise(
    torch_backend: TorchSpeechTokenizer, ort_backend: OrtSpeechTokenizer, seconds: float
) -> None:
    noise = 0.1 * torch.randn(int(16000 * seconds), generator=torch.Generator().manual_seed(9))
    tokens, length = torch_backend.tokenize(noise)
    ort_tokens, _ = ort_backend.tokenize(noise)
    assert length == _expected_tokens(noise.numel())
    assert torch.equal(tokens, ort_tokens)


def test_window_schedule_and_merge_follow_the_reference_rule() -> None:
    assert window_starts(3000) == [0]
    assert window_starts(3001) == [0, 2600]
    assert window_starts(5300) == [0, 2600, 5200]
    windows = [torch.arange(750), torch.arange(1000, 1750), torch.arange(2000, 2100)]
    merged = merge_window_tokens(windows)
    expected = torch.cat([torch.arange(700), torch.arange(1050, 1700), torch.arange(2050, 2100)])
    assert torch.equal(merged, expected)


def test_audio_over_30_s_is_windowed_and_both_backends_agree(
    torch_backend: TorchSpeechTokenizer, ort_backend: OrtSpeechTokenizer, speech_16k: torch.Tensor
) -> None:
    # 33 s: real speech repeated over noise, so the two windows see different content.
    noise = 0.05 * torch.randn(16000 * 33, generator=torch.Generator().manual_seed(3))
    wav = noise.clone()
    for start in range(0, wav.numel() - speech_16k.numel(), 5 * 16000):
        wav[start : start + speech_16k.numel()] += speech_16k
    tokens, length = torch_backend.tokenize(wav)
    assert length == 33 * 25 == _expected_tokens(wav.numel())
    assert torch.equal(tokens, ort_backend.tokenize(wav)[0])
    # Against the windows run by hand: 0-28 s from window 0 (0-30 s), the rest from window 1
    # (26-33 s) after dropping its first 50 tokens (2 s).
    mel = torch_backend.frontend(wav)
    assert mel.shape[-1] == 3300
    model = torch_backend.model
    with torch.inference_mode():
        first, _ = model(mel[None, :, :3000], torch.tensor([3000]))
        second, _ = model(mel[None, :, 2600:], torch.tensor([700]))
    assert torch.equal(tokens[0, :700], first[0, :700])
    assert torch.equal(tokens[0, 700:], second[0, 50:])
    # The join really changed something: window 0's own tokens for 28-30 s differ from window 1's.
    assert not torch.equal(first[0, 700:750], second[0, 50:100])


@pytest.mark.parametrize(
    ("wav", "message"),
    [
        (torch.zeros(0), "at least 201 samples"),
        (torch.zeros(150), "at least 201 samples"),
        (torch.zeros(2, 16000), r"mono 16 kHz waveform \[N\]"),
        (torch.zeros(16000, dtype=torch.int16), "divide int16 PCM by 32768"),
        (torch.full((16000,), float("nan")), "NaN or Inf"),
    ],
)
def test_bad_waveforms_raise_clear_errors(torch_backend: TorchSpeechTokenizer, wav: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        torch_backend.tokenize(wav)


def _foreign_onnx(path: Path) -> Path:
    """A small network that is not a tokenizer: conv1 -> classifier MatMul."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((64, 128, 3)).astype(np.float32), "onnx::Conv_1"),
        numpy_helper.from_array(rng.standard_normal((64, 4)).astype(np.float32), "onnx::MatMul_2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "onnx::Conv_1"], ["c"], name="/conv1/Conv", pads=[1, 1]),
        helper.make_node("Transpose", ["c"], ["t"], name="/Transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t", "onnx::MatMul_2"], ["y"], name="/classifier/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T", 4])],
        initializer=inits,
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_another_networks_onnx_file_is_rejected_with_the_unmapped_names(onnx_dir: Path) -> None:
    path = _foreign_onnx(onnx_dir / "foreign.onnx")
    with pytest.raises(SpeechTokenizerOnnxError) as info:
        load_speech_tokenizer_from_onnx(path, device="cpu")
    message = str(info.value)
    assert "1 unused initializers [onnx::MatMul_2 (node /classifier/MatMul)]" in message
    assert (
        "5 unmapped parameters [encoder.conv1.bias, encoder.conv2.bias, encoder.conv2.weight, "
        "quantizer._codebook.project_down.bias, quantizer._codebook.project_down.weight]" in message
    )


def test_renamed_module_in_the_file_is_listed_as_unused_and_unmapped(standin_path: Path, onnx_dir: Path) -> None:
    model_proto = onnx.load(str(standin_path))
    for node in model_proto.graph.node:
        if node.name.startswith("/blocks.1/attn/query/"):
            node.name = node.name.replace("/query/", "/q_proj/")
    path = onnx_dir / "renamed.onnx"
    onnx.save_model(model_proto, str(path))
    with pytest.raises(SpeechTokenizerOnnxError, match=r"2 unused initializers \[/blocks\.1/attn/query/MatMul") as info:
        load_speech_tokenizer_from_onnx(path, device="cpu")
    assert "2 unmapped parameters [encoder.blocks.1.attn.query.bias, encoder.blocks.1.attn.query.weight]" in str(
        info.value
    )


def test_unreadable_and_missing_files_raise(onnx_dir: Path) -> None:
    (onnx_dir / "garbage.onnx").write_bytes(b"\x00not onnx at all")
    with pytest.raises(SpeechTokenizerOnnxError, match="cannot be parsed as ONNX"):
        load_speech_tokenizer_from_onnx(onnx_dir / "garbage.onnx")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_speech_tokenizer_from_onnx(onnx_dir / "absent.onnx")
    with pytest.raises(ValueError, match="'auto', 'torch' or 'onnx'"):
        select_speech_tokenizer(onnx_dir / "absent.onnx", backend="tensorrt")  # type: ignore[arg-type]


def test_model_is_fp32_under_a_bf16_default_dtype(standin_path: Path) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what vLLM's set_default_torch_dtype does around model init
    try:
        backend = select_speech_tokenizer(standin_path, backend="torch", device="cpu")
    finally:
        torch.set_default_dtype(previous)
    assert isinstance(backend, TorchSpeechTokenizer)
    assert {p.dtype for p in backend.model.parameters()} == {torch.float32}
    assert backend.frontend.filters.dtype == torch.float32


@hardware_test(res={"cuda": "H100", "npu": "A2"}, num_cards=1)
def test_device_tokens_match_onnxruntime(
    standin_path: Path, ort_backend: OrtSpeechTokenizer, speech_16k: torch.Tensor
) -> None:
    backend = select_speech_tokenizer(standin_path, backend="torch")  # the serving device
    assert backend.device.type != "cpu"
    tokens, _ = backend.tokenize(speech_16k)
    assert torch.equal(tokens.cpu(), ort_backend.tokenize(speech_16k)[0])
