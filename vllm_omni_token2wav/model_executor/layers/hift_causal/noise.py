# SPDX-License-Identifier: Apache-2.0
"""The causal HiFT's fixed noise table, drawn window by window instead of held (288 MB) per instance.

The reference (CosyVoice `hifigan/generator.py` at ace7c47, `SineGen2(causal=True)` and
`SourceModuleHnNSF(causal=True)`) draws its source noise once, when the vocoder is constructed,
from torch's global CPU generator, in this order:

    rand_ini   = torch.rand(1, 9)              initial phases; no effect (see below), 9 draws
    sine_waves = torch.rand(1, 300 * 24000, 9) the noise: sample s of harmonic h is [0, s, h]
    l_linear   = Linear(9, 1) default init     10 draws, overwritten by hift.pt
    uv         = torch.rand(1, 300 * 24000, 1) the noise branch's table, unused by the vocoder

and indexes `sine_waves` from sample 0 of every call (so one utterance always meets the same
noise). rand_ini only touches sample 0, which the midpoint down-sampling of the phase never reads.

On the CPU, `torch.rand` of float32 consumes one 32-bit MT19937 output per element, in memory
order, and maps u to (u & 0xFFFFFF) * 2**-24 (checked by the tests against numpy's MT19937 and
against one literal draw of the reference's shape). The table is therefore a stretch of one
MT19937 stream: element [0, s, h] is the (9 s + h)-th output after rand_ini. This module keeps
only the generator state where the table starts (5 KB, process-wide per origin) and draws the
samples a call needs; a `NoiseCursor` carries the generator state to the next window, so a stream
never re-draws, and a whole utterance of L samples costs 9 L draws (~2 ms per second of audio).

Which stream? No seed appears in the generator code: the state is whatever the process's global
generator holds when the vocoder is built, so it depends on what was built before it:

| loader                                       | state when SineGen2 draws                   | `NoiseOrigin`  |
|----------------------------------------------|---------------------------------------------|----------------|
| CosyVoice `CosyVoice3` (cosyvoice3.yaml:     | seed 0 (`CausalConditionalCFM.__init__`     | `cosyvoice3`   |
| llm, flow, hift)                             | reseeds), then its randn(1, 80, 15000), the |                |
|                                              | flow's Embedding(6561, 80), Linear(192, 80) |                |
|                                              | and the F0 predictor's init                 |                |
| a CosyVoice-layout yaml holding only the     | seed 1986 (`__set_seed3` line), then the F0 | `vocoder_yaml` |
| vocoder (presumably MiniCPM-o's config.yaml; | predictor's init                            |                |
| unconfirmed)                                 |                                             |                |
| vLLM-Omni 0.30 `CosyVoice3Code2Wav`          | the engine's seed + DiT init, possibly on   | none           |
|                                              | the device (another generator)              |                |

Draw counts: a float32 `uniform_`/`rand` element takes 1 output; `normal_`/`randn` of n >= 16
contiguous float32 elements takes n, plus 16 when n % 16 != 0; default inits of Conv1d/Linear are
uniform (1 per parameter), of Embedding normal.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import torch

from vllm_omni_token2wav.model_executor.layers.hift_causal.config import CausalHiFTConfig

# CosyVoice3 flow (cosyvoice3.yaml): CausalConditionalCFM draws randn(1, 80, 50 * 300) right after
# set_all_random_seed(0); then CausalMaskedDiffWithDiT builds Embedding(6561, 80) (normal init) and
# Linear(192, 80) (uniform init) before the vocoder entry is constructed.
_COSYVOICE3_FLOW_DRAWS_AFTER_RESEED = 80 * 50 * 300 + 6561 * 80 + (192 * 80 + 80)
_COSYVOICE3_RESEED = 0
# CosyVoice training configs start with `__set_seed3: !apply:torch.manual_seed [1986]`.
_COSYVOICE_YAML_SEED = 1986
# Skip in steps of this many draws (16 MB of float32), to bound memory.
_SKIP_CHUNK = 1 << 22


def f0_predictor_init_draws(config: CausalHiFTConfig) -> int:
    """32-bit draws of the default init of the reference's `CausalConvRNNF0Predictor` (1 per parameter)."""
    c, m = config.f0_channels, config.in_channels
    first = c * m * 4 + c
    rest = (config.f0_layers - 1) * (c * c * 3 + c)
    return first + rest + c + 1


@dataclass(frozen=True)
class NoiseOrigin:
    """The global generator's history when the reference vocoder is built: seeded, then `draws_before` outputs.

    The table starts `harmonics` outputs later (after rand_ini).
    """

    seed: int
    draws_before: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        if self.draws_before < 0:
            raise ValueError(f"NoiseOrigin.draws_before must be >= 0, got {self.draws_before}")

    @classmethod
    def cosyvoice3(cls, config: CausalHiFTConfig) -> NoiseOrigin:
        """Where CosyVoice's `CosyVoice3` (cosyvoice3.yaml order llm, flow, hift) leaves the generator."""
        draws = _COSYVOICE3_FLOW_DRAWS_AFTER_RESEED + f0_predictor_init_draws(config)
        return cls(_COSYVOICE3_RESEED, draws, "cosyvoice3")

    @classmethod
    def vocoder_yaml(cls, config: CausalHiFTConfig, seed: int = _COSYVOICE_YAML_SEED) -> NoiseOrigin:
        """A CosyVoice-layout yaml that seeds torch and then builds only the vocoder (F0 predictor first)."""
        return cls(seed, f0_predictor_init_draws(config), f"vocoder-yaml(seed={seed})")

    def describe(self) -> str:
        name = f"{self.label}: " if self.label else ""
        return f"{name}MT19937 seed {self.seed} after {self.draws_before} draws"


