# SPDX-License-Identifier: Apache-2.0
"""Checked state_dict files and stand-in weights shared by the model loaders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from vllm_omni_token2wav.model_executor.model_loader.state_dict import (
    check_state_dict_layout,
    ensure_cached_files,
    load_checked,
    read_state_dict,
    standin_state_dict,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_embedding = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.register_buffer("table", torch.arange(3.0))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


def test_standin_weights_are_seeded_scaled_and_keep_persistent_buffers() -> None:
    model = _Tiny()
    a, b, c = standin_state_dict(model, 1), standin_state_dict(model, 1), standin_state_dict(model, 2)
    assert a.keys() == model.state_dict().keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["proj.weight"], c["proj.weight"])
    assert torch.equal(a["table"], torch.arange(3.0)), "buffers are architecture constants, not noise"
    assert a["proj.bias"].abs().max() <= 0.01 * 3**0.5 + 1e-6
    assert (a["norm.weight"] - 1).abs().max() <= 0.01 * 3**0.5 + 1e-6
    assert a["proj.weight"].abs().max() <= (0.5 / 4) ** 0.5 * 3**0.5 + 1e-6


def test_layout_check_names_missing_unexpected_and_misshaped_tensors() -> None:
    want = _Tiny().state_dict()
    check_state_dict_layout(dict(want), want, source="x.pt", against="cfg", hint="hint")
    with pytest.raises(
        ValueError, match=r"x.pt: key layout does not match cfg .*missing \['table'\], unexpected \['extra'\]; hint"
    ):
        state = {k: v for k, v in want.items() if k != "table"}
        check_state_dict_layout({**state, "extra": torch.zeros(1)}, want, source="x.pt", against="cfg", hint="hint")
    with pytest.raises(ValueError, match=r"tensor 'proj.bias' has shape \(7,\), expected \(8,\) from cfg"):
        check_state_dict_layout({**want, "proj.bias": torch.zeros(7)}, want, source="x.pt", against="cfg", hint="")


def test_read_state_dict_rejects_files_that_are_not_state_dicts(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    assert torch.equal(read_state_dict(good)["w"], torch.ones(2))
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="junk.pt: cannot read as a torch state_dict"):
        read_state_dict(tmp_path / "junk.pt")
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="expected a state_dict"):
        read_state_dict(tmp_path / "list.pt")


def test_ensure_cached_files_writes_only_when_a_file_is_missing(tmp_path: Path) -> None:
    calls = []

    def write(directory: Path) -> None:
        calls.append(directory)
        for name in ("a.bin", "b.txt"):
            (directory / name).write_text(name)

    target = tmp_path / "cache" / "x"
    assert ensure_cached_files(target, ("a.bin", "b.txt"), write) == target
    ensure_cached_files(target, ("a.bin", "b.txt"), write)
    assert calls == [target]
    (target / "b.txt").unlink()
    ensure_cached_files(target, ("a.bin", "b.txt"), write)
    assert len(calls) == 2


def test_load_checked_materialises_a_meta_model_only_after_the_layout_check(tmp_path: Path) -> None:
    class _Persistent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 8)
            self.register_buffer("table", torch.arange(3.0))

    source = _Persistent()
    torch.save(source.state_dict(), tmp_path / "w.pt")
    torch.save({"proj.weight": torch.zeros(8, 4)}, tmp_path / "short.pt")
    with torch.device("meta"):
        model = _Persistent()
    with pytest.raises(ValueError, match=r"missing \['proj.bias', 'table'\]"):
        load_checked(model, tmp_path / "short.pt", device="cpu", float16=False, against="cfg", hint="", what="x")
    assert model.proj.weight.is_meta, "a wrong file fails before any memory is allocated"
    load_checked(model, tmp_path / "w.pt", device="cpu", float16=False, against="cfg", hint="", what="x")
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in model.state_dict().items())
    with torch.device("meta"):
        scratch = _Tiny()  # has a non-persistent buffer the file cannot fill
    with pytest.raises(ValueError, match="must keep all its buffers in the state_dict"):
        load_checked(scratch, tmp_path / "w.pt", device="cpu", float16=False, against="cfg", hint="", what="x")
