# SPDX-License-Identifier: Apache-2.0
"""Where a Token2Wav facade's files are and which device it serves: the two facts every facade owns.

Every facade (`core.Token2WavCore` for Step-Audio2 / MiniCPM-o, `cosyvoice3_token2wav.CosyVoice3Token2Wav`)
reads the same kind of asset folder and resolves its device lazily; their base (`facade.Token2WavFacade`)
owns these components, and each family keeps its own asset list (`check_assets`) and model loading.

- `Token2WavAssets`: the file names of a family's asset folder (`None`: the family ships no such file).
- `AssetDir`: `model_path / name` with errors that name the missing file and what the folder holds.
- `LazyDevice`: the serving device, resolved once on first use (explicit spec, else the platform's).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vllm_omni_token2wav.platforms import DeviceSpec, normalize_device


@dataclass(frozen=True)
class Token2WavAssets:
    """File names inside a token2wav directory (`None`: the family does not ship that file)."""

    speaker_model: str = "campplus.onnx"
    speech_tokenizer: str = "speech_tokenizer_v2_25hz.onnx"
    flow_config: str | None = "flow.yaml"
    flow: str = "flow.pt"
    hift: str = "hift.pt"


STEP_AUDIO2_ASSETS = Token2WavAssets()


@dataclass(frozen=True)
class AssetDir:
    """A facade's asset folder; `owner` (the facade's class name) prefixes the errors that name no file."""

    root: Path
    owner: str

    def path(self, name: str | None) -> Path:
        """`root / name`, raising FileNotFoundError that names the missing file or directory."""
        if name is None:
            raise ValueError(f"{self.owner}: this token2wav layout has no such asset")
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"token2wav directory {self.root} does not exist (or is not a directory); expected it to hold {name}"
            )
        path = self.root / name
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a directory; the token2wav directory must hold {name} as a file")
        if not path.is_file():
            present = sorted(p.name for p in self.root.iterdir())
            raise FileNotFoundError(
                f"{path} is missing: the token2wav directory {self.root} has {present or 'no files'}"
            )
        return path


@dataclass
class LazyDevice:
    """The facade's device: `spec` (None: the platform's serving device), resolved once on first use."""

    spec: DeviceSpec
    _resolved: torch.device | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def get(self) -> torch.device:
        device = self._resolved
        if device is None:
            with self._lock:
                if self._resolved is None:
                    self._resolved = normalize_device(self.spec)
                device = self._resolved
        return device


__all__ = ["STEP_AUDIO2_ASSETS", "AssetDir", "LazyDevice", "Token2WavAssets"]