@dataclass(frozen=True)
class NoiseCursor:
    """Where the next read starts: absolute sample `position` and, for generated tables, the generator there."""

    position: int
    rng_state: torch.Tensor | None = None


class NoiseTable(Protocol):
    """Read-only [length, harmonics] float32 table, read in windows that wrap at `length`."""

    harmonics: int
    length: int

    @property
    def identity(self) -> str: ...

    def start(self) -> NoiseCursor: ...

    def read(self, cursor: NoiseCursor, samples: int) -> tuple[torch.Tensor, NoiseCursor]: ...


def _skip(generator: torch.Generator, draws: int) -> None:
    while draws > 0:
        step = min(draws, _SKIP_CHUNK)
        torch.rand(step, generator=generator)
        draws -= step


# Process-wide: every vocoder instance (and every stream) with the same origin shares one 5 KB
# starting state; computing it replays up to a few million draws, once.
_origin_states: dict[tuple[int, int, int], torch.Tensor] = {}
_origin_lock = threading.Lock()


def table_start_state(origin: NoiseOrigin, harmonics: int) -> torch.Tensor:
    """The CPU generator state at element [0, 0, 0] of the table (after seed, `draws_before` and rand_ini)."""
    key = (origin.seed, origin.draws_before, harmonics)
    with _origin_lock:
        state = _origin_states.get(key)
        if state is None:
            generator = torch.Generator(device="cpu").manual_seed(origin.seed)
            _skip(generator, origin.draws_before + harmonics)
            state = _origin_states[key] = generator.get_state()
    return state


class GeneratedNoiseTable:
    """The reference's `sine_waves` table, drawn on demand from its MT19937 stream."""

    def __init__(self, origin: NoiseOrigin, length: int, harmonics: int) -> None:
        if length < 1 or harmonics < 1:
            raise ValueError(f"noise table needs length >= 1 and harmonics >= 1, got {length}, {harmonics}")
        self.origin = origin
        self.length = length
        self.harmonics = harmonics

    @classmethod
    def for_config(cls, config: CausalHiFTConfig, origin: NoiseOrigin | None = None) -> GeneratedNoiseTable:
        """The table of a vocoder built with `config`; default origin: CosyVoice3's loader."""
        origin = NoiseOrigin.cosyvoice3(config) if origin is None else origin
        return cls(origin, config.noise_table_samples, config.nb_harmonics + 1)

    @property
    def identity(self) -> str:
        return f"generated[{self.length}x{self.harmonics}] {self.origin.describe()}"

    def start(self) -> NoiseCursor:
        return NoiseCursor(0, table_start_state(self.origin, self.harmonics))

    def _state_at(self, index: int) -> torch.Tensor:
        generator = torch.Generator(device="cpu")
        generator.set_state(table_start_state(self.origin, self.harmonics))
        _skip(generator, index * self.harmonics)
        return generator.get_state()

    def read(self, cursor: NoiseCursor, samples: int) -> tuple[torch.Tensor, NoiseCursor]:
        """`samples` rows from `cursor.position` (wrapping at `length`) and the cursor after them."""
        if samples < 0:
            raise ValueError(f"noise read of {samples} samples")
        index = cursor.position % self.length
        state = cursor.rng_state if cursor.rng_state is not None else self._state_at(index)
        generator = torch.Generator(device="cpu")
        parts = []
        remaining = samples
        while remaining > 0:
            take = min(remaining, self.length - index)
            generator.set_state(state)
            parts.append(torch.rand(take * self.harmonics, generator=generator).view(take, self.harmonics))
            state = generator.get_state()
            index += take
            remaining -= take
            if index == self.length:  # wrap: the table starts over
                index, state = 0, table_start_state(self.origin, self.harmonics)
        values = torch.cat(parts) if parts else torch.empty(0, self.harmonics)
        return values, NoiseCursor(cursor.position + samples, state)

    def window(self, start: int, samples: int) -> torch.Tensor:
        """Random access (tests, tools): replays the stream from the table start, O(start)."""
        values, _ = self.read(NoiseCursor(start), samples)
        return values


class TensorNoiseTable:
    """A table given as a tensor, e.g. copied from a reference vocoder instance (`sine_waves`)."""

    def __init__(self, values: torch.Tensor, label: str = "tensor") -> None:
        if values.dim() == 3 and values.shape[0] == 1:
            values = values[0]
        if values.dim() != 2 or values.shape[0] < 1:
            raise ValueError(f"noise table must be [1, L, H] or [L, H] with L >= 1, got {tuple(values.shape)}")
        self.values = values.detach().to("cpu", torch.float32).contiguous()
        self.length, self.harmonics = (int(n) for n in self.values.shape)
        self.label = label

    @property
    def identity(self) -> str:
        return f"tensor[{self.length}x{self.harmonics}] {self.label}"

    def start(self) -> NoiseCursor:
        return NoiseCursor(0)

    def read(self, cursor: NoiseCursor, samples: int) -> tuple[torch.Tensor, NoiseCursor]:
        if samples < 0:
            raise ValueError(f"noise read of {samples} samples")
        positions = torch.arange(cursor.position, cursor.position + samples) % self.length
        return self.values[positions], NoiseCursor(cursor.position + samples)

    def window(self, start: int, samples: int) -> torch.Tensor:
        values, _ = self.read(NoiseCursor(start), samples)
        return values
